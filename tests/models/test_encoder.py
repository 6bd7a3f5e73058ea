"""Dense attention, the registry's errors, and the Classifier built on them."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention.dense import dot_product_attention, make_attention_mask
from models.encoder import Classifier
from tests.models.helpers import normal

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = dict(vocab_size=16, num_classes=3, max_len=20, emb_dim=32, num_heads=2, num_layers=2,
            qkv_dim=32, mlp_dim=64)


def tokens(seed: int, shape: tuple[int, ...]) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(1, TINY["vocab_size"], shape),
                       jnp.int32)


def naive_attention(q, k, v, mask):
    """float64 numpy softmax(q k^T / sqrt(d)) v with masked entries removed."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(mask, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", weights, v)


# Attention math -------------------------------------------------------------------

def test_dot_product_attention_matches_numpy():
    q, k, v = normal(0, (2, 3, 5, 4)), normal(1, (2, 3, 7, 4)), normal(2, (2, 3, 7, 6))
    mask = np.random.default_rng(3).random((2, 1, 5, 7)) < 0.6
    mask[..., 0] = True  # every row attends somewhere
    out = dot_product_attention(q, k, v, mask=jnp.asarray(mask))
    assert out.shape == (2, 3, 5, 6) and out.dtype == jnp.float32
    np.testing.assert_allclose(out, naive_attention(q, k, v, mask), rtol=1e-5, atol=1e-5)
    full = np.ones((2, 1, 5, 7), bool)
    np.testing.assert_allclose(dot_product_attention(q, k, v), naive_attention(q, k, v, full),
                               rtol=1e-5, atol=1e-5)


def test_fully_masked_row_is_zero_with_finite_grads():
    q, k, v = normal(0, (1, 2, 4, 8)), normal(1, (1, 2, 4, 8)), normal(2, (1, 2, 4, 8))
    mask = jnp.ones((1, 1, 4, 4), bool).at[:, :, 2, :].set(False)
    out = dot_product_attention(q, k, v, mask=mask)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_array_equal(out[:, :, 2], 0.0)
    grads = jax.grad(lambda *a: jnp.sum(dot_product_attention(*a, mask=mask) ** 2),
                     argnums=(0, 1, 2))(q, k, v)
    for g in grads:
        assert np.isfinite(np.asarray(g)).all()


def test_make_attention_mask():
    assert make_attention_mask(None, causal=False, q_len=4, kv_len=4) is None
    causal = make_attention_mask(None, causal=True, q_len=4, kv_len=4)
    np.testing.assert_array_equal(causal[0, 0], np.tril(np.ones((4, 4), bool)))
    pad_BxL = jnp.array([[True, True, True, False], [True, False, False, False]])
    both = make_attention_mask(pad_BxL, causal=True, q_len=4, kv_len=4)
    assert both.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(both[1, 0], np.tril(np.ones((4, 4), bool)) & [1, 0, 0, 0])
    # Queries are the last positions when there are more keys (e.g. a memory).
    offset = make_attention_mask(None, causal=True, q_len=2, kv_len=4)
    np.testing.assert_array_equal(offset[0, 0], [[1, 1, 1, 0], [1, 1, 1, 1]])


def test_qkv_dim_must_divide_into_heads():
    with pytest.raises(ValueError, match="num_heads"):
        registry.build("transformer", dim=32, num_heads=3, max_len=8, rngs=nnx.Rngs(0))


# Registry ---------------------------------------------------------------------------

def test_fresh_import_registers_everything():
    for code in ("from models import registry; print(registry.available())",
                 "import models.registry as r; print(r.available())"):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        assert "transformer" in ast.literal_eval(out.strip())


def test_unknown_model_lists_available():
    expected = "unknown model 'xyz'; available: .*transformer"
    with pytest.raises(registry.RegistryError, match=expected):
        registry.build("xyz", dim=8, num_heads=2, max_len=8, rngs=nnx.Rngs(0))
    with pytest.raises(registry.RegistryError):
        registry.capabilities("xyz")


def test_unknown_hparam_is_named_with_accepted_ones():
    with pytest.raises(registry.RegistryError, match="'qkv_dims'.*accepted: .*qkv_dim"):
        registry.build("transformer", dim=8, num_heads=2, max_len=8, rngs=nnx.Rngs(0),
                       qkv_dims=8)


def _dummy_builder(*, dim, num_heads, max_len, causal, rngs, width=1):
    del num_heads, max_len, causal, width
    return nnx.Linear(dim, dim, rngs=rngs)


DUMMY_CAPS = registry.Capabilities(description="test dummy", causal=False, padding=False,
                                   variable_length=True)


