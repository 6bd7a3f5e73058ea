"""s4d and lru (models/mixers/ssm.py) against references written from the papers'
recurrences in float64 numpy, a step at a time: the convolution (s4d) and associative
scan (lru) forms, the bidirectional forms, decoding (prefill + steps), padding in both
directions, the initialisations' statistics, length 16384, the weight-decay marks."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import listops
from lra.training import optim
from models import decoding, registry
from models.mixers import ssm
from tests.models.helpers import f64, normal, randomize_params

DIM, LEN = 6, 13
_erf = np.vectorize(math.erf)


def build(name: str, causal: bool, seed: int = 0, randomize: bool = True, **hparams):
    hparams = {**registry.capabilities(name).test_hparams, **hparams}
    mixer = registry.build(name, dim=DIM, num_heads=2, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=seed, dropout=seed), **hparams)
    if randomize:  # away from the init, but with decays that stay decays
        randomize_params(mixer, seed=seed + 1, scale=0.3)
    return mixer


def head(mixer, y_LxH: np.ndarray, exact: bool) -> np.ndarray:
    """GELU, then Linear(H, 2H) and GLU, float64."""
    if exact:
        g = 0.5 * y_LxH * (1 + _erf(y_LxH / math.sqrt(2)))
    else:
        g = 0.5 * y_LxH * (1 + np.tanh(math.sqrt(2 / math.pi) * (y_LxH + 0.044715 * y_LxH**3)))
    z = g @ f64(mixer.head.glu.kernel) + f64(mixer.head.glu.bias)
    a, b = np.split(z, 2, axis=-1)
    return a / (1 + np.exp(-b))


def s4d_reference(mixer, u_LxH: np.ndarray) -> np.ndarray:
    """The S4D recurrence x_t = dA x_{t-1} + dB u_t, y = 2 Re(C x) + D u (ZOH), and for the
    bidirectional form the same with the second C over u_{t+1}, u_{t+2}, ... . dt is
    exp(log_dt) or softplus(log_dt) = log(1 + exp(log_dt)); channel h uses copy
    h mod n_ssm of (A, B) (S4's repeat 't n -> (v t) n')."""
    log_dt = f64(mixer.log_dt)
    dt = (np.exp(log_dt) if mixer.dt_transform == "exp" else np.log1p(np.exp(log_dt)))[:, None]
    copy = np.arange(len(log_dt)) % mixer.n_ssm
    a = (-np.exp(f64(mixer.log_a_real)) + 1j * f64(mixer.a_imag))[copy]
    b = (f64(mixer.b)[..., 0] + 1j * f64(mixer.b)[..., 1])[copy]
    c = f64(mixer.c)[..., 0] + 1j * f64(mixer.c)[..., 1]
    da, db = np.exp(dt * a), (np.exp(dt * a) - 1) / a * b
    length = len(u_LxH)
    y = f64(mixer.d) * u_LxH
    x = np.zeros_like(a)
    for t in range(length):
        x = da * x + db * u_LxH[t][:, None]
        y[t] += 2 * np.real(np.sum(c[0] * x, axis=-1))
    if len(c) == 2:
        x = np.zeros_like(a)
        for t in range(length - 1, -1, -1):  # x here: the state of u_{t+1}, u_{t+2}, ...
            y[t] += 2 * np.real(np.sum(c[1] * x, axis=-1))
            x = da * x + db * u_LxH[t][:, None]
    return head(mixer, y, exact=True)


def lru_reference(mixer, u_LxH: np.ndarray) -> np.ndarray:
    """x_t = lambda x_{t-1} + gamma B u_t, y = Re(C x) + D u; bidirectional: plus
    Re(C2 x'_t), x'_t = lambda x'_{t+1} + gamma B u_t."""
    lam = np.exp(-np.exp(f64(mixer.nu_log)) + 1j * np.exp(f64(mixer.theta_log)))
    b = (f64(mixer.b_re) + 1j * f64(mixer.b_im)) * np.exp(f64(mixer.gamma_log))[:, None]
    c = f64(mixer.c_re) + 1j * f64(mixer.c_im)
    length = len(u_LxH)
    y = f64(mixer.d) * u_LxH
    order = [range(length), range(length - 1, -1, -1)]
    for direction in range(len(c)):
        x = np.zeros_like(lam)
        for t in order[direction]:
            x = lam * x + b @ u_LxH[t]
            y[t] += np.real(c[direction] @ x)
    return head(mixer, y, exact=False)


REFERENCES = {"s4d": s4d_reference, "lru": lru_reference}


def assert_close(a, b, rtol=2e-5, atol=2e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=rtol, atol=atol)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["s4d", "lru"])
def test_parallel_form_equals_the_recurrence(name, causal):
    """s4d: FFT convolution of the Vandermonde kernel; lru: associative scan; both equal
    the step-by-step recurrence (for causal=False: both directions, S4's off-by-one)."""
    mixer = build(name, causal)
    x = normal(0, (2, LEN, DIM))
    y = mixer(x)
    for row in range(2):
        assert_close(y[row], REFERENCES[name](mixer, f64(x[row])))


