"""Diagonal linear state-space mixers: S4D (Gu et al. 2022) and the LRU (Orvieto et al.
2023): `s4d` and `lru`.

Both run, per input channel or over all of them, a linear recurrence with a complex
diagonal state matrix, x_t = a x_{t-1} + b u_t, read out as the real part of c x_t plus
a skip D u_t; they differ in how a, b and c are parameterised and in how the sequence is
computed in parallel.

s4d, "On the Parameterization and Initialization of Diagonal State Space Models" (as the
state-spaces/s4 repository: `models/s4/s4d.py`, and the S4D kernel `SSMKernelDiag` of
`src/models/sequence/kernels/ssm.py`, whose learned B the minimal s4d.py fixes at 1). Per
channel h of H = dim, N / 2 conjugate pairs of a continuous diagonal SSM:
    A_n = -exp(log_a_real_n) + i a_imag_n      S4D-Lin: -1/2 + i pi n; S4D-Inv:
                                               -1/2 + i N / pi (N / (2n + 1) - 1)
    dt = exp(log_dt), log-uniform in [dt_min, dt_max] at init (one per channel)
    ZOH: dA = exp(dt A), dB = (exp(dt A) - 1) / A * B       (B = 1 at init)
    K[l] = 2 Re(sum_n C_n dB_n dA_n^l)     l < L, the Vandermonde product
    y = K * u (FFT convolution of size 2L, O(L log L)) + D u
and then GELU, the layer's dropout and the output projection Linear(H, 2H) + GLU (s4d.py's
`output_linear`). The kernel is computed for the input's length: any L.
Options of S4's kernel (`SSMKernel`; the defaults are the minimal s4d.py's):
`n_ssm` trainable copies of (A, B), channel h using copy h mod n_ssm (S4's `repeat`; 1
ties them across channels, None gives each channel its own; dt and C stay per channel);
`dt_transform` "softplus" (S4's layer default; dt = softplus(log_dt), log_dt then holding
softplus^-1 of the log-uniform draw) instead of "exp"; `conv_dropout`, an untied dropout
on K * u + D u before the GELU (S4's `FFTConv` dropout, beside the tied one after it).
Non-causal (causal=False), S4's bidirectional option (`FFTConv`): the kernel has two
channels of C (A, B and dt shared), K0 convolved forward and K1 over the future, as one
kernel of length 2L, [K0, flip(K1)]: y_t = sum_j K0[j] u_{t-j} + sum_j K1[j] u_{t+1+j}.
The backward half starts one step ahead (S4's "deliberate off-by-one": position t itself
is the forward kernel's), replicated.

lru, "Resurrecting Recurrent Neural Networks for Long Sequences" (the paper's appendix A;
its public JAX port NicolasZucchet/minimal-LRU, `lru/model.py`). One recurrence over all
channels, state of N complex numbers:
    lambda = exp(-exp(nu_log) + i exp(theta_log)), |lambda| uniform on the ring
             [r_min, r_max] (in |lambda|^2) and phase uniform in [0, max_phase] at init
    x_t = lambda o x_{t-1} + (B o exp(gamma_log)) u_t, gamma_log = log sqrt(1 - |lambda|^2)
          at init and then learned (the normalisation)
    y_t = Re(C x_t) + D o u_t
computed by `jax.lax.associative_scan` over the sequence, then GELU (flax's default tanh
form, as minimal-LRU), the layer's dropout and a GLU out(u) * sigmoid(gate(u)) (the LRU
block's nonlinear projection; minimal-LRU's `SequenceLayer`). minimal-LRU (bbd71b1,
lru/model.py:119-128) drops a second time after the GLU, again one mask per channel over
the sequence (`broadcast_dims=[0]` of a vmapped example); here the mixer's output is
dropped by the block's dropout (config.dropout_rate), one mask per element. Non-causal: S5's
bidirectional form (lindermanlab/S5 `apply_ssm`, which minimal-LRU derives from): a second
scan of the same (lambda, B u) in reverse, its states read by a second C and summed,
Re(C x_fwd + C2 x_bwd) (S5 concatenates the states and C; the same sum). The backward
state at t includes u_t.

Each mixer is the paper's layer without its normalisation and residual (S4D and the LRU
use post-BatchNorm/LayerNorm around the layer in their LRA configs); here it stands in the
pre-LN block, which provides both and adds its channel MLP after it (as for gmlp).
Projections are xavier-uniform with zero bias as every variant here (s4d.py: PyTorch's
Conv1d default; minimal-LRU: lecun-normal); everything else is initialised as the papers.
No positions are added (Capabilities.pos_emb "none"): the recurrence orders the sequence.

Padding: padded inputs are zeroed before the convolution or the scan, so they reach no
real position in either direction (right-padded or not). Decoding (the causal form,
"recurrent_state"): the cache holds the state, H x N/2 (s4d) or N (lru) complex numbers
per row as float32 (re, im) pairs, at every position; a step is the recurrence above.
The SSM parameters the papers train apart carry `no_weight_decay=True` and a
`param_group` (lra.training.optim; the groups' learning-rate scales are presets,
configs/presets.py PARAM_GROUPS, and the `paper` recipes'): s4d's log_a_real and a_imag
("ssm"), B ("ssm_b") and log_dt ("ssm_step"), which S4 registers with weight decay 0 and a
learning rate of their own (`register(name, p, lr_dict[...], wd_dict[...])` with `lr` a
dict per parameter or one number for all), and C ("ssm_c", decayed: S4 registers it with
wd None, the optimiser's); the LRU's nu_log, theta_log, gamma_log and B (minimal-LRU's
"ssm" optimiser group, lr_factor 0.5).
Numerics: float32 parameters and inputs, complex64 inside; every power of a decay is
exp(l dt A) or a product of |lambda| < 1, so no exponent is positive (L = 16384 is finite).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import decoding, layers, registry

S4D_INITS = ("lin", "inv")
S4D_DT_TRANSFORMS = ("exp", "softplus")
_NO_PRODUCTS = "it mixes by a linear recurrence and forms no query-key products to rotate"


# ----------------------------------------------------------------------------- shared


def _f32(param: nnx.Variable) -> jax.Array:
    """A parameter's value in float32: the SSM is computed in float32 (and complex64)
    whatever the compute dtype (models/precision.py), as its state must be."""
    return param[...].astype(jnp.float32)


def _complex(pair: jax.Array) -> jax.Array:
    """[..., 2] float32 (re, im) -> complex64."""
    return jax.lax.complex(pair[..., 0], pair[..., 1])


def _pair(z: jax.Array) -> jax.Array:
    """complex64 -> [..., 2] float32 (re, im): how parameters and caches hold it."""
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


def _zero_padded(u_BxLxH: jax.Array, padding_mask: jax.Array | None) -> jax.Array:
    if padding_mask is None:
        return u_BxLxH
    return jnp.where(padding_mask.astype(jnp.bool_)[..., None], u_BxLxH, 0.0)


def _normal(std: float) -> layers.Initializer:
    def init(key, shape, dtype=jnp.float32):
        return std * jax.random.normal(key, shape, dtype)
    return init


def _check_causal_form(module: nnx.Module) -> None:
    if not module.causal:
        raise decoding.DecodingError(
            f"{type(module).__name__} was built with causal=False; only the causal form "
            "reads a state one token at a time")


class _Head(nnx.Module):
    """GELU, the layer's dropout (one mask for every position: S4's DropoutNd,
    minimal-LRU's broadcast over time), Linear(H, 2H) and GLU: a * sigmoid(b)."""

    def __init__(self, dim: int, *, exact_gelu: bool, dropout: float, rngs: nnx.Rngs):
        self.exact_gelu = exact_gelu
        self.dropout = nnx.Dropout(dropout, broadcast_dims=(-2,), rngs=rngs)
        self.glu = layers.dense(dim, 2 * dim, ("embed", "mlp"), rngs=rngs)

    def __call__(self, y: jax.Array, deterministic: bool = True) -> jax.Array:
        y = self.dropout(jax.nn.gelu(y, approximate=not self.exact_gelu),
                         deterministic=deterministic)
        a, b = jnp.split(self.glu(y), 2, axis=-1)
        return a * jax.nn.sigmoid(b)


