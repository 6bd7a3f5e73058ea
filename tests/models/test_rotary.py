"""pos_emb='rotary' (RoFormer): the rotation, dense attention under it, its relative-position
property, and the registry's flag (every flagged variant rotates, the others refuse)."""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import listops
from models import layers, registry
from models.encoder import Classifier, pool
from tests import tiers
from tests.models.helpers import apply, f64, normal, project_heads, randomize_params

VARIANTS = registry.available()
ROTARY = [n for n in VARIANTS if registry.capabilities(n).rotary]
REFUSING = [n for n in VARIANTS if not registry.capabilities(n).rotary]
DIM, HEADS, MAX_LEN = 32, 2, 16
TOL = dict(rtol=1e-5, atol=1e-5)


def roformer_reference(x: np.ndarray, positions: np.ndarray, base: float = 10000.0):
    """RoFormer's eq. 15 as written: x_m multiplied by the block-diagonal matrix R_m whose
    i-th 2x2 block rotates by m * theta_i, theta_i = base^(-2(i-1)/d) (i = 1..d/2)."""
    d = x.shape[-1]
    out = np.empty(x.shape, np.float64)
    for idx in np.ndindex(*x.shape[:-1]):
        m = float(np.broadcast_to(positions, x.shape[:-1])[idx])
        r = np.zeros((d, d))
        for i in range(d // 2):
            angle = m * base ** (-2 * i / d)
            r[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[np.cos(angle), -np.sin(angle)],
                                                  [np.sin(angle), np.cos(angle)]]
        out[idx] = r @ x[idx]
    return out


def build_mixer(name: str, *, rotary: bool = True, causal: bool = False, **hparams):
    return registry.build(name, dim=DIM, num_heads=HEADS, max_len=MAX_LEN, causal=causal,
                          rotary=rotary, rngs=nnx.Rngs(params=0, dropout=1),
                          **{**registry.capabilities(name).test_hparams, **hparams})


# ----------------------------------------------------------------------------- the rotation


def test_rotary_matches_roformer_formula():
    x = np.asarray(normal(0, (2, 3, 7, 8)))
    positions = np.array([0, 1, 2, 5, 17, 300, 4095])
    got = layers.rotary(jnp.asarray(x), jnp.asarray(positions))
    np.testing.assert_allclose(got, roformer_reference(x, positions), rtol=2e-5, atol=2e-5)
    # Per-row positions (gathered or sorted tokens) and fractional ones (a block centre).
    pos_2x3x7 = np.random.default_rng(1).uniform(0, 64, (2, 3, 7))
    got = layers.rotary(jnp.asarray(x), jnp.asarray(pos_2x3x7))
    np.testing.assert_allclose(got, roformer_reference(x, pos_2x3x7), rtol=2e-5, atol=2e-5)
    assert got.dtype == jnp.float32
    # Position 0 is the identity; the norm is kept.
    np.testing.assert_allclose(layers.rotary(jnp.asarray(x), jnp.zeros(7)), x, rtol=0, atol=0)
    with pytest.raises(ValueError, match="odd"):
        layers.rotary(jnp.ones((3, 5)), jnp.arange(3))


def test_rotated_products_depend_on_the_offset_only():
    q, k = normal(2, (5, 16)), normal(3, (5, 16))
    for m, n, s in ((0, 3, 7), (4, 1, 100), (2, 2, 31)):
        a = jnp.dot(layers.rotary(q[0], m), layers.rotary(k[1], n))
        b = jnp.dot(layers.rotary(q[0], m + s), layers.rotary(k[1], n + s))
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- dense attention


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_with_rotary_matches_reference(causal):
    model = randomize_params(build_mixer("transformer", causal=causal))
    x = normal(4, (2, 11, DIM))
    mask = jnp.arange(11)[None, :] < jnp.array([[11], [7]])
    y = model(x, padding_mask=mask, deterministic=True)

    positions = np.arange(11)
    q = roformer_reference(project_heads(model.query, x, HEADS), positions)
    k = roformer_reference(project_heads(model.key, x, HEADS), positions)
    v = project_heads(model.value, x, HEADS)
    logits = np.einsum("bhqk,bhsk->bhqs", q, k) / np.sqrt(q.shape[-1])
    allowed = np.asarray(mask)[:, None, None, :]
    if causal:
        allowed = allowed & np.tril(np.ones((11, 11), bool))
    logits = np.where(allowed, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    o = np.einsum("bhqs,bhsk->bqhk", w, v).reshape(2, 11, DIM)
    want = o @ f64(model.out.kernel) + f64(model.out.bias)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(y)[real], want[real], rtol=1e-4, atol=1e-5)
    # Not vacuous: without the rotation the output differs.
    model.rotary = False
    assert not np.allclose(np.asarray(model(x, padding_mask=mask))[real], want[real],
                           rtol=1e-3, atol=1e-3)


def test_block_sparse_transformer_rotates_like_dense():
    """The block-sparse kernel path gets the same rotated q, k (rotation is outside it)."""
    dense = build_mixer("transformer")
    blocks = build_mixer("transformer", attention_impl="blocksparse")
    for p in ("query", "key", "value", "out"):
        nnx.update(getattr(blocks, p), nnx.state(getattr(dense, p), nnx.Param))
    x = normal(16, (2, 12, DIM))
    mask = jnp.arange(12)[None, :] < jnp.array([[12], [9]])
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(blocks(x, padding_mask=mask))[real],
                               np.asarray(dense(x, padding_mask=mask))[real], **TOL)