@pytest.mark.parametrize("name", ["s4d", "lru"])
def test_prefill_and_steps_equal_the_parallel_form(name):
    """Right-padded prompts of 0, 3 and 9 tokens, then steps with each row at its own
    position: the outputs of the causal forward over the whole row."""
    mixer = build(name, causal=True)
    lens = jnp.array([0, 3, 9])
    x = normal(1, (3, LEN, DIM))
    y_full = np.asarray(mixer(x))
    prompt_mask = jnp.arange(9)[None] < lens[:, None]
    cache = mixer.init_cache(3, 64)
    y_prompt, cache = mixer.prefill(cache, x[:, :9], prompt_mask)
    assert cache["x"].dtype == jnp.float32
    np.testing.assert_array_equal(cache["pos"], lens)
    for row, n in enumerate([0, 3, 9]):
        assert_close(y_prompt[row, :n], y_full[row, :n])
    step = jax.jit(mixer.step)
    for i in range(LEN - 9):
        pos = np.asarray(cache["pos"])
        y_step, cache = step(cache, x[jnp.arange(3), jnp.asarray(pos)])
        for row in range(3):
            assert_close(y_step[row], y_full[row, pos[row]])
    assert not np.allclose(y_full[:, 0], y_full[:, 1])  # a state that carries something


@pytest.mark.parametrize("name", ["s4d", "lru"])
def test_causal_sees_no_future_and_bidirectional_sees_both_ways(name):
    x = normal(2, (1, LEN, DIM))
    t = 6
    future = jnp.where((jnp.arange(LEN) > t)[None, :, None], normal(3, x.shape), x)
    past = jnp.where((jnp.arange(LEN) < t)[None, :, None], normal(3, x.shape), x)
    causal, both = build(name, True), build(name, False)
    assert_close(causal(future)[:, :t + 1], causal(x)[:, :t + 1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(causal(past)[:, t], causal(x)[:, t], atol=1e-4)
    assert not np.allclose(both(future)[:, t], both(x)[:, t], atol=1e-4)
    assert not np.allclose(both(past)[:, t], both(x)[:, t], atol=1e-4)
    # s4d's backward kernel starts at u_{t+1} (S4's off-by-one): the next position is
    # read, by K1[0], in both.
    nxt = jnp.where((jnp.arange(LEN) == t + 1)[None, :, None], normal(4, x.shape), x)
    assert not np.allclose(both(nxt)[:, t], both(x)[:, t], atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["s4d", "lru"])
def test_padded_positions_reach_no_real_one(name, causal):
    """Masks with padding at the end, at the start and inside: the real outputs do not
    move when padded inputs change, and equal the reference on zeroed padded inputs."""
    mixer = build(name, causal)
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
        assert_close(y[row][real[row]], REFERENCES[name](mixer, u)[real[row]])


def test_s4d_initialisation():
    n = 32
    lin = build("s4d", False, randomize=False, d_state=2 * n)
    np.testing.assert_allclose(lin.a_imag[...], np.broadcast_to(np.pi * np.arange(n),
                                                                (DIM, n)), rtol=1e-6)
    np.testing.assert_allclose(np.exp(lin.log_a_real[...]), 0.5, rtol=1e-6)  # Re A = -1/2
    inv = build("s4d", False, randomize=False, d_state=2 * n, init="inv")
    want = 2 * n / np.pi * (2 * n / (2 * np.arange(n) + 1) - 1)
    np.testing.assert_allclose(inv.a_imag[...][0], want, rtol=1e-6)
    b = np.asarray(lin.b[...])
    np.testing.assert_array_equal(b[..., 0], 1.0)
    np.testing.assert_array_equal(b[..., 1], 0.0)
    # dt log-uniform in [1e-3, 1e-1], one per channel: over 4096 channels, log dt fills the
    # range with the uniform's mean and variance.
    wide = ssm.S4D(dim=4096, causal=True, d_state=2, init="lin", dt_min=1e-3, dt_max=1e-1,
                   dropout=0.0, rngs=nnx.Rngs(params=0, dropout=0))
    log_dt = np.asarray(wide.log_dt[...], np.float64)
    lo, hi = math.log(1e-3), math.log(1e-1)
    assert lo <= log_dt.min() and log_dt.max() <= hi
    assert abs(log_dt.mean() - (lo + hi) / 2) < 0.1
    assert abs(log_dt.std() - (hi - lo) / math.sqrt(12)) < 0.05
    c = np.asarray(wide.c[...])
    assert abs(c.var() - 0.5) < 0.05  # C ~ CN(0, 1): re and im of variance 1/2


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_ssm,dt_transform", [(1, "exp"), (3, "softplus"),
                                                (None, "softplus"), (1, "softplus")])
