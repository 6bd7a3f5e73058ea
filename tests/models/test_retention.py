"""retnet and gla (models/attention/retention.py): the naive references, the chunked
training form and the recurrent decoding step agree; the decays are the papers'.

The chunked form is compared with two references written differently: the explicit
O(L^2) decay matrix gamma^|c_n - c_m| (`naive_retention`, retnet) and the recurrence one
step at a time (`naive_gla`, both). Tolerances: float32, different summation orders.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import decoding, layers, registry
from models.attention import retention
from tests.models.helpers import check_prefill_and_steps, f64, normal, randomize_params

TOL = dict(rtol=1e-5, atol=1e-5)
B, H, L, K, V = 2, 3, 23, 4, 5
CHUNKS = (1, 7, 64)  # 7 does not divide L = 23; 64 > L: one chunk
DIM = 16


def close(a, b, **tol) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **(tol or TOL))


def log_decays(kind: str, seed: int = 3, length: int = L, heads: int = H, k_dim: int = K,
               strength: float = 3.0) -> jax.Array:
    """retnet's log gammas (BxHxLx1) or a gla-like diagonal log gate (BxHxLxK): logsigmoid
    of logits of std `strength`, far stronger than at init so the decays matter."""
    if kind == "retnet":
        return jnp.broadcast_to(retention.retnet_log_gammas(heads)[None, :, None, None],
                                (B, heads, length, 1))
    return jax.nn.log_sigmoid(strength * normal(seed, (B, heads, length, k_dim)))


def qkv(length: int = L, heads: int = H, k_dim: int = K, v_dim: int = V):
    return (normal(0, (B, heads, length, k_dim)), normal(1, (B, heads, length, k_dim)),
            normal(2, (B, heads, length, v_dim)))


def chunked(q, k, v, log_a, *, causal: bool, chunk_size: int):
    if causal:
        return retention.chunked_retention(q, k, v, log_a, chunk_size=chunk_size)[0]
    return retention.bidirectional_retention(q, k, v, log_a, chunk_size=chunk_size)


def build(name: str, *, causal: bool, seed: int = 0, **hparams) -> nnx.Module:
    model = registry.build(name, dim=DIM, num_heads=2, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=seed), **hparams)
    return randomize_params(model, seed=seed + 1, scale=0.3)


# ----------------------------------------------------------------------------- the decays


def test_retnet_gammas_are_the_papers():
    model = registry.build("retnet", dim=64, num_heads=8, max_len=16, causal=False,
                           rngs=nnx.Rngs(0))
    gammas = np.exp(f64(model.log_gammas()))
    np.testing.assert_allclose(gammas, 1.0 - 2.0 ** (-5.0 - np.arange(8)), rtol=0, atol=1e-7)
    log_a = model.log_decay(normal(0, (2, 5, 64)))  # the same gamma at every position
    assert log_a.shape == (2, 8, 5, 1)
    close(np.exp(f64(log_a))[0, :, 3, 0], gammas, rtol=1e-7, atol=0)


def test_gla_gate_statistics_at_init_are_flas():
    """At init log a = logsigmoid(W2 W1 x + b) / 16 with fla's normal(0.02) kernels and zero
    bias: the logits are ~0, so log a ~ -ln(2) / 16. Compared: the mean and std of log a
    over 256 inputs x ~ N(0, 1) and all 128 key features, against the same statistics
    from weights drawn as fla's _init_weights draws them (numpy, float64)."""
    dim, heads = 256, 4
    model = registry.build("gla", dim=dim, num_heads=heads, max_len=64, causal=False,
                           rngs=nnx.Rngs(0))
    x = normal(1, (4, 64, dim))
    log_a = f64(model.log_decay(x))
    assert log_a.shape == (4, heads, 64, 128 // heads)
    # The normaliser: 16 log a is logsigmoid of the low-rank logits.
    logits = f64(x) @ f64(model.alpha_down.kernel) @ f64(model.alpha_up.kernel)
    logits = logits + f64(model.alpha_up.bias)
    logits = logits.reshape(4, 64, heads, -1).transpose(0, 2, 1, 3)
    close(16.0 * log_a, -np.logaddexp(0.0, -logits), rtol=1e-5, atol=1e-6)

    rng = np.random.default_rng(0)
    w1, w2 = 0.02 * rng.standard_normal((dim, 16)), 0.02 * rng.standard_normal((16, 128))
    fla_log_a = -np.logaddexp(0.0, -(f64(x) @ w1 @ w2)) / 16.0
    assert abs(log_a.mean() - (-math.log(2.0) / 16.0)) < 2e-4
    assert abs(log_a.mean() - fla_log_a.mean()) < 2e-4
    assert 0.5 < log_a.std() / fla_log_a.std() < 2.0


@pytest.mark.parametrize("name,group_norm,rotary", [
    ("retnet", "rms", False), ("retnet", "layer", False), ("retnet", "rms", True),
    ("gla", "rms", False)])
def test_projections_norm_and_gate(name, group_norm, rotary):
    """In float64 numpy: q = x W_q / sqrt(d_k), k = x W_k (both turned by
    `models.layers.rotary` at positions 0..L-1 under rotary), v = x W_v (value heads twice
    the key heads for retnet, half-width keys for gla), and the output
    W_o (swish(W_g x) o Norm(o)), Norm per head over d_v (RMS, or centred for "layer")
    with fla's eps 1e-5 and a scale shared by the heads."""
    model = build(name, causal=True, group_norm=group_norm,
                  **({"rotary": True} if rotary else {}))
    x = normal(7, (2, 5, DIM))
    q, k, v, _ = model.heads(x, None)
    head_k, head_v = (DIM // 2, DIM) if name == "retnet" else (DIM // 4, DIM // 2)
    assert q.shape == (2, 2, 5, head_k) and v.shape == (2, 2, 5, head_v)

    def split(y, head, turn=False):
        y = y.reshape(2, 5, 2, head).transpose(0, 2, 1, 3)
        return f64(layers.rotary(jnp.asarray(y), jnp.arange(5))) if turn and rotary else y

    x64 = f64(x)
    close(q, split(x64 @ f64(model.query.kernel), head_k, True) / math.sqrt(head_k))
    close(k, split(x64 @ f64(model.key.kernel), head_k, True))
    close(v, split(x64 @ f64(model.value.kernel), head_v))
    o = normal(8, (2, 2, 5, head_v))
    o64 = f64(o)
    if group_norm == "layer":
        o64 = o64 - o64.mean(-1, keepdims=True)
    normed = o64 / np.sqrt((o64 ** 2).mean(-1, keepdims=True) + 1e-5) * f64(model.norm_scale)
    g = x64 @ f64(model.output_gate.kernel)
    gated = g / (1.0 + np.exp(-g)) * normed.transpose(0, 2, 1, 3).reshape(2, 5, -1)
    close(model.finish(o, x), gated @ f64(model.out.kernel))


# ----------------------------------------------------------------------------- the forms


@pytest.mark.parametrize("kind", ["retnet", "gla"])
def test_naive_and_chunked_forms_agree(kind):
    """Causal and bidirectional, at chunk sizes that do and do not divide L."""
    q, k, v = qkv()
    log_a = log_decays(kind)
    naive = {causal: retention.naive_gla(q, k, v, log_a, causal=causal)
             for causal in (True, False)}
    if kind == "retnet":  # the two references agree with each other
        log_gamma_H = retention.retnet_log_gammas(H)
        for causal in (True, False):
            close(retention.naive_retention(q, k, v, log_gamma_H, causal=causal),
                  naive[causal])
    for causal in (True, False):
        for chunk in CHUNKS:
            close(chunked(q, k, v, log_a, causal=causal, chunk_size=chunk), naive[causal])


def test_retnet_bidirectional_decay_is_gamma_to_the_distance():
    """One key at a time: the weight it reaches query n with is gamma^|n - m| (q.k = 1)."""
    length, m = 9, 4
    q = jnp.ones((1, H, length, 1))
    k = jnp.zeros((1, H, length, 1)).at[:, :, m].set(1.0)
    v = jnp.ones((1, H, length, 1))
    log_a = jnp.broadcast_to(retention.retnet_log_gammas(H)[None, :, None, None],
                             (1, H, length, 1))
    weights = np.asarray(retention.bidirectional_retention(q, k, v, log_a, chunk_size=4))
    gammas = 1.0 - 2.0 ** (-5.0 - np.arange(H))
    expected = gammas[:, None] ** np.abs(np.arange(length) - m)[None]
    close(weights[0, :, :, 0], expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["retnet", "gla"])
def test_padded_tokens_are_as_if_removed(name, causal):
    """Padding in the middle and at the end: the real outputs are those of the sequence
    without its padded tokens (they neither write nor decay), in both directions."""
    model = build(name, causal=causal, chunk_size=3)
    length = 11
    real = np.ones((2, length), bool)
    real[0, [2, 3, 7]] = False
    real[1, 8:] = False
    x = normal(4, (2, length, DIM))
    y = np.asarray(model(x, padding_mask=jnp.asarray(real), deterministic=True))
    for row in range(2):
        alone = model(x[row:row + 1, real[row]], deterministic=True)
        close(y[row, real[row]], alone[0])


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["retnet", "gla"])
def test_module_forward_is_the_naive_form(name, causal, rotary):
    """The mixer (chunked) equals its projections fed to the step-by-step reference, with
    padding; retnet also with rotary (gla refuses it)."""
    if rotary and name == "gla":
        with pytest.raises(registry.RegistryError, match="rotary"):
            registry.build(name, dim=DIM, num_heads=2, max_len=8, causal=causal,
                           rotary=True, rngs=nnx.Rngs(0))
        return
    extra = {"rotary": True} if rotary else {}
    model = build(name, causal=causal, chunk_size=4, **extra)
    x = normal(5, (2, 10, DIM))
    mask = jnp.arange(10)[None] < jnp.array([[10], [6]])
    q, k, v, log_a = model.heads(x, mask)
    expected = model.finish(retention.naive_gla(q, k, v, log_a, causal=causal), x)
    got = model(x, padding_mask=mask, deterministic=True)
    real = np.asarray(mask)
    close(np.asarray(got)[real], np.asarray(expected)[real])


@pytest.mark.parametrize("name,extra", [("retnet", {}), ("retnet", {"rotary": True}),
                                        ("gla", {})], ids=["retnet", "retnet-rotary", "gla"])
def test_prefill_and_steps_equal_the_chunked_forward(name, extra):
    """Right-padded prompts of lengths 0, 3 and 6 (chunk 4: ragged), then one token per
    step, each row at its own position: the causal forward's outputs everywhere. The
    state's size does not depend on max_len."""
    model = build(name, causal=True, chunk_size=4, **extra)
    total, lens = 10, np.array([0, 3, 6])
    x = normal(6, (3, total, DIM))
    expected = np.asarray(model(x, deterministic=True))
    prompt = 6
    mask = jnp.arange(prompt)[None] < jnp.asarray(lens)[:, None]
    cache = model.init_cache(3, 1000)
    assert jax.tree.map(jnp.shape, cache) == jax.tree.map(jnp.shape, model.init_cache(3, 8))
    y_prompt, cache = model.prefill(cache, x[:, :prompt], mask)
    got = np.zeros_like(expected)
    for b, n in enumerate(lens):
        got[b, :n] = np.asarray(y_prompt)[b, :n]
    step = jax.jit(lambda cache, x_BxD: model.step(cache, x_BxD))
    for i in range(total - lens.min()):
        at = np.minimum(lens + i, total - 1)
        y, cache = step(cache, x[np.arange(3), at])
        for b in range(3):
            if lens[b] + i < total:
                got[b, lens[b] + i] = np.asarray(y)[b]
    close(got, expected)


def test_only_the_causal_form_decodes():
    with pytest.raises(decoding.DecodingError, match="causal=False"):
        build("gla", causal=False).init_cache(1, 8)


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("kind", ["retnet", "gla"])
def test_gradients_finite_and_equal_to_the_reference(kind):
    """d(sum w o)/d(q, k, v, log a) of the chunked form (chunk 16, L = 40) and of the
    step-by-step reference, bidirectional (the causal scan plus the strict one)."""
    length = 40
    q, k, v = qkv(length)
    log_a = log_decays(kind, length=length)
    w = normal(9, (B, H, length, V))

    def grads(fn):
        return jax.jit(jax.grad(lambda *a: jnp.sum(w * fn(*a)), argnums=(0, 1, 2, 3)))(
            q, k, v, log_a)

    got = grads(lambda *a: chunked(*a, causal=False, chunk_size=16))
    ref = grads(lambda *a: retention.naive_gla(*a, causal=False))
    for g, r in zip(got, ref):
        assert np.isfinite(np.asarray(g)).all()
        close(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["retnet", "gla"])
def test_long_sequence_finite_and_exact(kind):
    """L = 16384, tiny heads: the chunked form (gla with gates down to exp(-30) per step,
    whose products underflow) stays finite, equals the recurrence at every position in
    both directions, and has finite gradients."""
    length = 16384
    q, k, v = qkv(length, heads=2, k_dim=2, v_dim=2)
    q, k, v = q[:1], k[:1], v[:1]
    log_a = log_decays(kind, length=length, heads=2, k_dim=2, strength=10.0)[:1]
    chunk = 64 if kind == "retnet" else 16
    for causal in (True, False):
        got = chunked(q, k, v, log_a, causal=causal, chunk_size=chunk)
        assert np.isfinite(np.asarray(got)).all()
        close(got, retention.naive_gla(q, k, v, log_a, causal=causal), rtol=1e-4, atol=1e-4)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(chunked(*a, causal=False, chunk_size=chunk)),
                             argnums=(0, 1, 2, 3)))(q, k, v, log_a)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