def test_linear_refuses_its_pallas_form_under_rotary():
    with pytest.raises(registry.RegistryError, match="attention_impl='dense'"):
        build_mixer("linear", attention_impl="pallas")


def test_linear_with_rotary_is_roformers_linear_form():
    """RoFormer eq. 19: rotated elu + 1 features in the numerator, plain ones below."""
    for causal in (False, True):
        model = randomize_params(build_mixer("linear", causal=causal), scale=0.3)
        x = normal(5, (2, 9, DIM))
        y = model(x, deterministic=True)
        positions = np.arange(9)
        phi = lambda a: np.where(a > 0, a + 1.0, np.exp(a))  # noqa: E731  elu + 1
        q = phi(project_heads(model.query, x, HEADS))
        k = phi(project_heads(model.key, x, HEADS))
        v = project_heads(model.value, x, HEADS)
        num_w = np.einsum("bhqk,bhsk->bhqs", roformer_reference(q, positions),
                          roformer_reference(k, positions))
        den_w = np.einsum("bhqk,bhsk->bhqs", q, k)
        if causal:
            keep = np.tril(np.ones((9, 9)))
            num_w, den_w = num_w * keep, den_w * keep
        o = (np.einsum("bhqs,bhsk->bhqk", num_w, v)
             / (den_w.sum(-1, keepdims=True) + model.eps))
        want = o.transpose(0, 2, 1, 3).reshape(2, 9, DIM) @ f64(model.out.kernel) + f64(
            model.out.bias)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_linear_step_with_rotary_matches_causal_parallel():
    model = build_mixer("linear", causal=True, chunk_size=4)
    x = normal(6, (2, 9, DIM))
    y_parallel = model(x, deterministic=True)
    graphdef, weights = nnx.split(model)
    step = jax.jit(lambda cache, x_t: nnx.merge(graphdef, weights).step(cache, x_t))
    # The token's position comes from the cache's "pos" (per row): row 1 starts 4 tokens
    # later, after a prompt, so the two rows are rotated by different positions each step.
    y_prompt, cache = model.prefill(model.init_cache(2, MAX_LEN), x[:, :4],
                                    jnp.array([[False] * 4, [True] * 4]))
    np.testing.assert_allclose(y_prompt[1], y_parallel[1, :4], **TOL)
    np.testing.assert_array_equal(cache["pos"], [0, 4])
    for t in range(9):
        y_t, cache = step(cache, x[[0, 1], [t, min(t + 4, 8)]])
        np.testing.assert_allclose(y_t[0], y_parallel[0, t], **TOL)
        if t + 4 < 9:
            np.testing.assert_allclose(y_t[1], y_parallel[1, t + 4], **TOL)


