"""S5, "Simplified State Space Layers for Sequence Modeling" (Smith, Warrington and
Linderman, ICLR 2023): `s5`.

One MIMO state-space model over all H = dim channels (S4D runs one per channel), with a
diagonal complex state matrix, computed by a parallel scan. As lindermanlab/S5
(`s5/ssm.py` S5SSM and apply_ssm, `s5/ssm_init.py`, `s5/layers.py` SequenceLayer,
`s5/train.py` for the block initialisation; commit 3c18fdb):
  HiPPO-N, per block of N = P / J states: S = A_LegS + p p^T with p_n = sqrt(n + 1/2)
      (the normal part of HiPPO-LegS, `make_DPLR_HiPPO`); S = -1/2 I + a skew-symmetric
      matrix, so eigh(-i S) gives S = V diag(-1/2 + i w) V^H with V unitary.
  Conjugate symmetry (S5's conj_sym): the eigenvalues come in conjugate pairs, and eigh's
      ascending order puts the N / 2 with w < 0 first: those are kept, V_b = V[:, :N/2].
      Lambda = those N / 2 eigenvalues repeated over the J blocks (P / 2 complex states),
      V = blockdiag(V_b, ..., V_b) (P x P / 2), V^-1 = V^H.
  B~ = V^H B (P / 2 x H), B real P x H lecun-normal (fan_in P) at init (`init_VinvB`).
  C~ = C V (H x P / 2), C complex H x P, re and im drawn by `c_init` (`init_CV`):
      "trunc_standard_normal" (truncated normal of variance 1 / P: lecun_normal per row,
      despite the name), "lecun_normal" (variance 1 / (P H)), or "complex_normal"
      (C~ itself ~ CN(0, 1), V not applied).
  Delta = exp(log_step), one step per state, log_step uniform in [log dt_min, log dt_max].
  ZOH: Lambda_bar = exp(Delta Lambda), B_bar = (Lambda_bar - 1) / Lambda * B~;
      bilinear: Lambda_bar = (1 + Delta Lambda / 2) / (1 - Delta Lambda / 2),
      B_bar = Delta / (1 - Delta Lambda / 2) * B~.
  x_t = Lambda_bar o x_{t-1} + B_bar u_t (jax.lax.associative_scan over the sequence)
  y_t = 2 Re(C~ x_t) + D o u_t    (2 Re: the dropped conjugate half)
  clip_eigs: Re Lambda is clipped at -1e-4 where it is used (S5's option, recommended by
      its docstring for autoregressive tasks: every state decays, whatever training does).
Non-causal (causal=False), S5's `bidirectional=True`: a second scan of the same
(Lambda_bar, B_bar u) from the end, x'_t = Lambda_bar o x'_{t+1} + B_bar u_t (so x'_t
includes u_t), read by a second C~: y_t = 2 Re(C~1 x_t + C~2 x'_t) + D o u_t (S5
concatenates the states and [C1, C2]: the same sum).
Then the activation of S5's LRA scripts, GELU (flax's tanh form), dropout and a gate
W g + b (one Linear(H, H)):
  half_glu1: g = drop(gelu(y)), out = drop(g * sigmoid(W g + b))
  half_glu2: g = drop(gelu(y)), out = drop(y * sigmoid(W g + b))    (the gate only)
with one dropout mask for every position (S5's broadcast over time), drawn per use.

Defaults are run_train.py's: P = 256 (ssm_size_base), J = 8, C "trunc_standard_normal",
half_glu1, ZOH, dt in [1e-3, 1e-1], no clipping (for causal=True, clipping: see
build_s5). Its LRA scripts (bin/run_experiments/run_lra_*.sh), as P / J, C init and
activation: listops 16 / 8, lecun_normal, half_glu2; imdb 192 / 12, lecun_normal,
half_glu2; aan 256 / 16, trunc_standard_normal, half_glu1; cifar 384 / 3, lecun_normal,
half_glu1, clip_eigs; pathfinder 256 / 8, trunc_standard_normal, half_glu1; pathx
256 / 16, complex_normal, half_glu1, dt_min 1e-4. All are bidirectional and conj_sym.

The mixer is S5's SequenceLayer without its norm and residual (S5's LRA scripts: pre-
BatchNorm); the block provides both (pre-LN by default, with a channel MLP after it as
for s4d and lru; block.ffn=False is S5's layer, the mixer alone; models/blocks.py).
The gate W is xavier-uniform with zero bias as every projection here (S5: flax's
Dense, lecun-normal); everything else is S5's init. Differences from S5 beyond that:
log_step is drawn in one call (S5 splits a key per state: the same distribution, other
draws); padded inputs are zeroed before the scans (S5 scans them; its padding is at the
end, which its reverse scan then reads), so no padded position reaches a real one in
either direction. No positions are added (Capabilities.pos_emb "none").

Optimiser groups (s5/train_helpers.py create_train_state). S5 trains group "ssm" with Adam
at ssm_lr_base and no weight decay, everything else with AdamW at lr_factor * ssm_lr_base
and weight_decay; its `opt_config` says which parameters are "ssm": "standard" (default;
imdb, aan, pathfinder): Lambda_re, Lambda_im, B, log_step; "BfastandCdecay" (listops,
cifar): Lambda_re, Lambda_im, log_step (B with the rest); "BandCdecay" (pathx): the same,
B at the ssm rate but decayed; `dt_global=True` (imdb, aan) moves log_step to the rest.
Here lambda_re and lambda_im carry `param_group="ssm"`, B `param_group="ssm_b"` and
log_step `param_group="ssm_step"` (lra.training.optim), so each opt_config is a setting of the
groups (configs/presets.py PARAM_GROUPS, per task): "standard" gives all three lr_scale
1 / lr_factor and weight_decay 0; "BfastandCdecay" gives ssm_b the config's rate and
decay; "BandCdecay" gives ssm_b 1 / lr_factor with the config's decay; dt_global leaves
ssm_step to the config's rate and decay. C, D and the gate train with the rest.
Decoding (the causal form, "recurrent_state"): the cache holds x_t, P / 2 complex numbers
per row as float32 (re, im) pairs; a step is the recurrence above.
Numerics: float32 parameters and inputs, complex64 inside; with Re Lambda < 0 every power
of Lambda_bar decays, so L = 16384 is finite at init (and always with clip_eigs).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import decoding, layers, registry
from models.mixers.ssm import (_NO_PRODUCTS, _f32, _check_causal_form, _complex, _pair,
                               _zero_padded, linear_scan, state_after)

C_INITS = ("trunc_standard_normal", "lecun_normal", "complex_normal")
DISCRETIZATIONS = ("zoh", "bilinear")
ACTIVATIONS = ("half_glu1", "half_glu2")
CLIP_RE = -1e-4  # S5's clip_eigs bound on Re Lambda


@functools.lru_cache(maxsize=None)
def hippo_n(size: int) -> tuple[np.ndarray, np.ndarray]:
    """HiPPO-N of `size` states, diagonalised (float64, host numpy): the eigenvalues
    (size complex, eigh's ascending imaginary parts) and the unitary eigenvectors V
    (columns), S5's `make_DPLR_HiPPO`. Cached (read-only arrays): every layer of a model
    has the same, and eigh of 256 states takes most of a second."""
    q = np.sqrt(1.0 + 2.0 * np.arange(size))
    legs = -(np.tril(np.outer(q, q)) - np.diag(np.arange(size)))  # HiPPO-LegS A
    p = np.sqrt(np.arange(size) + 0.5)
    normal = legs + np.outer(p, p)  # -1/2 on the diagonal, skew-symmetric elsewhere
    # eigh reads one triangle of the Hermitian -i S (the -1/2 would be its imaginary
    # diagonal, which eigh ignores); the real part is the diagonal's mean, as S5.
    imag, v = np.linalg.eigh(normal * -1j)
    lam = np.mean(np.diagonal(normal)) + 1j * imag
    lam.flags.writeable = v.flags.writeable = False
    return lam, v


def block_init(d_state: int, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(Lambda, V): the P / 2 kept eigenvalues (complex128) and the block-diagonal
    P x P / 2 eigenvectors, HiPPO-N of P / J states on each of the J blocks."""
    size = d_state // blocks
    lam, v = hippo_n(size)
    lam, v = lam[:size // 2], v[:, :size // 2]  # conj_sym: one of each conjugate pair
    return np.tile(lam, blocks), np.kron(np.eye(blocks), v)


class _GatedHead(nnx.Module):
    """S5's half_glu1 / half_glu2 after its SSM (module docstring)."""

    def __init__(self, dim: int, *, activation: str, dropout: float, rngs: nnx.Rngs):
        self.activation = activation
        self.dropout = nnx.Dropout(dropout, broadcast_dims=(-2,), rngs=rngs)
        self.gate = layers.dense(dim, dim, ("embed", "mlp"), rngs=rngs)

    def __call__(self, y: jax.Array, deterministic: bool = True) -> jax.Array:
        g = self.dropout(jax.nn.gelu(y, approximate=True), deterministic=deterministic)
        out = (g if self.activation == "half_glu1" else y) * jax.nn.sigmoid(self.gate(g))
        return self.dropout(out, deterministic=deterministic)


class S5(nnx.Module):
    """The S5 layer (module docstring); `__call__` is the associative-scan form."""

    def __init__(self, *, dim: int, causal: bool, d_state: int, blocks: int, dt_min: float,
                 dt_max: float, c_init: str, discretization: str, activation: str,
                 clip_eigs: bool, dropout: float, rngs: nnx.Rngs):
        if blocks <= 0 or d_state <= 0 or d_state % blocks or (d_state // blocks) % 2:
            raise ValueError(
                f"s5: d_state must be a positive multiple of blocks whose blocks have an "
                f"even size (HiPPO-N per block, half of each kept: conjugate pairs), got "
                f"d_state={d_state}, blocks={blocks}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"s5: need 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
        for name, value, allowed in (("c_init", c_init, C_INITS),
                                     ("discretization", discretization, DISCRETIZATIONS),
                                     ("activation", activation, ACTIVATIONS)):
            if value not in allowed:
                raise ValueError(f"s5: {name} must be one of {allowed}, got {value!r}")
        self.causal = causal
        self.half = d_state // 2
        self.discretization = discretization
        self.clip_eigs = clip_eigs
        lam_init, v_PxN = block_init(d_state, blocks)
        v_PxN = jnp.asarray(v_PxN, jnp.complex64)
        log_lo, log_hi = math.log(dt_min), math.log(dt_max)

        def constant(value):
            return lambda key, shape, dtype=jnp.float32: jnp.asarray(value, dtype)

        def b_init(key, shape, dtype=jnp.float32):
            b_PxH = jax.nn.initializers.lecun_normal()(key, (d_state, dim), dtype)
            return _pair(v_PxN.conj().T @ b_PxH.astype(jnp.complex64))  # V^-1 B

        def c_one(key):
            if c_init == "complex_normal":  # C~ drawn directly, re and im variance 1/2
                return math.sqrt(0.5) * jax.random.normal(key, (dim, self.half, 2))
            # trunc_standard_normal: fan_in P per row (H a batch axis); lecun_normal over
            # the whole H x P x 2 array: fan_in P H, as S5 draws them.
            batch = (0,) if c_init == "trunc_standard_normal" else ()
            draw = jax.nn.initializers.variance_scaling(
                1.0, "fan_in", "truncated_normal", batch_axis=batch)
            c_HxP = _complex(draw(key, (dim, d_state, 2), jnp.float32))
            return _pair(c_HxP @ v_PxN)  # C V

        def c_init_fn(key, shape, dtype=jnp.float32):
            return jnp.stack([c_one(k) for k in jax.random.split(key, shape[0])])

        def log_step_init(key, shape, dtype=jnp.float32):
            return jax.random.uniform(key, shape, dtype, log_lo, log_hi)

        # Groups, not no_weight_decay marks: whether B decays depends on S5's opt_config.
        ssm = dict(rngs=rngs, param_group="ssm", keep_float32=True)
        self.lambda_re = layers.param(constant(lam_init.real), (None,), (self.half,), **ssm)
        self.lambda_im = layers.param(constant(lam_init.imag), (None,), (self.half,), **ssm)
        self.b = layers.param(b_init, (None, "embed", None), (self.half, dim, 2),
                              rngs=rngs, param_group="ssm_b", keep_float32=True)
        # Its own group: S5's dt_global (imdb, aan) trains log_step with the rest.
        self.log_step = layers.param(log_step_init, (None,), (self.half,), rngs=rngs,
                                     param_group="ssm_step", keep_float32=True)
        directions = 1 if causal else 2  # S5's bidirectional C1, C2
        self.c = layers.param(c_init_fn, (None, "embed", None, None),
                              (directions, dim, self.half, 2), rngs=rngs, keep_float32=True)
        self.d = layers.param(lambda key, shape, dtype=jnp.float32:
                              jax.random.normal(key, shape, dtype), ("embed",), (dim,),
                              rngs=rngs)
        self.head = _GatedHead(dim, activation=activation, dropout=dropout, rngs=rngs)

    def discretised(self) -> tuple[jax.Array, jax.Array]:
        """(Lambda_bar P/2, B_bar P/2 x H), complex64."""
        re = _f32(self.lambda_re)
        if self.clip_eigs:
            re = jnp.minimum(re, CLIP_RE)
        lam = jax.lax.complex(re, _f32(self.lambda_im))
        step = jnp.exp(_f32(self.log_step))
        b_NxH = _complex(_f32(self.b))
        if self.discretization == "zoh":
            lam_bar = jnp.exp(step * lam)
            return lam_bar, ((lam_bar - 1.0) / lam)[:, None] * b_NxH
        inv = 1.0 / (1.0 - step / 2.0 * lam)  # bilinear
        return inv * (1.0 + step / 2.0 * lam), (inv * step)[:, None] * b_NxH

    def _inputs(self, x_BxLxD, padding_mask):
        """(Lambda_bar, u, B_bar u): the inputs with padded positions zeroed, and what
        each adds to the state."""
        u_BxLxH = _zero_padded(x_BxLxD.astype(jnp.float32), padding_mask)
        lam_bar, b_NxH = self.discretised()
        return lam_bar, u_BxLxH, jnp.einsum("blh,nh->bln", u_BxLxH.astype(jnp.complex64),
                                            b_NxH)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        lam_bar, u_BxLxH, bu_BxLxN = self._inputs(x_BxLxD, padding_mask)
        c_CxHxN = _complex(_f32(self.c))
        read_BxLxH = jnp.einsum("bln,hn->blh", linear_scan(lam_bar, bu_BxLxN), c_CxHxN[0])
        if not self.causal:
            read_BxLxH = read_BxLxH + jnp.einsum(
                "bln,hn->blh", linear_scan(lam_bar, bu_BxLxN, reverse=True), c_CxHxN[1])
        y_BxLxH = 2.0 * jnp.real(read_BxLxH) + _f32(self.d) * u_BxLxH
        return self.head(y_BxLxH, deterministic).astype(x_BxLxD.dtype)

    # Decoding, form recurrent_state: the P/2 complex state x_t, y = 2 Re(C~ x_t) + D u_t.
    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        del max_len  # the state never grows with the position
        _check_causal_form(self)
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "x": jnp.zeros((batch, self.half, 2), jnp.float32)}

    def prefill(self, cache, x_BxLxD, padding_mask):
        """The scan's outputs and its state at row b's last real token (one parallel
        call: the scan computes every state; zero for an empty prompt)."""
        del cache
        _check_causal_form(self)
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask)
        batch, length, _ = x_BxLxD.shape
        pos_B = decoding.lengths_of(padding_mask, batch, length)
        lam_bar, _, bu_BxLxN = self._inputs(x_BxLxD, padding_mask)
        return y_BxLxD, {"pos": pos_B, "x": _pair(state_after(lam_bar, bu_BxLxN, pos_B))}

    def step(self, cache, x_BxD):
        _check_causal_form(self)
        u_BxH = x_BxD.astype(jnp.float32)
        lam_bar, b_NxH = self.discretised()
        state_BxN = (lam_bar * _complex(cache["x"])
                     + jnp.einsum("bh,nh->bn", u_BxH.astype(jnp.complex64), b_NxH))
        y_BxH = (2.0 * jnp.real(jnp.einsum("bn,hn->bh", state_BxN,
                                           _complex(_f32(self.c))[0]))
                 + _f32(self.d) * u_BxH)
        return (self.head(y_BxH).astype(x_BxD.dtype),
                {"pos": cache["pos"] + 1, "x": _pair(state_BxN)})


@registry.register("s5", capabilities=registry.Capabilities(
    description="S5: one MIMO diagonal complex SSM over all channels (HiPPO-N block "
    "eigenvectors, conjugate-symmetric, per-state log step, ZOH) by associative scan, "
    "2 Re(C x) + D u, GELU + half GLU; causal=False adds S5's reverse scan and second C",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    receptive_field="global", pos_emb="none", test_hparams={"d_state": 8, "blocks": 2},
    rotary_refusal=_NO_PRODUCTS))
def build_s5(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
             d_state: int = 256, blocks: int = 8, dt_min: float = 1e-3,
             dt_max: float = 1e-1, c_init: str = "trunc_standard_normal",
             discretization: str = "zoh", activation: str = "half_glu1",
             clip_eigs: bool | None = None, attention_dropout: float = 0.0) -> S5:
    """d_state P (S5's ssm_size: P / 2 complex states are kept), blocks J (HiPPO-N on
    each of J blocks of P / J), the log-uniform step range at init, c_init (C_INITS),
    discretization ("zoh" or "bilinear"), activation ("half_glu1" or "half_glu2"),
    clip_eigs (None: clipped for causal=True, S5's advice for autoregressive use, not for
    the bidirectional form, S5's default), and the dropout after GELU and after the gate
    (the config's attention_dropout_rate; S5's p_dropout). Defaults: run_train.py's."""
    del num_heads, max_len  # one MIMO SSM over all channels, any length
    return S5(dim=dim, causal=causal, d_state=d_state, blocks=blocks, dt_min=dt_min,
              dt_max=dt_max, c_init=c_init, discretization=discretization,
              activation=activation, clip_eigs=causal if clip_eigs is None else clip_eigs,
              dropout=attention_dropout, rngs=rngs)