# ----------------------------------------------------------------------------- pallas


def pallas_against_dense(name: str, causal: bool, length: int = 24) -> None:
    """The ListOps mini Classifier of `configs/listops.py:model=<name>,mini[,causal]` (one
    layer, `length` tokens: the kernels run interpreted on CPU), built as lra.train builds
    it under attention_impl="pallas" and "dense" with the same (random) weights: equal
    logits and parameter gradients of a random scalar loss, one row padded."""
    from configs import listops
    from lra import tasks, train

    task = tasks.get("listops")
    models = {}
    for impl in ("dense", "pallas"):
        config = listops.get_config(f"model={name},mini" + (",causal" if causal else ""))
        config.max_length, config.num_layers, config.attention_impl = length, 1, impl
        models[impl] = train.build_model(config, task)
        assert models[impl].encoder.stack.blocks[0].mixer.attention_impl == impl
    randomize_params(models["dense"], seed=5, scale=0.3)
    nnx.update(models["pallas"], nnx.state(models["dense"], nnx.Param))
    rng = np.random.default_rng(6)
    tokens = jnp.asarray(rng.integers(1, task.vocab_size, (2, length)))
    mask = jnp.arange(length)[None] < jnp.array([[length], [length - 9]])
    w = jnp.asarray(rng.standard_normal((2, task.num_classes)), jnp.float32)

    def logits_and_grads(model):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def loss(params):
            logits = nnx.merge(graphdef, params, rest)(tokens, mask, deterministic=True)
            return jnp.sum(logits * w), logits

        # The interpreted kernels compile about twice as fast without backend optimisation.
        run = jax.jit(jax.value_and_grad(loss, has_aux=True))
        (_, logits), grads = run.lower(params).compile(
            {"xla_backend_optimization_level": 0})(params)
        return logits, grads

    (logits_d, grads_d), (logits_p, grads_p) = map(logits_and_grads, models.values())
    close(logits_p, logits_d, rtol=1e-4, atol=1e-5)
    leaves_d, leaves_p = jax.tree.leaves(grads_d), jax.tree.leaves(grads_p)
    assert len(leaves_d) == len(leaves_p)
    for got, want in zip(leaves_p, leaves_d):
        scale = float(jnp.max(jnp.abs(want)))
        close(got, want, rtol=1e-4, atol=1e-4 * scale + 1e-7)