# ------------------------------------------------------------------- relative positions


def test_transformer_scores_depend_on_offsets_only():
    """q_m . k_n == q_(m+s) . k_(n+s): the same tokens s positions later score the same."""
    model = randomize_params(build_mixer("transformer"))
    x, shift = normal(7, (1, 10, DIM)), 5
    x_shifted = jnp.concatenate([normal(8, (1, shift, DIM)), x], axis=1)
    q, k, _ = model.project_qkv(x)
    qs, ks, _ = model.project_qkv(x_shifted)
    scores = jnp.einsum("bhqk,bhsk->bhqs", q, k)
    scores_shifted = jnp.einsum("bhqk,bhsk->bhqs", qs, ks)[:, :, shift:, shift:]
    np.testing.assert_allclose(scores, scores_shifted, rtol=1e-4, atol=1e-4)
    # Not vacuous: the scores are those of rotated queries and keys.
    model.rotary = False
    q0, k0, _ = model.project_qkv(x)
    assert not np.allclose(jnp.einsum("bhqk,bhsk->bhqs", q0, k0), scores, atol=1e-3)


# Mixers whose only position dependence, besides rotary, is relative (windows, spans,
# convolutions) or periodic in 4 (test_hparams' blocks, raster width, pooling segments
# that tile the sequence): the same content moved 4 positions later, behind padding, gives
# the same outputs. A variant that rotated its queries but not its keys (or the reverse)
# would fail here.
SHIFT_FREE = {"transformer": {}, "linear": {}, "fast_weight": {}, "local": {}, "dilated": {},
              "block_local": {}, "adaptive_span": {}, "axial": {}, "lite": {},
              "poolingformer": {"pool_size": 2, "pool_stride": 2}}


@pytest.mark.parametrize("name", SHIFT_FREE)
def test_rotary_mixer_outputs_are_shift_invariant(name):
    model = randomize_params(build_mixer(name, **SHIFT_FREE[name]), scale=0.3)
    n, shift, length = 8, 4, MAX_LEN
    content = normal(9, (2, n, DIM))
    x_at_0 = jnp.concatenate([content, normal(10, (2, length - n, DIM))], axis=1)
    x_at_s = jnp.concatenate([normal(11, (2, shift, DIM)), content,
                              normal(12, (2, length - n - shift, DIM))], axis=1)
    pos = jnp.arange(length)
    mask_0 = jnp.broadcast_to(pos < n, (2, length))
    mask_s = jnp.broadcast_to((pos >= shift) & (pos < shift + n), (2, length))
    y_0 = model(x_at_0, padding_mask=mask_0, deterministic=True)[:, :n]
    y_s = model(x_at_s, padding_mask=mask_s, deterministic=True)[:, shift:shift + n]
    np.testing.assert_allclose(y_0, y_s, rtol=1e-4, atol=1e-4)