# ----------------------------------------------------------------------------- s4d


def s4d_imag(init: str, d_state: int) -> np.ndarray:
    """Imaginary parts of the N / 2 eigenvalues (positive; the conjugates are implied)."""
    n = np.arange(d_state // 2, dtype=np.float64)
    if init == "lin":
        return np.pi * n
    return d_state / np.pi * (d_state / (2 * n + 1) - 1)  # inv


def vandermonde(dta_HxN: jax.Array, length: int) -> jax.Array:
    """exp(dt A l) for l < length (H x N x L complex64): the powers dA^l with every
    exponent's real part <= 0, so decays underflow to 0 instead of overflowing."""
    return jnp.exp(dta_HxN[..., None] * jnp.arange(length, dtype=jnp.float32))


class S4D(nnx.Module):
    """The S4D layer (module docstring); `__call__` is the convolution form."""

    def __init__(self, *, dim: int, causal: bool, d_state: int, init: str, dt_min: float,
                 dt_max: float, dropout: float, rngs: nnx.Rngs, n_ssm: int | None = None,
                 dt_transform: str = "exp", conv_dropout: float = 0.0):
        if d_state <= 0 or d_state % 2:
            raise ValueError(f"s4d: d_state must be a positive even number (N / 2 conjugate "
                             f"pairs), got {d_state}")
        if init not in S4D_INITS:
            raise ValueError(f"s4d: init must be one of {S4D_INITS}, got {init!r}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"s4d: need 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
        n_ssm = dim if n_ssm is None else n_ssm
        if isinstance(n_ssm, bool) or not isinstance(n_ssm, int) or n_ssm <= 0 or dim % n_ssm:
            raise ValueError(f"s4d: n_ssm must be a positive divisor of the width {dim} (or "
                             f"None: one (A, B) per channel), got {n_ssm!r}")
        if dt_transform not in S4D_DT_TRANSFORMS:
            raise ValueError(f"s4d: dt_transform must be one of {S4D_DT_TRANSFORMS}, got "
                             f"{dt_transform!r}")
        if not 0.0 <= conv_dropout < 1.0:
            raise ValueError(f"s4d: conv_dropout must be in [0, 1), got {conv_dropout}")
        half = d_state // 2
        self.causal = causal
        self.dim = dim
        self.n_ssm = n_ssm
        self.dt_transform = dt_transform
        log_lo, log_hi = math.log(dt_min), math.log(dt_max)

        def log_dt_init(key, shape, dtype=jnp.float32):
            log_dt = jax.random.uniform(key, shape, dtype, log_lo, log_hi)
            if dt_transform == "exp":
                return log_dt
            # S4's inv_transform(exp(log dt), "softplus"): log(exp(dt) - 1), dt >= 1e-4.
            dt = jnp.maximum(jnp.exp(log_dt), 1e-4)
            return dt + jnp.log(-jnp.expm1(-dt))

        imag = jnp.asarray(s4d_imag(init, d_state), jnp.float32)
        # S4's register(name, p, lr, wd=0.0): no decay, a learning rate per group
        # (configs/presets.py PARAM_GROUPS, configs/recipes.py).
        def ssm(group):
            return dict(rngs=rngs, no_weight_decay=True, param_group=group,
                        keep_float32=True)

        # (A, B) per copy: the copies' axis is the width's only when every channel has one.
        copies = "embed" if n_ssm == dim else None
        self.log_dt = layers.param(log_dt_init, ("embed",), (dim,), **ssm("ssm_step"))
        self.log_a_real = layers.param(jax.nn.initializers.constant(math.log(0.5)),
                                       (copies, None), (n_ssm, half), **ssm("ssm"))
        self.a_imag = layers.param(lambda key, shape, dtype: jnp.broadcast_to(imag, shape),
                                   (copies, None), (n_ssm, half), **ssm("ssm"))
        self.b = layers.param(lambda key, shape, dtype: jnp.zeros(shape).at[..., 0].set(1.0),
                              (copies, None, None), (n_ssm, half, 2), **ssm("ssm_b"))
        # C ~ CN(0, 1) (torch.randn(cfloat)): re and im of variance 1/2. One channel of C
        # per direction (S4's bidirectional kernel has channels * 2). S4 registers C with
        # wd None: the optimiser's weight decay.
        directions = 1 if causal else 2
        self.c = layers.param(_normal(math.sqrt(0.5)), (None, "embed", None, None),
                              (directions, dim, half, 2), rngs=rngs, keep_float32=True,
                              param_group="ssm_c")
        self.d = layers.param(_normal(1.0), ("embed",), (dim,), rngs=rngs)
        # Only when asked for: a Dropout holds an RNG stream (the state's layout).
        self.conv_dropout = (nnx.Dropout(conv_dropout, rngs=rngs) if conv_dropout > 0
                             else None)
        self.head = _Head(dim, exact_gelu=True, dropout=dropout, rngs=rngs)

    def dt(self) -> jax.Array:
        """The step size per channel (H,): exp or softplus of log_dt."""
        log_dt = _f32(self.log_dt)
        return jnp.exp(log_dt) if self.dt_transform == "exp" else jax.nn.softplus(log_dt)

    def discretised(self) -> tuple[jax.Array, jax.Array]:
        """(dt A, dB), H x N/2 complex64: ZOH, dB = (exp(dt A) - 1) / A * B; the n_ssm
        copies of (A, B) tiled over the H channels (channel h: copy h mod n_ssm)."""
        repeat = (self.dim // self.n_ssm, 1)
        a_HxN = jnp.tile(jax.lax.complex(-jnp.exp(_f32(self.log_a_real)), _f32(self.a_imag)),
                         repeat)
        b_HxN = jnp.tile(_complex(_f32(self.b)), repeat)
        dta_HxN = self.dt()[:, None] * a_HxN
        return dta_HxN, (jnp.exp(dta_HxN) - 1.0) / a_HxN * b_HxN

    def kernel(self, length: int) -> jax.Array:
        """K (directions x H x L float32): K[c, h, l] = 2 Re(sum_n C dB dA^l)."""
        dta_HxN, db_HxN = self.discretised()
        cb_CxHxN = _complex(_f32(self.c)) * db_HxN
        return 2.0 * jnp.real(jnp.einsum("chn,hnl->chl", cb_CxHxN,
                                         vandermonde(dta_HxN, length)))

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        length = x_BxLxD.shape[1]
        u_BxLxH = _zero_padded(x_BxLxD.astype(jnp.float32), padding_mask)
        k_CxHxL = self.kernel(length)
        # One kernel of length 2L (S4's FFTConv): K0 on lags 0..L-1, and for the
        # bidirectional form flip(K1) on lags -L..-1; an FFT of size 2L never wraps.
        k_HxT = k_CxHxL[0] if self.causal else jnp.concatenate(
            [k_CxHxL[0], k_CxHxL[1, :, ::-1]], axis=-1)
        size = 2 * length
        y_BxLxH = jnp.fft.irfft(jnp.fft.rfft(u_BxLxH, n=size, axis=1)
                                * jnp.fft.rfft(k_HxT, n=size, axis=-1).T[None],
                                n=size, axis=1)[:, :length]
        y_BxLxH = y_BxLxH + _f32(self.d) * u_BxLxH
        if self.conv_dropout is not None:
            y_BxLxH = self.conv_dropout(y_BxLxH, deterministic=deterministic)
        return self.head(y_BxLxH, deterministic).astype(x_BxLxD.dtype)

    # Decoding, form recurrent_state (models.decoding): per channel the N/2 complex state
    # x_t = dA x_{t-1} + dB u_t, read as y = 2 Re(C x_t) + D u_t: the convolution's output.
    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        del max_len  # the state never grows with the position
        _check_causal_form(self)
        half = self.a_imag.shape[-1]
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "x": jnp.zeros((batch, self.dim, half, 2), jnp.float32)}

    def prefill(self, cache, x_BxLxD, padding_mask):
        """The causal outputs and, in the same parallel call, the state after row b's
        real tokens: x = sum_k dA^k dB u_{len_b - 1 - k} (each row read backwards from its
        last real token, so the powers are one H x N/2 x L Vandermonde for all rows)."""
        del cache
        _check_causal_form(self)
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask)
        batch, length, _ = x_BxLxD.shape
        pos_B = decoding.lengths_of(padding_mask, batch, length)
        back_BxL = pos_B[:, None] - 1 - jnp.arange(length)[None]
        u_BxLxH = jnp.take_along_axis(x_BxLxD.astype(jnp.float32),
                                      jnp.clip(back_BxL, 0, length - 1)[..., None], axis=1)
        u_BxLxH = jnp.where((back_BxL >= 0)[..., None], u_BxLxH, 0.0)
        dta_HxN, db_HxN = self.discretised()
        x_BxHxN = db_HxN * jnp.einsum("hnl,blh->bhn", vandermonde(dta_HxN, length),
                                      u_BxLxH.astype(jnp.complex64))
        return y_BxLxD, {"pos": pos_B, "x": _pair(x_BxHxN)}

    def step(self, cache, x_BxD):
        _check_causal_form(self)
        u_BxH = x_BxD.astype(jnp.float32)
        dta_HxN, db_HxN = self.discretised()
        state_BxHxN = jnp.exp(dta_HxN) * _complex(cache["x"]) + db_HxN * u_BxH[..., None]
        y_BxH = (2.0 * jnp.real(jnp.sum(_complex(_f32(self.c))[0] * state_BxHxN, axis=-1))
                 + _f32(self.d) * u_BxH)
        return (self.head(y_BxH).astype(x_BxD.dtype),
                {"pos": cache["pos"] + 1, "x": _pair(state_BxHxN)})


@registry.register("s4d", capabilities=registry.Capabilities(
    description="S4D: per-channel diagonal complex SSM (S4D-Lin/Inv, ZOH, learned log "
    "step), kernel by Vandermonde product, FFT convolution, D skip, GELU + GLU; "
    "causal=False is S4's bidirectional kernel (a second C over the future)",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    receptive_field="global", pos_emb="none", test_hparams={"d_state": 8},
    rotary_refusal=_NO_PRODUCTS))
def build_s4d(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
              d_state: int = 64, init: str = "lin", dt_min: float = 1e-3,
              dt_max: float = 1e-1, n_ssm: int | None = None, dt_transform: str = "exp",
              conv_dropout: float = 0.0, attention_dropout: float = 0.0) -> S4D:
    """d_state N (64, S4D's LRA setting; N / 2 conjugate pairs per channel), init "lin"
    (S4D-Lin) or "inv" (S4D-Inv), the log-uniform dt range at init, n_ssm copies of (A, B)
    (None: one per channel; 1: tied, S4's LRA configs), dt_transform "exp" or "softplus",
    conv_dropout (untied, before the GELU: S4's FFTConv dropout), and the layer's dropout
    after GELU (the config's attention_dropout_rate: the dropout inside the mixer; S4D's
    `dropout`)."""
    del num_heads, max_len  # one SSM per channel; the kernel is computed for each L
    return S4D(dim=dim, causal=causal, d_state=d_state, init=init, dt_min=dt_min,
               dt_max=dt_max, dropout=attention_dropout, rngs=rngs, n_ssm=n_ssm,
               dt_transform=dt_transform, conv_dropout=conv_dropout)


# ----------------------------------------------------------------------------- lru


def _combine(left, right):
    """Composition of two steps x -> a x + b (left first): the scan's associative op."""
    a_l, b_l = left
    a_r, b_r = right
    return a_r * a_l, a_r * b_l + b_r


def linear_scan(lam_N: jax.Array, bu_BxLxN: jax.Array, reverse: bool = False) -> jax.Array:
    """x_t = lam o x_{t-1} + bu_t from x_{-1} = 0 (or from the end: x_t = lam o x_{t+1}
    + bu_t), every t, by `jax.lax.associative_scan` (O(log L) depth)."""
    lam_BxLxN = jnp.broadcast_to(lam_N, bu_BxLxN.shape)
    _, x_BxLxN = jax.lax.associative_scan(_combine, (lam_BxLxN, bu_BxLxN),
                                          reverse=reverse, axis=1)
    return x_BxLxN


def state_after(lam_N: jax.Array, bu_BxLxN: jax.Array, pos_B: jax.Array) -> jax.Array:
    """The causal scan's state after each row's first pos_B inputs (zero for none): a
    prefill's cache (lru, s5)."""
    x_BxN = decoding.row_at(linear_scan(lam_N, bu_BxLxN), jnp.maximum(pos_B - 1, 0))
    return jnp.where((pos_B > 0)[:, None], x_BxN, 0.0)


class LRU(nnx.Module):
    """The LRU layer (module docstring); `__call__` is the associative-scan form."""

    def __init__(self, *, dim: int, causal: bool, d_state: int, r_min: float, r_max: float,
                 max_phase: float, dropout: float, rngs: nnx.Rngs):
        if d_state <= 0:
            raise ValueError(f"lru: d_state must be positive, got {d_state}")
        if not 0.0 <= r_min <= r_max < 1.0:
            raise ValueError(f"lru: need 0 <= r_min <= r_max < 1, got {r_min}, {r_max}")
        if max_phase <= 0:
            raise ValueError(f"lru: max_phase must be positive, got {max_phase}")
        self.causal = causal
        self.d_state = d_state

        # |lambda|^2 uniform in [r_min^2, r_max^2] (uniform on the ring's area), phase
        # uniform in [0, max_phase]: the paper's nu_init and theta_init.
        def nu_init(key, shape, dtype=jnp.float32):
            u = jax.random.uniform(key, shape, dtype)
            return jnp.log(-0.5 * jnp.log(u * (r_max**2 - r_min**2) + r_min**2))

        def theta_init(key, shape, dtype=jnp.float32):
            return jnp.log(max_phase * jax.random.uniform(key, shape, dtype))

        ssm = dict(rngs=rngs, no_weight_decay=True, param_group="ssm",  # minimal-LRU's "ssm"
                   keep_float32=True)
        self.nu_log = layers.param(nu_init, (None,), (d_state,), **ssm)
        self.theta_log = layers.param(theta_init, (None,), (d_state,), **ssm)
        # gamma = sqrt(1 - |lambda|^2) of the initial lambda, then a parameter of its own.
        modulus2 = jnp.exp(-2.0 * jnp.exp(_f32(self.nu_log)))
        self.gamma_log = layers.param(
            lambda key, shape, dtype: 0.5 * jnp.log(1.0 - modulus2), (None,), (d_state,),
            **ssm)
        b_init = _normal(1.0 / math.sqrt(2 * dim))  # glorot for a complex matrix
        self.b_re = layers.param(b_init, (None, "embed"), (d_state, dim), **ssm)
        self.b_im = layers.param(b_init, (None, "embed"), (d_state, dim), **ssm)
        directions = 1 if causal else 2  # S5's bidirectional form: a C per direction
        c_init = _normal(1.0 / math.sqrt(d_state))
        self.c_re = layers.param(c_init, (None, "embed", None), (directions, dim, d_state),
                                 rngs=rngs, keep_float32=True)
        self.c_im = layers.param(c_init, (None, "embed", None), (directions, dim, d_state),
                                 rngs=rngs, keep_float32=True)
        self.d = layers.param(_normal(1.0), ("embed",), (dim,), rngs=rngs)
        self.head = _Head(dim, exact_gelu=False, dropout=dropout, rngs=rngs)

    def lam(self) -> jax.Array:
        """lambda (N complex64), |lambda| = exp(-exp(nu_log)) < 1."""
        return jnp.exp(jax.lax.complex(-jnp.exp(_f32(self.nu_log)),
                                       jnp.exp(_f32(self.theta_log))))

    def b_norm(self) -> jax.Array:
        """B o gamma (N x H complex64)."""
        return (jax.lax.complex(_f32(self.b_re), _f32(self.b_im))
                * jnp.exp(_f32(self.gamma_log))[:, None])

    def c(self) -> jax.Array:
        return jax.lax.complex(_f32(self.c_re), _f32(self.c_im))  # directions x H x N

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        u_BxLxH = _zero_padded(x_BxLxD.astype(jnp.float32), padding_mask)
        bu_BxLxN = jnp.einsum("blh,nh->bln", u_BxLxH.astype(jnp.complex64), self.b_norm())
        lam_N, c_CxHxN = self.lam(), self.c()
        read_BxLxH = jnp.einsum("bln,hn->blh", linear_scan(lam_N, bu_BxLxN), c_CxHxN[0])
        if not self.causal:
            read_BxLxH = read_BxLxH + jnp.einsum(
                "bln,hn->blh", linear_scan(lam_N, bu_BxLxN, reverse=True), c_CxHxN[1])
        y_BxLxH = jnp.real(read_BxLxH) + _f32(self.d) * u_BxLxH
        return self.head(y_BxLxH, deterministic).astype(x_BxLxD.dtype)

    # Decoding, form recurrent_state: the N complex state x_t, y = Re(C x_t) + D u_t.
    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        del max_len  # the state never grows with the position
        _check_causal_form(self)
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "x": jnp.zeros((batch, self.d_state, 2), jnp.float32)}

    def prefill(self, cache, x_BxLxD, padding_mask):
        """The scan's outputs and its state at row b's last real token (one parallel
        call: the scan computes every state; zero for an empty prompt)."""
        del cache
        _check_causal_form(self)
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask)
        batch, length, _ = x_BxLxD.shape
        pos_B = decoding.lengths_of(padding_mask, batch, length)
        u_BxLxH = _zero_padded(x_BxLxD.astype(jnp.float32), padding_mask)
        bu_BxLxN = jnp.einsum("blh,nh->bln", u_BxLxH.astype(jnp.complex64), self.b_norm())
        return y_BxLxD, {"pos": pos_B, "x": _pair(state_after(self.lam(), bu_BxLxN, pos_B))}

    def step(self, cache, x_BxD):
        _check_causal_form(self)
        u_BxH = x_BxD.astype(jnp.float32)
        state_BxN = (self.lam() * _complex(cache["x"])
                     + jnp.einsum("bh,nh->bn", u_BxH.astype(jnp.complex64), self.b_norm()))
        y_BxH = (jnp.real(jnp.einsum("bn,hn->bh", state_BxN, self.c()[0]))
                 + _f32(self.d) * u_BxH)
        return (self.head(y_BxH).astype(x_BxD.dtype),
                {"pos": cache["pos"] + 1, "x": _pair(state_BxN)})


@registry.register("lru", capabilities=registry.Capabilities(
    description="LRU: complex diagonal linear recurrence lambda = exp(-exp(nu) + i exp("
    "theta)) (ring init, gamma normalisation) by associative scan, Re(C x) + D u, GELU + "
    "GLU; causal=False adds a reverse scan read by a second C (S5's bidirectional form)",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    receptive_field="global", pos_emb="none", test_hparams={"d_state": 16},
    rotary_refusal=_NO_PRODUCTS))
def build_lru(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
              d_state: int = 256, r_min: float = 0.9, r_max: float = 0.999,
              max_phase: float = 2 * math.pi, attention_dropout: float = 0.0) -> LRU:
    """d_state N complex states (256), |lambda| ring [r_min, r_max] (0.9, 0.999: the
    paper's LRA ring), max_phase (2 pi; the paper narrows it, to pi / 10, for some LRA
    tasks), and the layer's dropout after GELU (the config's attention_dropout_rate)."""
    del num_heads, max_len  # one recurrence over all channels, any length
    return LRU(dim=dim, causal=causal, d_state=d_state, r_min=r_min, r_max=r_max,
               max_phase=max_phase, dropout=attention_dropout, rngs=rngs)