@pytest.mark.parametrize("name,causal", [("retnet", False), ("gla", True),
                                         pytest.param("retnet", True, marks=pytest.mark.slow),
                                         pytest.param("gla", False, marks=pytest.mark.slow)],
                         ids=["retnet-bidirectional", "gla-causal", "retnet-causal",
                              "gla-bidirectional"])
def test_pallas_kernel_matches_dense_through_the_config(name, causal):
    pallas_against_dense(name, causal)


def test_pallas_refuses_other_impls():
    with pytest.raises(registry.RegistryError, match="attention_impl"):
        build("retnet", causal=True, attention_impl="blocksparse")
    assert build("gla", causal=False, attention_impl="pallas").attention_impl == "pallas"


@pytest.mark.parametrize("name", ["retnet", "gla"])
def test_without_its_decay_the_layer_is_the_same_at_a_one(name):
    """decay=False (the ablation of the decay alone): log a = 0 at every step (gla's gate
    projections not built), the output the decayed layer's with its decay forced to 1 (the
    same other weights), the chunked form the step-by-step one, and decoding the forward."""
    decayed = build(name, causal=True, chunk_size=4)
    plain = build(name, causal=True, chunk_size=4, decay=False)
    x = normal(5, (2, 10, DIM))
    mask = jnp.arange(10)[None] < jnp.array([[10], [6]])
    assert (np.asarray(plain.heads(x, mask)[3]) == 0).all()
    if name == "gla":
        assert plain.alpha_up is None and "alpha_up" not in dict(nnx.state(plain))
    weights = dict(nnx.state(decayed).flat_state())
    nnx.update(plain, nnx.State.from_flat_path(
        {path: weights[path] for path, _ in nnx.state(plain).flat_state()}))
    original = decayed.log_decay
    object.__setattr__(decayed, "log_decay",
                       lambda x_BxLxD: jnp.zeros_like(original(x_BxLxD)))
    real = np.asarray(mask)
    got = np.asarray(plain(x, padding_mask=mask, deterministic=True))
    close(got[real], np.asarray(decayed(x, padding_mask=mask, deterministic=True))[real])
    q, k, v, log_a = plain.heads(x, mask)
    expected = plain.finish(retention.naive_gla(q, k, v, log_a, causal=True), x)
    close(got[real], np.asarray(expected)[real])
    assert not np.allclose(got, np.asarray(build(name, causal=True, chunk_size=4)(
        x, padding_mask=mask, deterministic=True)))
    check_prefill_and_steps(plain, lambda m, method, *a: getattr(m, method)(*a),
                            normal(12, (3, 16, DIM)), jnp.array([1, 5, 9]), 9, **TOL)