def test_classifier_with_rotary_sees_offsets_not_absolute_positions():
    """A whole rotary Transformer encoder (no absolute positions anywhere): the same tokens
    behind s padded positions encode the same; with sinusoidal positions they do not."""
    def encode(pos_emb, inputs, mask):
        model = Classifier(vocab_size=12, num_classes=3, max_len=20, emb_dim=DIM,
                           num_heads=HEADS, num_layers=2, qkv_dim=DIM, mlp_dim=64,
                           dropout_rate=0.0, attention_dropout_rate=0.0, pooling="MEAN",
                           pos_emb=pos_emb, rngs=nnx.Rngs(params=0, dropout=1))
        return np.asarray(model.encoder(inputs, mask, deterministic=True)[0])

    toks = jnp.asarray(np.random.default_rng(13).integers(1, 12, (2, 9)))
    inputs_0 = jnp.pad(toks, ((0, 0), (0, 11)))
    inputs_s = jnp.pad(toks, ((0, 0), (6, 5)))
    pos = jnp.arange(20)
    mask_0 = jnp.broadcast_to(pos < 9, (2, 20))
    mask_s = jnp.broadcast_to((pos >= 6) & (pos < 15), (2, 20))
    y_0 = encode("rotary", inputs_0, mask_0)[:, :9]
    y_s = encode("rotary", inputs_s, mask_s)[:, 6:15]
    np.testing.assert_allclose(y_0, y_s, rtol=1e-4, atol=1e-4)
    # The order of the tokens still matters (rotary is not "no positions").
    y_rev = encode("rotary", jnp.pad(toks[:, ::-1], ((0, 0), (0, 11))), mask_0)[:, :9]
    assert not np.allclose(y_rev[:, ::-1], y_0, atol=1e-3)
    a_0 = encode("sinusoidal", inputs_0, mask_0)[:, :9]
    a_s = encode("sinusoidal", inputs_s, mask_s)[:, 6:15]
    assert not np.allclose(a_0, a_s, atol=1e-3)


# ------------------------------------------------------------------------------ the registry


@pytest.mark.parametrize("name", VARIANTS)
def test_flag_agrees_with_the_builder(name):
    caps = registry.capabilities(name)
    builder = registry._entry(name).builder
    assert ("rotary" in inspect.signature(builder).parameters) == caps.rotary
    assert caps.rotary or caps.rotary_refusal, "a refusal needs its reason"


def test_register_refuses_a_flag_the_builder_contradicts():
    def takes_rotary(*, dim, num_heads, max_len, causal, rngs, rotary=False):
        raise AssertionError("not built")

    def plain(*, dim, num_heads, max_len, causal, rngs):
        raise AssertionError("not built")

    caps = dict(description="x", causal=False, padding=True, variable_length=True)
    with pytest.raises(registry.RegistryError, match="rotary"):
        registry.register("rotary_mismatch_a", takes_rotary, registry.Capabilities(**caps))
    with pytest.raises(registry.RegistryError, match="rotary"):
        registry.register("rotary_mismatch_b", plain,
                          registry.Capabilities(**caps, rotary=True))
    assert "rotary_mismatch_a" not in VARIANTS + registry.available()


def config_classifier(name: str) -> tuple[Classifier, tuple]:
    """The model of `configs/listops.py:model=<name>,runlocal --config.pos_emb=rotary`,
    built as lra.train.build_model builds a classifier, and a padded batch for it."""
    c = listops.get_config(f"model={name},runlocal")
    c.pos_emb = "rotary"
    model = Classifier(
        vocab_size=20, num_classes=10, max_len=c.max_length, model=c.model,
        model_hparams=c.model_hparams.to_dict(), emb_dim=c.emb_dim, num_heads=c.num_heads,
        num_layers=c.num_layers, qkv_dim=c.qkv_dim, mlp_dim=c.mlp_dim,
        dropout_rate=c.dropout_rate, attention_dropout_rate=c.attention_dropout_rate,
        attention_impl=c.attention_impl, pooling=c.pooling, pos_emb=c.pos_emb,
        causal=c.causal, block=c.block.to_dict(), rngs=nnx.Rngs(params=0, dropout=1))
    inputs = jnp.asarray(np.random.default_rng(14).integers(1, 20, (2, c.max_length)))
    # The second example padded after 100 of its 128 tokens.
    mask = jnp.arange(c.max_length)[None, :] < jnp.array([[c.max_length], [100]])
    return model, (inputs, mask)


def rotary_switched_off(model: nnx.Module) -> nnx.Module:
    """A copy of `model` with every module's rotary flag off (same weights)."""
    twin = nnx.clone(model)
    switched = 0
    for _, module in twin.iter_modules():
        if getattr(module, "rotary", False) is True:
            module.rotary = False
            switched += 1
    assert switched, "no module holds the rotary flag"
    return twin


