"""s5 (models/mixers/s5.py) against a reference written from the paper's recurrence in
float64 numpy, a step at a time: the scan form, the bidirectional form, decoding (prefill
+ steps), padding in both directions, the HiPPO-N initialisation computed here from the
HiPPO-LegS definition, the block structure, the initial statistics of C~, B and the
steps, length 16384, the optimiser marks and the refusals."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import listops
from models import decoding, registry
from models.mixers import s5
from tests.models.helpers import f64, normal, randomize_params

DIM, LEN = 6, 13


def build(causal: bool, seed: int = 0, randomize: bool = True, **hparams):
    hparams = {**registry.capabilities("s5").test_hparams, **hparams}
    mixer = registry.build("s5", dim=DIM, num_heads=2, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=seed, dropout=seed), **hparams)
    if randomize:  # away from the init; Re Lambda < 0 (decays), one > 0 if it is clipped
        randomize_params(mixer, seed=seed + 1, scale=0.3)
        re = -np.abs(np.asarray(mixer.lambda_re[...])) - 0.05
        if mixer.clip_eigs:
            re[0] = 0.2
        mixer.lambda_re[...] = jnp.asarray(re)
    return mixer


def reference(mixer, u_LxH: np.ndarray) -> np.ndarray:
    """x_t = Lambda_bar x_{t-1} + B_bar u_t, y = 2 Re(C~ x) + D u (and for the
    bidirectional form + 2 Re(C~2 x'_t), x'_t = Lambda_bar x'_{t+1} + B_bar u_t), then
    GELU (tanh) and the half GLU."""
    re = f64(mixer.lambda_re)
    if mixer.clip_eigs:
        re = np.minimum(re, -1e-4)
    lam = re + 1j * f64(mixer.lambda_im)
    step = np.exp(f64(mixer.log_step))
    b = f64(mixer.b)[..., 0] + 1j * f64(mixer.b)[..., 1]
    if mixer.discretization == "zoh":
        lam_bar = np.exp(step * lam)
        b_bar = ((lam_bar - 1) / lam)[:, None] * b
    else:
        lam_bar = (1 + step / 2 * lam) / (1 - step / 2 * lam)
        b_bar = (step / (1 - step / 2 * lam))[:, None] * b
    c = f64(mixer.c)[..., 0] + 1j * f64(mixer.c)[..., 1]
    length = len(u_LxH)
    y = f64(mixer.d) * u_LxH
    order = [range(length), range(length - 1, -1, -1)]
    for direction in range(len(c)):
        x = np.zeros_like(lam)
        for t in order[direction]:
            x = lam_bar * x + b_bar @ u_LxH[t]
            y[t] += 2 * np.real(c[direction] @ x)
    g = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
    gate = g @ f64(mixer.head.gate.kernel) + f64(mixer.head.gate.bias)
    return (g if mixer.head.activation == "half_glu1" else y) / (1 + np.exp(-gate))


def assert_close(a, b, rtol=2e-5, atol=2e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=rtol, atol=atol)


@pytest.mark.parametrize("causal,discretization,activation", [
    (True, "zoh", "half_glu1"), (False, "zoh", "half_glu2"),
    (False, "bilinear", "half_glu1"), (True, "bilinear", "half_glu2")])
def test_scan_form_equals_the_recurrence(causal, discretization, activation):
    mixer = build(causal, discretization=discretization, activation=activation)
    assert mixer.clip_eigs == causal  # the default: clipped for the causal form only
    x = normal(0, (2, LEN, DIM))
    y = mixer(x)
    for row in range(2):
        assert_close(y[row], reference(mixer, f64(x[row])))


def test_prefill_and_steps_equal_the_parallel_form():
    """Right-padded prompts of 0, 3 and 9 tokens, then steps with each row at its own
    position: the outputs of the causal forward over the whole row."""
    mixer = build(causal=True)
    lens = jnp.array([0, 3, 9])
    x = normal(1, (3, LEN, DIM))
    y_full = np.asarray(mixer(x))
    prompt_mask = jnp.arange(9)[None] < lens[:, None]
    cache = mixer.init_cache(3, 64)
    y_prompt, cache = mixer.prefill(cache, x[:, :9], prompt_mask)
    assert cache["x"].dtype == jnp.float32 and cache["x"].shape == (3, 4, 2)
    np.testing.assert_array_equal(cache["pos"], lens)
    for row, n in enumerate([0, 3, 9]):
        assert_close(y_prompt[row, :n], y_full[row, :n])
    step = jax.jit(mixer.step)
    for _ in range(LEN - 9):
        pos = np.asarray(cache["pos"])
        y_step, cache = step(cache, x[jnp.arange(3), jnp.asarray(pos)])
        for row in range(3):
            assert_close(y_step[row], y_full[row, pos[row]])
    assert not np.allclose(y_full[:, 0], y_full[:, 1])  # a state that carries something


def test_causal_sees_no_future_and_bidirectional_sees_both_ways():
    x = normal(2, (1, LEN, DIM))
    t = 6
    future = jnp.where((jnp.arange(LEN) > t)[None, :, None], normal(3, x.shape), x)
    past = jnp.where((jnp.arange(LEN) < t)[None, :, None], normal(3, x.shape), x)
    causal, both = build(True), build(False)
    assert_close(causal(future)[:, :t + 1], causal(x)[:, :t + 1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(causal(past)[:, t], causal(x)[:, t], atol=1e-4)
    assert not np.allclose(both(future)[:, t], both(x)[:, t], atol=1e-4)
    assert not np.allclose(both(past)[:, t], both(x)[:, t], atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_padded_positions_reach_no_real_one(causal):
    """Masks with padding at the end, at the start and inside: the real outputs do not
    move when padded inputs change, and equal the reference on zeroed padded inputs."""
    mixer = build(causal)
    pos = jnp.arange(LEN)[None]
    mask = jnp.concatenate([pos < 8, pos >= 4, (pos < 3) | (pos > 9)], axis=0)
    x = normal(5, (3, LEN, DIM))
    y = np.asarray(mixer(x, padding_mask=mask))
    y_moved = np.asarray(mixer(jnp.where(mask[..., None], x, 10 * normal(6, x.shape)),
                               padding_mask=mask))
    real = np.asarray(mask)
    np.testing.assert_array_equal(y[real], y_moved[real])
    for row in range(3):
        u = np.where(real[row][:, None], f64(x[row]), 0.0)
        assert_close(y[row][real[row]], reference(mixer, u)[real[row]])


def legs_normal(n: int) -> np.ndarray:
    """HiPPO-N from its definition: A_LegS (A_nk = -sqrt(2n+1) sqrt(2k+1) below the
    diagonal, -(n+1) on it) plus the rank-one term (1/2) sqrt(2n+1) sqrt(2k+1)."""
    q = np.sqrt(2 * np.arange(n) + 1.0)
    i, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    legs = np.where(i > k, -np.outer(q, q), np.where(i == k, -(i + 1.0), 0.0))
    return legs + 0.5 * np.outer(q, q)


@pytest.mark.parametrize("blocks", [1, 4])
def test_hippo_n_initialisation_and_blocks(blocks):
    """P = 64: on each of the J blocks, the N / 2 eigenvalues of HiPPO-N (size N = P / J)
    with negative imaginary part, real parts -1/2; V block-diagonal, its columns
    orthonormal eigenvectors of that block."""
    size = 64 // blocks
    normal_NxN = legs_normal(size)
    eig = np.linalg.eigvals(normal_NxN)  # general solver, not eigh: an independent route
    np.testing.assert_allclose(eig.real, -0.5, atol=1e-9)
    want = np.sort(eig.imag)[:size // 2]
    mixer = build(False, randomize=False, d_state=64, blocks=blocks)
    np.testing.assert_allclose(mixer.lambda_re[...], -0.5, rtol=1e-7)
    np.testing.assert_allclose(mixer.lambda_im[...], np.tile(want, blocks), rtol=1e-5,
                               atol=1e-5)
    lam, v = s5.block_init(64, blocks)
    assert lam.shape == (32,) and v.shape == (64, 32)
    np.testing.assert_allclose(v.conj().T @ v, np.eye(32), atol=1e-12)
    half = size // 2
    for j in range(blocks):
        rows, cols = slice(j * size, (j + 1) * size), slice(j * half, (j + 1) * half)
        np.testing.assert_allclose(normal_NxN @ v[rows, cols], v[rows, cols] * lam[cols],
                                   atol=1e-9)
        outside = np.ones(v.shape, bool)
        outside[rows, cols] = False
        assert not v[:, cols][outside[:, cols]].any()  # zero outside block j


@pytest.mark.parametrize("c_init,variance", [("trunc_standard_normal", 2 / 64),
                                             ("lecun_normal", 2 / (64 * 64)),
                                             ("complex_normal", 1.0)])
def test_initial_statistics(c_init, variance):
    """E|C~|^2 (C V with unit columns: twice the variance of re(C)), B = 2 Re(V B~)
    lecun-normal (variance 1/P, truncated at 2 sigma), log steps uniform in their range."""
    mixer = s5.S5(dim=64, causal=False, d_state=64, blocks=4, dt_min=1e-3, dt_max=1e-1,
                  c_init=c_init, discretization="zoh", activation="half_glu1",
                  clip_eigs=False, dropout=0.0, rngs=nnx.Rngs(params=0, dropout=0))
    c = np.asarray(mixer.c[...], np.float64)
    assert abs(np.mean(np.sum(c**2, axis=-1)) / variance - 1) < 0.1
    _, v = s5.block_init(64, 4)
    b = 2 * np.real(v @ (f64(mixer.b)[..., 0] + 1j * f64(mixer.b)[..., 1]))
    assert abs(np.var(b) * 64 - 1) < 0.1
    assert np.abs(b).max() <= 2 / math.sqrt(64) / 0.87962566 + 1e-5
    wide = s5.S5(dim=2, causal=True, d_state=2048, blocks=128, dt_min=1e-3, dt_max=1e-1,
                 c_init=c_init, discretization="zoh", activation="half_glu1",
                 clip_eigs=False, dropout=0.0, rngs=nnx.Rngs(params=0, dropout=0))
    log_step = np.asarray(wide.log_step[...], np.float64)
    lo, hi = math.log(1e-3), math.log(1e-1)
    assert lo <= log_step.min() and log_step.max() <= hi
    assert abs(log_step.mean() - (lo + hi) / 2) < 0.15


def test_length_16384_is_finite():
    """Path-X's length, forward and backward, both scans (the bidirectional form)."""
    mixer = registry.build("s5", dim=2, num_heads=1, max_len=16384, causal=False,
                           rngs=nnx.Rngs(0), d_state=4, blocks=1)
    x = normal(7, (1, 16384, 2))
    graphdef, params, rest = nnx.split(mixer, nnx.Param, ...)

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params, rest)(x) ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss))(params, x)
    assert np.isfinite(float(value)) and float(value) > 0
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_ssm_parameters_are_marked_for_the_optimiser():
    """S5's groups: Lambda in "ssm", B in "ssm_b", log_step in "ssm_step" (whether B and
    log_step are SSM parameters depends on S5's opt_config and dt_global: a preset per
    task); the task configs give each script's setting (ListOps: BfastandCdecay, B with
    the rest; Text: standard with dt_global, log_step with the rest)."""
    params = nnx.state(build(False, randomize=False), nnx.Param)
    groups = {path[-1].key: v.get_metadata().get("param_group")
              for path, v in jax.tree_util.tree_leaves_with_path(
                  params, is_leaf=lambda x: isinstance(x, nnx.Variable))}
    assert {k for k, g in groups.items() if g == "ssm"} == {"lambda_re", "lambda_im"}
    assert {k for k, g in groups.items() if g == "ssm_step"} == {"log_step"}
    assert {k for k, g in groups.items() if g == "ssm_b"} == {"b"}
    listops_groups = listops.get_config("model=s5").param_groups.to_dict()
    assert listops_groups == {"ssm": {"lr_scale": pytest.approx(1 / 3), "weight_decay": 0.0},
                              "ssm_step": {"lr_scale": pytest.approx(1 / 3),
                                           "weight_decay": 0.0}}
    from configs import text

    text_groups = text.get_config("model=s5").param_groups.to_dict()
    assert text_groups["ssm_b"] == {"lr_scale": 0.25, "weight_decay": 0.0}


def test_config_defaults_and_refusals():
    assert listops.get_config("model=s5").pos_emb == "none"  # no positions added
    with pytest.raises(registry.RegistryError, match="query-key"):
        registry.check_rotary("s5")
    with pytest.raises(decoding.DecodingError, match="causal=False"):
        build(False, randomize=False).init_cache(1, 8)
    for bad, match in [(dict(d_state=10, blocks=4), "multiple of blocks"),
                       (dict(d_state=6, blocks=2), "even size"),
                       (dict(blocks=0), "blocks"),
                       (dict(dt_min=0.1, dt_max=0.01), "dt_min <= dt_max"),
                       (dict(c_init="normal"), "c_init must be one of"),
                       (dict(discretization="euler"), "discretization must be one of"),
                       (dict(activation="gelu"), "activation must be one of")]:
        with pytest.raises(ValueError, match=match):
            build(True, randomize=False, **bad)