def test_causal_on_non_causal_variant_raises():
    name = "_test_dummy_noncausal"
    with registry.temporarily_registered(name, _dummy_builder, DUMMY_CAPS):
        assert name in registry.available()
        registry.build(name, dim=8, num_heads=2, max_len=8, rngs=nnx.Rngs(0), width=2)
        with pytest.raises(registry.RegistryError, match="causal"):
            registry.build(name, dim=8, num_heads=2, max_len=8, causal=True, rngs=nnx.Rngs(0))
        with pytest.raises(registry.RegistryError, match="already registered"):
            registry.register(name, _dummy_builder, DUMMY_CAPS)
    assert name not in registry.available()


def test_register_checks_builder_and_flags():
    with pytest.raises(registry.RegistryError, match="max_len"):
        registry.register("_test_bad", lambda *, dim, num_heads, causal, rngs: None, DUMMY_CAPS)
    bad_caps = registry.Capabilities(description="x", causal=False, padding=False,
                                     variable_length=True, test_hparams={"widht": 2})
    with pytest.raises(registry.RegistryError, match="widht"):
        registry.register("_test_bad", _dummy_builder, bad_caps)
    assert "_test_bad" not in registry.available()


# Classifier -------------------------------------------------------------------------

def tiny_classifier(**overrides) -> Classifier:
    return Classifier(**{**TINY, **overrides}, rngs=nnx.Rngs(params=0, dropout=1))


