"""rwkv7 (models/attention/rwkv7.py) against its references.

The conformance, fidelity and decoding suites check shapes, padding, causality and the
decoding contract; here: the scan is RWKV-7's recurrence written in numpy, the chunked
form equals the scan at any chunk (gradients too) and stays finite under strong decays;
the layer, causal and bidirectional, equals fla's RWKV7Attention forward written in numpy
from the layer's own weights (token shift, lerps, LoRAs, kk, the k update, GroupNorm, the
r_k bonus, the gate); padding reaches no real token; prefill + steps equal the parallel
form; the initialisation and the parameter count are fla's layer 0's. The comparison
with fla's own code: scripts/fla_comparison/compare_rwkv7.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import decoding, registry
from models.attention import rwkv7

from tests.models.helpers import check_prefill_and_steps, f64, normal, randomize_params
from tests.models.test_delta import assert_close, run

TOL = dict(rtol=1e-4, atol=1e-5)


def op_inputs(seed: int, shape=(2, 2, 13, 4), v_dim: int = 6, decay: float = rwkv7.DECAY_SCALE):
    """r, w <= 0, k, v, kk unit per head, a in (0, 1): what the layer hands the op."""
    b, h, length, _ = shape
    r, k = normal(seed, shape), normal(seed + 1, shape)
    w = -decay * jax.nn.sigmoid(normal(seed + 2, shape))
    v = normal(seed + 3, (b, h, length, v_dim))
    kk = normal(seed + 4, shape)
    kk = kk / jnp.linalg.norm(kk, axis=-1, keepdims=True)
    a = jax.nn.sigmoid(normal(seed + 5, shape))
    return r, w, k, v, kk, a


def paper_recurrence(r, w, k, v, kk, a):
    """RWKV-7's state update in float64, from the equation (row vectors, S is V x K):
    S_t = S_{t-1} (Diag(e^{w_t}) - kk_t^T (a_t * kk_t)) + v_t^T k_t,  o_t = S_t r_t."""
    r, w, k, v, kk, a = (np.asarray(t, np.float64) for t in (r, w, k, v, kk, a))
    b, h, length, d = r.shape
    s = np.zeros((b, h, v.shape[-1], d))
    out = np.zeros(v.shape)
    for t in range(length):
        transition = (np.einsum("bhi,ij->bhij", np.exp(w[:, :, t]), np.eye(d))
                      - np.einsum("bhi,bhj->bhij", kk[:, :, t], a[:, :, t] * kk[:, :, t]))
        s = s @ transition + np.einsum("bhv,bhk->bhvk", v[:, :, t], k[:, :, t])
        out[:, :, t] = np.einsum("bhvk,bhk->bhv", s, r[:, :, t])
    return out, s


def dplr_args(r, w, k, v, kk, a):
    return r, w, k, v, -kk, kk * a


# ----------------------------------------------------------------------------- the op


def test_reference_is_the_papers_recurrence():
    inputs = op_inputs(0)
    o, s = rwkv7.dplr_reference(*dplr_args(*inputs))
    o_want, s_want = paper_recurrence(*inputs)
    assert_close(o, o_want, rtol=1e-5, atol=1e-5)
    assert_close(s, s_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 13, 32])
def test_chunked_equals_reference(chunk_size):
    args = dplr_args(*op_inputs(1))
    o, s = rwkv7.chunk_dplr(*args, chunk_size=chunk_size)
    o_ref, s_ref = rwkv7.dplr_reference(*args)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


def test_gradients_equal_and_finite():
    args = dplr_args(*op_inputs(2))
    w_o = normal(9, args[3].shape)

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a)[0] * w_o) + jnp.sum(fn(*a)[1])

    want = jax.grad(loss(rwkv7.dplr_reference), argnums=range(6))(*args)
    got = jax.grad(loss(lambda *a: rwkv7.chunk_dplr(*a, chunk_size=4)), argnums=range(6))(
        *args)
    for x, y in zip(got, want):
        assert np.isfinite(np.asarray(x)).all()
        assert_close(x, y, rtol=1e-4, atol=2e-5)


def test_strong_decays_stay_finite_and_exact():
    """Decays up to e^-16 a step beside channels that barely decay (beyond rwkv7's
    e^-0.61 floor: the op is the general one): every exponent is masked to <= 0 before
    exp, so a chunk of 32 does not overflow (e^{16 x 31} would)."""
    r, _, k, v, kk, a = op_inputs(3, shape=(1, 1, 256, 2), v_dim=2)
    w = jnp.stack([-16.0 * jax.nn.sigmoid(normal(11, (256,))),
                   -1e-3 * jax.nn.sigmoid(normal(12, (256,)))], axis=-1)[None, None]
    args = dplr_args(r, w, k, v, kk, a)
    o, s = rwkv7.chunk_dplr(*args, chunk_size=32)
    o_ref, s_ref = rwkv7.dplr_reference(*args)
    assert np.isfinite(np.asarray(o)).all()
    assert_close(o, o_ref, rtol=1e-4, atol=2e-5)
    assert_close(s, s_ref, rtol=1e-4, atol=2e-5)
    grad_w = jax.grad(lambda w: jnp.sum(rwkv7.chunk_dplr(*args[:1], w, *args[2:],
                                                         chunk_size=32)[0]))(w)
    assert np.isfinite(np.asarray(grad_w)).all()


# ----------------------------------------------------------------------------- the layer


def build(*, causal: bool, dim: int = 16, heads: int = 2, seed: int = 0, **hparams):
    mixer = registry.build("rwkv7", dim=dim, num_heads=heads, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=seed), **hparams)
    return randomize_params(mixer, seed=seed + 3, scale=0.4)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def fla_time_mix(m, d, x, mask):
    """fla's RWKV7Attention.forward (layer_idx 0, fuse_norm False) in float64 numpy, up to
    o_proj, from the weights of our layer `m` and direction `d`: BxLxD."""
    P = f64

    def lin(x, layer):
        return x @ P(layer.kernel) + (0.0 if layer.bias is None else P(layer.bias))

    h, hd = m.num_heads, m.head_dim
    b, length, dim = x.shape
    x = np.asarray(x, np.float64) * mask[..., None]
    delta = np.concatenate([np.zeros((b, 1, dim)), x[:, :-1]], 1) - x  # token_shift
    xr, xw, xk, xv, xa, xg = (x + delta * P(getattr(d, n)) for n in rwkv7.LERPS)
    r = lin(xr, m.r_proj)
    w = -0.6065306597126334 * sigmoid(lin(np.tanh(lin(xw, d.w_lora.down)), d.w_lora.up))
    k, v = lin(xk, m.k_proj), lin(xv, m.v_proj)
    a = sigmoid(lin(lin(xa, d.a_lora.down), d.a_lora.up))
    g = lin(sigmoid(lin(xg, m.g_lora.down)), m.g_lora.up)
    heads = lambda t: t.reshape(b, length, h, hd)  # noqa: E731
    kk = heads(k * P(m.k_k))
    kk = kk / np.maximum(np.linalg.norm(kk, axis=-1, keepdims=True), 1e-12)
    k = k + k * (a - 1) * P(m.k_a)
    v = v * mask[..., None]
    r, w, k, v, a = (heads(t) for t in (r, w, k, v, a))
    o = np.zeros((b, length, h, hd))
    s = np.zeros((b, h, hd, hd))  # fla's K x V
    for t in range(length):
        sa = np.einsum("bhkv,bhk->bhv", s, -kk[:, t])
        s = (np.exp(w[:, t])[..., None] * s + (kk[:, t] * a[:, t])[..., None] * sa[:, :, None]
             + k[:, t][..., None] * v[:, t][:, :, None])
        o[:, t] = np.einsum("bhkv,bhk->bhv", s, r[:, t])
    mean, var = o.mean(-1, keepdims=True), o.var(-1, keepdims=True)
    o = (o - mean) / np.sqrt(var + hd * 1e-5)
    o = o * P(m.norm_scale).reshape(h, hd) + P(m.norm_bias).reshape(h, hd)
    o = o + np.sum(r * k * P(m.r_k), -1, keepdims=True) * v
    return o.reshape(b, length, dim) * g


@pytest.mark.parametrize("causal", [True, False])
def test_layer_is_flas_forward(causal):
    """Causal: fla's forward. Bidirectional: the forward direction plus the backward one
    on the reversed sequence (its own lerps and LoRAs), summed before o_proj. Rows right-
    and left-padded (fla's x * mask, v * mask); the chunk (4) splits the sequence."""
    m = build(causal=causal, chunk_size=4)
    x = normal(8, (2, 11, 16))
    mask = np.array([[True] * 9 + [False] * 2, [False] * 3 + [True] * 8])
    y = run(m, "__call__", x, jnp.asarray(mask))
    h = fla_time_mix(m, m.forward_dir, x, mask)
    if not causal:
        h = h + fla_time_mix(m, m.backward_dir, np.flip(x, 1), np.flip(mask, 1))[:, ::-1]
    want = h @ f64(m.o_proj.kernel)
    assert_close(np.asarray(y)[mask], want[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_padding_never_reaches_real_tokens(causal):
    m = build(causal=causal, chunk_size=4)
    x = normal(10, (2, 12, 16))
    mask = jnp.array([[True] * 8 + [False] * 4, [False] * 3 + [True] * 9])
    y = run(m, "__call__", x, mask)
    y_changed = run(m, "__call__", jnp.where(mask[..., None], x, 5.0 * normal(11, x.shape)),
                    mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(y_changed)[real], rtol=1e-6, atol=1e-6)


def test_prefill_and_steps_equal_the_parallel_form():
    m = build(causal=True, chunk_size=4)
    check_prefill_and_steps(m, run, normal(12, (3, 16, 16)), jnp.array([0, 5, 9]), 9, **TOL)


def test_state_is_s_and_the_last_input_whatever_max_len():
    """The cache: pos, S per head (V x K) and the token shift's last input; the same shapes
    at max_len 16 and 100000, after a prompt and after a step. causal=False refuses."""
    x = jnp.zeros((2, 5, 16))
    for max_len in (16, 100000):
        m = rwkv7.build_rwkv7(dim=16, num_heads=2, max_len=max_len, causal=True,
                              rngs=nnx.Rngs(0))
        empty = decoding.init_cache(m, "recurrent_state", batch=2, max_len=max_len, dim=16)
        for cache in (empty, jax.eval_shape(lambda c: m.prefill(c, x, None)[1], empty),
                      jax.eval_shape(lambda c: m.step(c, x[:, 0])[1], empty)):
            assert {n: a.shape for n, a in cache.items()} == {
                "pos": (2,), "s": (2, 2, 8, 8), "shift": (2, 16)}
    bidirectional = rwkv7.build_rwkv7(dim=16, num_heads=2, max_len=16, causal=False,
                                      rngs=nnx.Rngs(0))
    with pytest.raises(decoding.DecodingError, match="rwkv7 was built with causal=False"):
        bidirectional.init_cache(1, 8)


def test_init_is_flas_layer_zero():
    """fla's layer_idx=0 init at D = 8, head 4: lerps 1 - (n/D)^p, k_k, k_a, r_k, the
    LoRA biases (www + 0.5 + 2.5 zigzag; -0.19 + 0.3 zigzag + 0.4 linear), zero LoRA
    down-projections, orthogonal x 0.1 up-projections and k_proj, orthogonal r and v."""
    m = rwkv7.build_rwkv7(dim=8, num_heads=2, max_len=8, causal=True, rngs=nnx.Rngs(0))
    n = np.arange(8.0)
    linear = n / 7 - 0.5
    zig = ((n % 4) - 1.5) / 1.5
    zig = zig * np.abs(zig)
    for name, p in zip(rwkv7.LERPS, (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)):
        assert_close(f64(getattr(m.forward_dir, name)), 1 - (n / 8) ** p, rtol=1e-6)
    assert_close(f64(m.k_k), 0.71 - 0.1 * linear, rtol=1e-6)
    assert (f64(m.k_a) == np.float32(1.02)).all() and (f64(m.r_k) == np.float32(-0.04)).all()
    assert_close(f64(m.forward_dir.w_lora.up.bias), -6 + 6 * n / 7 + 0.5 + 2.5 * zig,
                 rtol=1e-6, atol=1e-6)
    assert_close(f64(m.forward_dir.a_lora.up.bias), -0.19 + 0.3 * zig + 0.4 * linear,
                 rtol=1e-6, atol=1e-6)
    for lora in (m.forward_dir.w_lora, m.forward_dir.a_lora, m.g_lora):
        assert (f64(lora.down.kernel) == 0).all()
        up = f64(lora.up.kernel)  # 32 x 8: rank > out, gain 0.1 sqrt(32 / 8)
        assert_close(up.T @ up, (0.1 * 2) ** 2 * np.eye(8), atol=1e-6)
    for proj, gain in ((m.r_proj, 1.0), (m.k_proj, 0.1), (m.v_proj, 1.0)):
        w = f64(proj.kernel)
        assert_close(w.T @ w, gain ** 2 * np.eye(8), atol=1e-6)


def test_low_rank_dims_and_parameters_are_flas():
    """fla's rule: D 768, head 64 -> decay 64, a 64, gate 128 (RWKV-7 0.1B's); D 128 with
    head 64 -> 32, 32, 64. Parameters of fla's RWKV7Attention(hidden_size=D,
    num_heads=H, layer_idx=0): 6 lerps D, k_k D, k_a D, r_k D, r/k/v/o 4 D^2, w_lora and
    a_lora 2 D d + D, g_lora 2 D d_g, GroupNorm 2 D (a causal layer: one direction)."""
    assert rwkv7.low_rank_dims(768, 64) == {"decay": 64, "a": 64, "gate": 128}
    assert rwkv7.low_rank_dims(128, 64) == {"decay": 32, "a": 32, "gate": 64}
    dim, heads = 128, 2
    m = nnx.eval_shape(lambda: rwkv7.build_rwkv7(dim=dim, num_heads=heads, max_len=8,
                                                 causal=True, rngs=nnx.Rngs(0)))
    want = 9 * dim + 4 * dim ** 2 + 2 * (2 * dim * 32 + dim) + 2 * dim * 64 + 2 * dim
    count = sum(p.size for p in jax.tree.leaves(nnx.state(m, nnx.Param)))
    assert count == want


@pytest.mark.parametrize("causal", [True, False])
def test_token_shift_off_is_every_lerp_at_zero(causal):
    """token_shift=0 (a scaffold's builtin_conv=0): the layer with every lerp reading x_t,
    i.e. the shifted layer with its six mu at 0; its cards show own conv 0, the shifted
    layer's 2; it decodes as its parallel form; other tap counts are refused."""
    off, on = build(causal=causal, token_shift=0), build(causal=causal)
    for d in (on.forward_dir, on.backward_dir):
        for name in rwkv7.LERPS if d is not None else ():
            getattr(d, name).set_value(jnp.zeros_like(getattr(d, name)[...]))
    x = normal(8, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
    assert_close(run(off, "__call__", x, mask), run(on, "__call__", x, mask), **TOL)
    shifted = build(causal=causal)
    assert not np.allclose(np.asarray(run(shifted, "__call__", x, mask)),
                           np.asarray(run(off, "__call__", x, mask)), atol=1e-3)
    from lra.runs import card
    assert (card._builtin_conv(off), card._builtin_conv(shifted)) == (0, 2)
    if causal:
        check_prefill_and_steps(off, run, normal(12, (3, 16, 16)), jnp.array([0, 5, 9]), 9,
                                **TOL)
    with pytest.raises(ValueError, match="token_shift"):
        build(causal=causal, token_shift=3)