@pytest.mark.parametrize("name", tiers.variants(ROTARY))  # one per module by default
def test_flagged_variant_rotates_through_the_task_config(name):
    model, (inputs, mask) = config_classifier(name)
    assert model.encoder.embeddings.position is None  # no absolute positions
    encoded, real = apply(model.encoder, inputs, mask)
    logits = model.head(pool(encoded, real, model.pooling))  # the Classifier's own steps
    assert logits.shape == (2, 10) and np.isfinite(np.asarray(logits)).all()
    # Rotary is not silently ignored: the same weights without the rotations differ.
    plain, _ = apply(rotary_switched_off(model).encoder, inputs, mask)
    real = np.asarray(real)  # with the CLS slot, when pooling is CLS
    assert not np.allclose(np.asarray(encoded)[real], np.asarray(plain)[real],
                           rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", REFUSING)
def test_unflagged_variant_refuses_in_one_line(name):
    with pytest.raises(registry.RegistryError) as error:
        config_classifier(name)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"model {name!r} does not take pos_emb='rotary': ")
    assert message.endswith("; use pos_emb=learned or sinusoidal")
    assert isinstance(error.value, ValueError)  # lra.train turns it into a ConfigError


# ----------------------------------------------------------------- dense limits under rotary

DENSE_LIMITS = [n for n in ROTARY if registry.capabilities(n).dense_equivalent is not None]
DENSE_PARAMS = ("query", "key", "value", "out")


@pytest.mark.parametrize("masked,causal", [pytest.param(False, False, marks=tiers.EXHAUSTIVE),
                                           (True, False), (True, True)])
@pytest.mark.parametrize("name", tiers.variants(DENSE_LIMITS))
def test_dense_equivalent_still_equals_transformer_under_rotary(name, masked, causal):
    caps = registry.capabilities(name)
    if causal and not caps.causal:
        pytest.skip("not causal")
    variant = build_mixer(name, causal=causal, **caps.dense_equivalent)
    dense = registry.build("transformer", dim=DIM, num_heads=HEADS, max_len=MAX_LEN,
                           causal=causal, rotary=True, rngs=nnx.Rngs(params=99, dropout=99),
                           qkv_dim=variant.query.out_features,
                           use_bias=variant.query.use_bias, attention_dropout=0.0)
    for p in DENSE_PARAMS:
        nnx.update(getattr(dense, p), nnx.state(getattr(variant, p), nnx.Param))
    x = normal(15, (2, MAX_LEN, DIM))
    mask = jnp.arange(MAX_LEN)[None, :] < jnp.array([[MAX_LEN], [MAX_LEN - 5]])
    mask = mask if masked else None
    y_variant = variant(x, padding_mask=mask, deterministic=True)
    y_dense = dense(x, padding_mask=mask, deterministic=True)
    real = np.ones((2, MAX_LEN), bool) if mask is None else np.asarray(mask)
    np.testing.assert_allclose(np.asarray(y_variant)[real], np.asarray(y_dense)[real], **TOL)


# ----------------------------------------------------------------------- through the trainer


def test_trainer_refuses_an_unflagged_variant_in_one_line(tiny_listops_config, listops_dir,
                                                          tmp_path):
    from lra import train
    from lra.errors import ConfigError

    config = tiny_listops_config(listops_dir, model="fnet", pos_emb="rotary")
    with pytest.raises(ConfigError, match=r"model 'fnet' does not take pos_emb='rotary': .*; "
                                          r"use pos_emb=learned or sinusoidal$"):
        train.train_and_evaluate(config, str(tmp_path))


def test_rotary_transformer_trains(tiny_listops_config, listops_dir, tmp_path):
    from lra import train

    config = tiny_listops_config(listops_dir, pos_emb="rotary", num_train_steps=2,
                                 eval_frequency=2, checkpoint_freq=2, num_eval_steps=1)
    results = train.train_and_evaluate(config, str(tmp_path))
    assert results["steps"] == 2 and results["config"]["pos_emb"] == "rotary"
    assert np.isfinite(results["test_loss"])