def test_s4d_tied_ssms_and_softplus_step_equal_the_recurrence(n_ssm, dt_transform, causal):
    """S4's kernel options (SSMKernel): n_ssm copies of (A, B) shared by the channels h with
    h mod n_ssm equal (1: tied across all, S4's LRA setting), dt = softplus(log_dt) (S4's
    layer default): the convolution and decoding equal the recurrence with them."""
    mixer = build("s4d", causal, n_ssm=n_ssm, dt_transform=dt_transform)
    copies = DIM if n_ssm is None else n_ssm
    assert mixer.log_a_real.shape[0] == mixer.a_imag.shape[0] == mixer.b.shape[0] == copies
    assert mixer.log_dt.shape == (DIM,) and mixer.c.shape[1] == DIM  # dt, C per channel
    x = normal(8, (2, LEN, DIM))
    y = mixer(x)
    for row in range(2):
        assert_close(y[row], s4d_reference(mixer, f64(x[row])))
    if causal:
        cache = mixer.init_cache(2, 64)
        _, cache = mixer.prefill(cache, x[:, :5], jnp.ones((2, 5), bool))
        y_step, _ = mixer.step(cache, x[:, 5])
        assert_close(y_step, y[:, 5])
    # Tied: one gradient for all channels' A (the sum of what per-channel copies would get).
    if copies == 1:
        graphdef, params, rest = nnx.split(mixer, nnx.Param, ...)
        grads = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2))(params)
        assert grads["log_a_real"][...].shape == (1, mixer.a_imag.shape[1])


def test_s4d_options_default_to_the_minimal_s4d_and_are_checked():
    """Without them: one (A, B) per channel and dt = exp(log_dt), as before the options
    (the parameters' shapes and outputs unchanged); bad values are refused."""
    plain = build("s4d", False)
    assert plain.log_a_real.shape == (DIM, 4) and plain.b.shape == (DIM, 4, 2)
    assert plain.conv_dropout is None
    np.testing.assert_allclose(plain.dt(), np.exp(plain.log_dt[...]), rtol=1e-6)
    assert_close(plain(normal(9, (1, LEN, DIM)))[0],
                 s4d_reference(plain, f64(normal(9, (1, LEN, DIM))[0])))
    for bad, match in [(dict(n_ssm=4), "divisor"), (dict(n_ssm=0), "divisor"),
                       (dict(dt_transform="relu"), "dt_transform"),
                       (dict(conv_dropout=1.0), "conv_dropout")]:
        with pytest.raises(ValueError, match=match):
            build("s4d", False, **bad)


def test_s4d_softplus_step_starts_log_uniform():
    """dt_transform softplus: log_dt holds softplus^-1(dt) (S4's inv_transform), so dt =
    softplus(log_dt) is log-uniform in [dt_min, dt_max] at init, as with exp."""
    wide = ssm.S4D(dim=4096, causal=True, d_state=2, init="lin", dt_min=1e-3, dt_max=1e-1,
                   dropout=0.0, rngs=nnx.Rngs(params=0, dropout=0), dt_transform="softplus")
    log_dt = np.log(np.asarray(wide.dt(), np.float64))
    lo, hi = math.log(1e-3), math.log(1e-1)
    assert lo - 1e-5 <= log_dt.min() and log_dt.max() <= hi + 1e-5
    assert abs(log_dt.mean() - (lo + hi) / 2) < 0.1
    assert abs(log_dt.std() - (hi - lo) / math.sqrt(12)) < 0.05
    # not exp: the stored value differs from log dt (by log(dt / (exp(dt) - 1)) ~ -dt/2).
    assert np.abs(np.asarray(wide.log_dt[...], np.float64) - log_dt).max() > 1e-3