def jitted(model: Classifier):
    """Deterministic forward as one compiled program (eager dispatch is slower here)."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, x, m: nnx.merge(graphdef, s)(x, m, deterministic=True))
    return lambda inputs, mask: forward(state, inputs, mask)


def tokens_and_mask(length: int = 20, real=(20, 13)) -> tuple[jax.Array, jax.Array]:
    mask = jnp.arange(length)[None, :] < jnp.array(real)[:, None]
    return tokens(0, (len(real), length)), mask


@pytest.mark.parametrize("pooling,pos_emb", [("CLS", "learned"), ("MEAN", "sinusoidal"),
                                             ("CLS", "sinusoidal"), ("MEAN", "learned"),
                                             ("MAX", "learned"), ("SUM", "learned")])
def test_classifier_runs_and_ignores_padding(pooling, pos_emb):
    model = jitted(tiny_classifier(pooling=pooling, pos_emb=pos_emb))
    inputs, mask = tokens_and_mask()
    logits = model(inputs, mask)
    assert logits.shape == (2, TINY["num_classes"]) and logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()
    # Other tokens at padded positions: same logits.
    changed = jnp.where(mask, inputs, tokens(5, inputs.shape))
    np.testing.assert_allclose(model(changed, mask), logits, rtol=1e-5, atol=1e-5)
    # More trailing padding: same logits.
    shorter, short_mask = inputs[:, :16], mask[:, :16] & (jnp.arange(16) < 13)
    longer = jnp.pad(shorter, ((0, 0), (0, 4)))
    long_mask = jnp.pad(short_mask, ((0, 0), (0, 4)))
    np.testing.assert_allclose(model(longer, long_mask), model(shorter, short_mask),
                               rtol=1e-5, atol=1e-5)


def test_classifier_dropout_rng_is_split_state():
    model = tiny_classifier(num_layers=1)
    inputs, mask = tokens_and_mask()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    # Besides params only rng keys and counters: no Python-side mutable state.
    assert {type(v) for _, v in nnx.to_flat_state(rest)} <= {nnx.RngKey, nnx.RngCount}

    def apply(rest, deterministic):
        module = nnx.merge(graphdef, params, rest)
        logits = module(inputs, mask, deterministic=deterministic)
        return logits, nnx.state(module, nnx.Not(nnx.Param))

    apply = jax.jit(apply, static_argnums=1)
    y1, rest = apply(rest, False)
    y2, rest = apply(rest, False)
    assert not np.allclose(y1, y2)
    np.testing.assert_allclose(apply(rest, True)[0], jitted(model)(inputs, mask),
                               rtol=1e-5, atol=1e-5)


def test_classifier_errors():
    inputs, mask = tokens_and_mask(length=21, real=(21, 10))
    with pytest.raises(ValueError, match="exceeds max_len 20"):
        tiny_classifier()(inputs, mask, deterministic=True)
    with pytest.raises(ValueError, match="valid: CLS, MEAN, MAX, SUM"):
        tiny_classifier(pooling="AVG")
    with pytest.raises(ValueError, match="sinusoidal"):
        tiny_classifier(pos_emb="rope")
    with pytest.raises(ValueError, match="qkv_dim"):
        tiny_classifier(model_hparams={"qkv_dim": 16})
    with pytest.raises(ValueError, match="CLS"):
        tiny_classifier(causal=True)
    with pytest.raises(registry.RegistryError, match="use_biass"):
        tiny_classifier(model_hparams={"use_biass": False})
    tiny_classifier(model_hparams={"qkv_dim": 32, "use_bias": False}, causal=True,
                    pooling="MEAN")


def test_logical_axis_names():
    model = tiny_classifier()
    specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
    enc = specs["encoder"]
    expected = {
        ("embeddings", "token", "embedding"): ("vocab", "embed"),
        ("embeddings", "position"): ("length", "embed"),
        ("embeddings", "cls"): (None, None, "embed"),
        ("stack", "blocks", 0, "mixer", "query", "kernel"): ("embed", "qkv"),
        ("stack", "blocks", 0, "mixer", "out", "kernel"): ("qkv", "embed"),
        ("stack", "blocks", 1, "mlp", "fc1", "kernel"): ("embed", "mlp"),
        ("stack", "blocks", 1, "mlp", "fc2", "bias"): ("embed",),
        ("norm", "scale"): ("embed",),
    }
    for path, names in expected.items():
        node = enc
        for p in path:
            node = node[p]
        assert tuple(node.get_value()) == names, path
    assert tuple(specs["head"]["logits"]["kernel"].get_value()) == ("mlp", "classes")
    # Every parameter is named, one name per dimension.
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        assert len(var.get_metadata()["out_sharding"]) == var[...].ndim


def test_builds_and_runs_under_a_mesh():
    # Names are logical, not mesh axes: creating params under a mesh must not shard them.
    mesh = jax.make_mesh((1,), ("data",))
    model = tiny_classifier(num_layers=1)
    inputs, mask = tokens_and_mask()
    with jax.set_mesh(mesh):
        nnx.eval_shape(lambda: tiny_classifier(num_layers=1))
        assert np.isfinite(np.asarray(jitted(model)(inputs, mask))).all()


def test_listops_sized_parameter_count():
    abstract = nnx.eval_shape(lambda: Classifier(
        vocab_size=16, num_classes=10, max_len=2000, emb_dim=512, num_heads=8, num_layers=4,
        qkv_dim=512, mlp_dim=1024, pooling="CLS", rngs=nnx.Rngs(params=0, dropout=1)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    d, mlp, layers = 512, 1024, 4
    per_block = 4 * (d * d + d) + 2 * 2 * d + (d * mlp + mlp) + (mlp * d + d)
    embeddings = 16 * d + d + (2000 + 1) * d
    head = (d * mlp + mlp) + (mlp * 10 + 10)
    assert count == embeddings + layers * per_block + 2 * d + head == 9_980_938
    print(f"ListOps-sized Classifier: {count:,} parameters")


def test_block_settings_resolve_and_reject_unknown_values():
    from models.blocks import BLOCK_DEFAULTS
    from models.stacks import resolve_block

    assert resolve_block("transformer") == BLOCK_DEFAULTS
    assert resolve_block("transformer", {"ffn_chunks": 4})["ffn_chunks"] == 4
    with pytest.raises(ValueError, match="unknown config.block key.*'kindd'"):
        resolve_block("transformer", {"kindd": "pre_ln"})
    with pytest.raises(ValueError, match="unknown block kind 'nope'; valid: .*pre_ln"):
        resolve_block("transformer", {"kind": "nope"})
    with pytest.raises(ValueError, match="unknown block stack"):
        resolve_block("transformer", {"stack": "nope"})
    with pytest.raises(ValueError, match="unknown block kind"):
        tiny_classifier(block={"kind": "nope"})


@pytest.mark.parametrize("stack", ["sequential", "reversible"])
def test_seeded_patterns_differ_per_layer(stack):
    """`random` and `bigbird` draw their keys from `seed`: layer l uses seed + l, so the
    layers do not all attend to the same random keys."""
    def layer_masks(model, **hparams):
        model = Classifier(**dict(TINY, num_layers=3), model=model, model_hparams=hparams,
                           block={"stack": stack}, rngs=nnx.Rngs(0))
        i, j = np.arange(20)[:, None], np.arange(20)[None, :]
        return [np.asarray(layer.mixer.pattern.mask(i, j))
                for layer in model.encoder.stack.blocks]

    masks_L = layer_masks("random", num_random=4, seed=5)
    assert all(m.sum() < 20 * 20 for m in masks_L)
    assert not np.array_equal(masks_L[0], masks_L[1])
    assert not np.array_equal(masks_L[1], masks_L[2])
    # seed 5 + layer 1 is what a one-layer model with seed 6 draws
    assert np.array_equal(masks_L[1], layer_masks("random", num_random=4, seed=6)[0])
    big_L = layer_masks("bigbird", block=2, num_random_blocks=2, num_global_blocks=1)
    assert not np.array_equal(big_L[0], big_L[1])
    local_L = layer_masks("local", window=2)  # no seed: unchanged
    assert all(np.array_equal(local_L[0], m) for m in local_L)