def test_s4d_conv_dropout_is_untied_and_before_the_gelu():
    """conv_dropout (S4's FFTConv dropout): in training, K * u + D u is dropped element by
    element (another mask at every position and channel), before the GELU; the head's
    own dropout stays one mask per channel over the sequence; off in evaluation."""
    mixer = build("s4d", False, conv_dropout=0.5)
    x = normal(10, (1, 64, DIM))
    assert_close(mixer(x, deterministic=True), build("s4d", False)(x))
    captured = {}
    head = mixer.head

    class Spy(nnx.Module):
        def __call__(self, y, deterministic=True):
            captured["y"] = y
            return head(y, deterministic)

    mixer.head = Spy()
    mixer(x, deterministic=False)
    dropped = np.asarray(captured["y"][0]) == 0.0  # L x H: where the mask zeroed
    mixer.head = head
    assert 0.3 < dropped.mean() < 0.7
    # untied: every channel's mask varies along the sequence, and positions' masks
    # differ between channels
    assert dropped.any(axis=0).all() and not dropped.all(axis=0).any()
    assert (dropped != dropped[:, :1]).any(axis=0)[1:].all()


@pytest.mark.parametrize("r_min,r_max,max_phase", [(0.9, 0.999, 2 * np.pi),
                                                   (0.0, 0.5, np.pi / 10)])
def test_lru_initialisation(r_min, r_max, max_phase):
    mixer = ssm.LRU(dim=8, causal=True, d_state=8192, r_min=r_min, r_max=r_max,
                    max_phase=max_phase, dropout=0.0, rngs=nnx.Rngs(params=0, dropout=0))
    lam = np.asarray(mixer.lam(), np.complex128)
    modulus, phase = np.abs(lam), np.angle(lam) % (2 * np.pi)
    assert r_min - 1e-6 <= modulus.min() and modulus.max() <= r_max + 1e-6
    # Uniform on the ring: |lambda|^2 uniform in [r_min^2, r_max^2].
    width = r_max**2 - r_min**2
    assert abs(np.mean(modulus**2) - (r_min**2 + r_max**2) / 2) < 0.01 * width  # ~3 sigma
    phase = np.exp(np.asarray(mixer.theta_log[...], np.float64))
    assert 0 <= phase.min() and phase.max() <= max_phase
    assert abs(phase.mean() - max_phase / 2) < 0.02 * max_phase
    np.testing.assert_allclose(np.exp(mixer.gamma_log[...]), np.sqrt(1 - modulus**2),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["s4d", "lru"])
def test_length_16384_is_finite(name, causal):
    """Decays as exp(l dt A) and products of |lambda| < 1: nothing overflows at Path-X's
    length, forward or backward (tiny dims: a CPU check)."""
    mixer = registry.build(name, dim=2, num_heads=1, max_len=16384, causal=causal,
                           rngs=nnx.Rngs(0), d_state=4)
    x = normal(7, (1, 16384, 2))
    graphdef, params, rest = nnx.split(mixer, nnx.Param, ...)

    def loss(params, x):
        return jnp.sum(nnx.merge(graphdef, params, rest)(x) ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss))(params, x)
    assert np.isfinite(float(value)) and float(value) > 0
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


def test_ssm_parameters_are_not_weight_decayed():
    expected = {"s4d": {"log_dt", "log_a_real", "a_imag", "b"},
                "lru": {"nu_log", "theta_log", "gamma_log", "b_re", "b_im"}}
    for name, names in expected.items():
        params = nnx.state(build(name, False, randomize=False), nnx.Param)
        mask = optim.weight_decay_mask(params)
        undecayed = {path[-1].key for path, decays in jax.tree_util.tree_leaves_with_path(
            mask) if not decays}
        assert undecayed == names, name
    # s4d's groups: S4's lr-dict keys dt, A, B, C (configs/recipes.py S4_GROUPS).
    params = nnx.state(build("s4d", False, randomize=False), nnx.Param)
    groups = {path[-1].key: v.get_metadata().get("param_group")
              for path, v in jax.tree_util.tree_leaves_with_path(
                  params, is_leaf=lambda x: isinstance(x, nnx.Variable))}
    assert groups == {"log_dt": "ssm_step", "log_a_real": "ssm", "a_imag": "ssm",
                      "b": "ssm_b", "c": "ssm_c", "d": None, "kernel": None, "bias": None}


def test_config_defaults_and_refusals():
    for name in ("s4d", "lru"):
        assert listops.get_config(f"model={name}").pos_emb == "none"  # no positions added
        with pytest.raises(registry.RegistryError, match="query-key"):
            registry.check_rotary(name)
        with pytest.raises(decoding.DecodingError, match="causal=False"):
            build(name, False, randomize=False).init_cache(1, 8)
    with pytest.raises(ValueError, match="even"):
        build("s4d", True, d_state=7)
    with pytest.raises(ValueError, match="r_min"):
        build("lru", True, r_min=0.5, r_max=1.0)
