"""Mamba-2's state space duality (Dao and Gu 2024, "Transformers are SSMs"): `mamba2`.

Per head, a selective SSM whose decay is one scalar per step:

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T        (h: P x N)
    y_t = h_t C_t + D x_t

with dt_t = softplus(W_dt u_t + dt_bias) and A = -exp(A_log) per head, and B_t, C_t (N wide)
shared by the heads (one group). Dually, y = (L o C B^T) (dt x) + D x with
L_ij = exp(sum_{j<s<=i} dt_s A): linear attention with queries C, keys B, values dt x and
a data-dependent scalar decay, which is how it is chunked.

The block, as mamba_ssm's `Mamba2` (and fla's) defaults: bias-free input projections to
z (the gate), x, B, C (mamba_ssm's one in_proj, kept here as four named ones: `gate`,
`value`, `key`, `query`, and `dt`), a depthwise causal convolution of 4 taps with bias
over [x, B, C] followed by SiLU, the SSD, y = RMSNorm(y * SiLU(z)) * w (the norm after the
gate, over all expand * dim channels, eps 1e-5), a bias-free `out` projection. expand = 2,
state N = 128, A ~ U(1, 16), dt log-uniform in [1e-3, 1e-1] (floor 1e-4), D = 1 per head.
Heads are the config's num_heads, P = expand * dim / num_heads (mamba_ssm fixes P = 64 and
derives the heads). Projections are xavier-uniform as every variant here (mamba_ssm:
PyTorch's default); the convolution PyTorch's Conv1d default, U(-1/sqrt(taps), ..).

Three forms, equal (tests/models/test_ssd.py): `ssd_reference` (a scan over time, the
oracle), `chunk_ssd` (what the layer runs: exact C x C blocks inside a chunk with
exp(b_i - b_j) masked before exp, a scan over the chunks carrying h; every exponent
<= 0), and `ssd_step` (decoding, "recurrent_state": the cache holds h and the
convolution's last conv_size - 1 inputs).

attention_impl="pallas": the SSD is decayed linear attention with queries C, keys B, values
dt x and a scalar decay exp(dt A) per head (G = 1), so the layer's forward (__call__, both
directions) runs `chunk_ssd`'s output through the Pallas kernels of
`models.kernels.decayed_attention` (Triton on GPU, Mosaic on TPU, interpreted on CPU; their
own chunk size, chunk_size applies to the XLA form); the D skip, convolution and gated norm
stay in XLA. allow_neg_eigval (Grazzi et al. 2025's Mamba: the decay 2 exp(dt A) - 1,
in (-1, 1), so a state can flip sign: parity) runs in the XLA forms only, with the decay's
sign beside log |a| (`chunk_ssd`'s docstring). Decoding's `prefill` needs h_L, which the
kernels do not return: it stays on `chunk_ssd` under either implementation.

causal=False: a forward and a backward scan summed before the gated norm, as DeltaNet
here (models/attention/delta.py): the backward one is the causal SSD on the reversed
sequence, with its own convolution, dt_bias, A_log and D; projections, norm and `out`
are shared. Padded positions get dt = 0 (no write, no decay) and zero convolution inputs.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention.delta import CONV_SIZE, NORM_EPS, causal_conv, conv_init, dt_bias_init
from models.attention.linear_scan import _pad_to_chunks, backend_chunk
from models.kernels.decayed_attention import decayed_linear_attention

DEFAULT_CHUNK = 256  # mamba_ssm's chunk size
CPU_CHUNK = 32  # the default where the CPU builds the layer (results/cpu/chunk_sizes.md)
STATE_SIZE = 128  # mamba_ssm's d_state
A_INIT_RANGE = (1.0, 16.0)  # mamba_ssm: A ~ U(1, 16), A_log = log A
NEG_FLOOR = 1e-20  # allow_neg_eigval: |a| below this is taken as this (log and its gradient)
IMPLS = ("dense", "pallas", "pallas_mosaic")  # chunk_ssd (XLA), or the decayed kernels


# ----------------------------------------------------------------------------- core math


def ssd_step(h_BxHxPxN: jax.Array, x_BxHxP: jax.Array, log_a_BxH: jax.Array,
             b_BxHxN: jax.Array, c_BxHxN: jax.Array, sign_BxH: jax.Array | None = None
             ) -> tuple[jax.Array, jax.Array]:
    """One token: h <- a h + x b^T, y = h c with a = sign exp(log_a) (x already times dt,
    log_a = dt A, or log |a| with a sign: allow_neg_eigval)."""
    a_BxH = jnp.exp(log_a_BxH) if sign_BxH is None else sign_BxH * jnp.exp(log_a_BxH)
    h_BxHxPxN = (a_BxH[..., None, None] * h_BxHxPxN
                 + jnp.einsum("bhp,bhn->bhpn", x_BxHxP, b_BxHxN))
    return jnp.einsum("bhpn,bhn->bhp", h_BxHxPxN, c_BxHxN), h_BxHxPxN


def _f32(*arrays):
    return tuple(a.astype(jnp.float32) for a in arrays)


@jax.jit
def ssd_reference(x_BxHxLxP: jax.Array, log_a_BxHxL: jax.Array, b_BxHxLxN: jax.Array,
                  c_BxHxLxN: jax.Array, sign_BxHxL: jax.Array | None = None
                  ) -> tuple[jax.Array, jax.Array]:
    """The recurrence step by step: y (BxHxLxP, float32, without the D skip) and h_L
    (BxHxPxN). x already times dt, log_a = dt A <= 0 (mamba_ssm's ssd_minimal inputs);
    with `sign` (+-1, allow_neg_eigval) the decay is sign exp(log_a)."""
    x, log_a, b, c = _f32(x_BxHxLxP, log_a_BxHxL, b_BxHxLxN, c_BxHxLxN)
    sign = jnp.ones_like(log_a) if sign_BxHxL is None else sign_BxHxL.astype(jnp.float32)

    def step(h, xs):
        y, h = ssd_step(h, *xs)
        return h, y

    h0 = jnp.zeros(x.shape[:2] + (x.shape[-1], b.shape[-1]), jnp.float32)
    h_final, y_LxBxHxP = jax.lax.scan(step, h0, tuple(jnp.moveaxis(a, 2, 0)
                                                       for a in (x, log_a, b, c, sign)))
    return jnp.moveaxis(y_LxBxHxP, 0, 2), h_final


@functools.partial(jax.jit, static_argnames=("chunk_size",))
def chunk_ssd(x_BxHxLxP: jax.Array, log_a_BxHxL: jax.Array, b_BxHxLxN: jax.Array,
              c_BxHxLxN: jax.Array, sign_BxHxL: jax.Array | None = None, *,
              chunk_size: int = DEFAULT_CHUNK) -> tuple[jax.Array, jax.Array]:
    """`ssd_reference`'s outputs and final state, chunk by chunk. Any L: the tail is
    zero-padded (x = 0, log_a = 0: no write, no decay), so h_L is the real positions'.
    The scan body is rematerialised: the backward pass keeps h at chunk boundaries.
    With `sign` (allow_neg_eigval) a product of decays over (j, i] is exp(b_i - b_j) times
    (-1)^(n_i - n_j), n the count of negative decays so far in the chunk: s_i s_j with
    s = (-1)^n, so every exponent stays <= 0 and the signs ride on the same terms."""
    x, log_a, b, c = _f32(x_BxHxLxP, log_a_BxHxL, b_BxHxLxN, c_BxHxLxN)
    batch, heads, length, p_dim = x.shape
    n_dim = b.shape[-1]
    chunk = max(1, min(chunk_size, length))
    lower_CxC = jnp.tril(jnp.ones((chunk, chunk), jnp.bool_))
    xs = (_pad_to_chunks(x, chunk), _pad_to_chunks(b, chunk), _pad_to_chunks(c, chunk),
          jnp.cumsum(_pad_to_chunks(log_a[..., None], chunk)[..., 0], axis=-1))
    if sign_BxHxL is None:
        s = jnp.ones(xs[3].shape, jnp.float32)
    else:  # s_i = (-1)^(negative decays in the chunk up to i); padding's sign is +1
        negative = _pad_to_chunks((sign_BxHxL < 0).astype(jnp.float32)[..., None], chunk)
        s = 1.0 - 2.0 * jnp.mod(jnp.cumsum(negative[..., 0], axis=-1), 2.0)
    xs = xs + (s,)

    @jax.checkpoint
    def body(h_BxHxPxN, xs):
        # cum: b_i, restarted per chunk; s_BxHxC its signs (all 1 without allow_neg_eigval)
        x_BxHxCxP, b_BxHxCxN, c_BxHxCxN, cum_BxHxC, s_BxHxC = xs
        diff_BxHxCxC = cum_BxHxC[..., :, None] - cum_BxHxC[..., None, :]
        # where() inside exp: above the diagonal the differences are positive (overflow).
        decay_BxHxCxC = (jnp.exp(jnp.where(lower_CxC, diff_BxHxCxC, -jnp.inf))
                         * s_BxHxC[..., :, None] * s_BxHxC[..., None, :])
        scores_BxHxCxC = jnp.einsum("bhin,bhjn->bhij", c_BxHxCxN, b_BxHxCxN) * decay_BxHxCxC
        from_start_BxHxC = s_BxHxC * jnp.exp(cum_BxHxC)
        y_BxHxCxP = (jnp.einsum("bhij,bhjp->bhip", scores_BxHxCxC, x_BxHxCxP)
                     + jnp.einsum("bhcn,bhpn->bhcp", c_BxHxCxN * from_start_BxHxC[..., None],
                                  h_BxHxPxN))
        to_end_BxHxC = s_BxHxC[..., -1:] * s_BxHxC * jnp.exp(cum_BxHxC[..., -1:] - cum_BxHxC)
        h_BxHxPxN = (from_start_BxHxC[..., -1][..., None, None] * h_BxHxPxN
                     + jnp.einsum("bhcp,bhcn->bhpn", x_BxHxCxP * to_end_BxHxC[..., None],
                                  b_BxHxCxN))
        return h_BxHxPxN, y_BxHxCxP

    h0 = jnp.zeros((batch, heads, p_dim, n_dim), jnp.float32)
    h_final, y_NxBxHxCxP = jax.lax.scan(body, h0, xs)
    n = y_NxBxHxCxP.shape[0]
    y_BxHxLxP = y_NxBxHxCxP.transpose(1, 2, 0, 3, 4).reshape(batch, heads, n * chunk, p_dim)
    return y_BxHxLxP[:, :, :length], h_final


# ----------------------------------------------------------------------------- modules


def a_log_init(key, shape, dtype=jnp.float32):
    """log A, A ~ U(1, 16) (mamba_ssm's Mamba2)."""
    return jnp.log(jax.random.uniform(key, shape, dtype, *A_INIT_RANGE))


class SSDDirection(nnx.Module):
    """One scan direction's own parameters: the convolution over [x, B, C] (with bias),
    dt_bias, A_log and D (mamba_ssm's names)."""

    def __init__(self, *, num_heads: int, channels: int, conv_size: int, rngs: nnx.Rngs,
                 neg_eigval: bool = False, decay: bool = True):
        self.channels = channels
        if conv_size:
            self.conv = layers.param(conv_init(conv_size), (None, None), (conv_size, channels),
                                     rngs=rngs)
            self.conv_bias = layers.param(conv_init(conv_size), (None,), (channels,), rngs=rngs)
        else:  # no convolution: a one-tap identity kernel and no bias, no parameter
            self.conv = self.conv_bias = None
        self.dt_bias = layers.param(dt_bias_init, ("heads",), (num_heads,), rngs=rngs,
                                    no_weight_decay=True, keep_float32=True)
        # decay=False (an ablation): A = 0, a = 1 at every step; A_log not built.
        self.a_log = (layers.param(a_log_init, ("heads",), (num_heads,), rngs=rngs,
                                   no_weight_decay=True, keep_float32=True)
                      if decay else None)
        self.d = layers.param(layers.ones, ("heads",), (num_heads,), rngs=rngs,
                              no_weight_decay=True, keep_float32=True)
        self.neg_eigval = neg_eigval

    def conv_kernel(self) -> tuple[jax.Array, jax.Array]:
        """The convolution's kernel WxC and bias C, float32 (identity and 0 without one)."""
        if self.conv is None:
            return jnp.ones((1, self.channels), jnp.float32), jnp.zeros((self.channels,))
        return self.conv[...].astype(jnp.float32), self.conv_bias[...].astype(jnp.float32)

    def steps(self, dt_raw_xH: jax.Array, real_x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """dt = softplus(logits + dt_bias) > 0 and log a = dt A <= 0, ...xH, float32; both 0
        where not `real` (a padded position neither writes nor decays)."""
        dt_xH = jax.nn.softplus(dt_raw_xH.astype(jnp.float32) + self.dt_bias[...])
        dt_xH = jnp.where(real_x[..., None], dt_xH, 0.0)
        if self.a_log is None:
            return dt_xH, jnp.zeros_like(dt_xH)
        return dt_xH, -jnp.exp(self.a_log[...].astype(jnp.float32)) * dt_xH

    def transition(self, dt_raw_xH: jax.Array, real_x: jax.Array):
        """dt, log |a| and the sign of a (None without neg_eigval), ...xH. allow_neg_eigval:
        a = 2 exp(dt A) - 1 in (-1, 1) (Grazzi et al. 2025's Mamba, automl/
        unlocking_state_tracking df8f840 flash-linear-attention_mod/fla/models/mamba_py/
        mamba_mod.py: deltaA * 2 - 1); padded positions keep a = 1 (dt 0)."""
        dt_xH, log_a_xH = self.steps(dt_raw_xH, real_x)
        if not self.neg_eigval:
            return dt_xH, log_a_xH, None
        a_xH = 2.0 * jnp.exp(log_a_xH) - 1.0
        # |a| floored: log 0 at a = 0 exactly (dt A = -log 2) has no gradient.
        return dt_xH, jnp.log(jnp.maximum(jnp.abs(a_xH), NEG_FLOOR)), jnp.where(a_xH < 0, -1.0, 1.0)


class Mamba2(nnx.Module):
    """The Mamba-2 block around the SSD (module docstring)."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, expand: int,
                 state_size: int, conv_size: int, chunk_size: int, norm_eps: float,
                 rngs: nnx.Rngs, attention_impl: str = "dense", neg_eigval: bool = False,
                 decay: bool = True):
        inner = expand * dim
        if num_heads <= 0 or inner % num_heads or state_size <= 0:
            raise ValueError(f"mamba2: expand * dim ({inner}) must be a positive multiple of "
                             f"num_heads ({num_heads}), state_size ({state_size}) positive")
        if chunk_size <= 0 or conv_size < 0:
            raise ValueError(f"chunk_size ({chunk_size}) must be positive and conv_size "
                             f"({conv_size}) >= 0 (0: no short convolution)")
        if attention_impl not in IMPLS:
            raise registry.RegistryError(
                f"attention_impl={attention_impl!r} is not available for mamba2; valid: "
                f"{', '.join(IMPLS)}")
        if neg_eigval and not decay:
            raise ValueError("mamba2: allow_neg_eigval maps the decay exp(dt A) to "
                             "2 exp(dt A) - 1; with decay=False (A = 0) that is 1 at every "
                             "step: choose one")
        if neg_eigval and attention_impl in ("pallas", "pallas_mosaic"):
            raise registry.RegistryError(
                "mamba2: allow_neg_eigval's signed decays are not in the Pallas "
                "decayed-attention kernels (log decays only); use attention_impl=dense")
        self.attention_impl = attention_impl
        self.num_heads, self.head_dim, self.state_size = num_heads, inner // num_heads, state_size
        self.causal, self.chunk_size, self.conv_size = causal, chunk_size, conv_size
        self.norm_eps = norm_eps
        proj = dict(use_bias=False, rngs=rngs)
        self.gate = layers.dense(dim, inner, ("embed", "qkv"), **proj)  # z
        self.value = layers.dense(dim, inner, ("embed", "qkv"), **proj)  # x
        self.key = layers.dense(dim, state_size, ("embed", None), **proj)  # B
        self.query = layers.dense(dim, state_size, ("embed", None), **proj)  # C
        self.dt = layers.dense(dim, num_heads, ("embed", "heads"), **proj)
        self.out = layers.dense(inner, dim, ("qkv", "embed"), **proj)
        self.norm_scale = layers.param(layers.ones, ("qkv",), (inner,), rngs=rngs)
        direction = dict(num_heads=num_heads, channels=inner + 2 * state_size,
                         conv_size=conv_size, rngs=rngs, neg_eigval=neg_eigval,
                         decay=decay)
        self.forward_scan = SSDDirection(**direction)
        # Its own convolution, as DeltaNet's backward scan here (delta.py says why).
        self.backward_scan = None if causal else SSDDirection(**direction)

    def conv_inputs(self, u_BxLxD: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """z (BxLxI), the convolution's input [x, B, C] (BxLx(I + 2N)), dt's logits BxLxH."""
        xbc = jnp.concatenate([self.value(u_BxLxD), self.key(u_BxLxD), self.query(u_BxLxD)], -1)
        return self.gate(u_BxLxD), xbc, self.dt(u_BxLxD)

    def ssd_inputs(self, xbc_BxLxC: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The convolution's SiLU output split: x (BxHxLxP), B and C (BxHxLxN)."""
        batch, length = xbc_BxLxC.shape[:2]
        inner = self.num_heads * self.head_dim
        x, b, c = jnp.split(xbc_BxLxC.astype(jnp.float32), [inner, inner + self.state_size], -1)
        x_BxHxLxP = x.reshape(batch, length, self.num_heads, -1).transpose(0, 2, 1, 3)
        shared = lambda t: jnp.broadcast_to(  # noqa: E731  (one group: B, C for every head)
            t[:, None], (batch, self.num_heads, length, self.state_size))
        return x_BxHxLxP, shared(b), shared(c)

    def scan(self, direction: SSDDirection, xbc_BxLxC, dt_raw_BxLxH, real_BxL,
             with_state: bool = True):
        """One direction: y + D x (BxHxLxP) and h_L. Padded positions get dt = 0. Without
        `with_state`, under attention_impl="pallas", the kernels give y and h_L is None."""
        w, bias = direction.conv_kernel()
        conv_BxLxC = causal_conv(xbc_BxLxC.astype(jnp.float32)[:, None], w[:, None])[:, 0]
        xbc = jax.nn.silu(conv_BxLxC + bias)
        x, b, c = self.ssd_inputs(xbc)
        dt_BxLxH, log_a_BxLxH, sign_BxLxH = direction.transition(dt_raw_BxLxH, real_BxL)
        dt_BxHxL, log_a_BxHxL = dt_BxLxH.transpose(0, 2, 1), log_a_BxLxH.transpose(0, 2, 1)
        sign_BxHxL = None if sign_BxLxH is None else sign_BxLxH.transpose(0, 2, 1)
        if self.attention_impl in ("pallas", "pallas_mosaic") and not with_state:
            # Queries C, keys B, values dt x, one log decay per head and position.
            form = "mosaic" if self.attention_impl == "pallas_mosaic" else "triton"
            y, h = decayed_linear_attention(c, b, x * dt_BxHxL[..., None],
                                            log_a_BxHxL[..., None], gpu_form=form), None
        else:
            y, h = chunk_ssd(x * dt_BxHxL[..., None], log_a_BxHxL, b, c, sign_BxHxL,
                             chunk_size=self.chunk_size)
        return y + direction.d[...][:, None, None] * x, h

    def finish(self, y_BxHxLxP: jax.Array, z_BxLxI: jax.Array) -> jax.Array:
        """RMSNorm(y * SiLU(z)) * w, then `out` (mamba_ssm's norm_before_gate=False)."""
        b, h, l, p = y_BxHxLxP.shape
        y = y_BxHxLxP.transpose(0, 2, 1, 3).reshape(b, l, h * p)
        y = y * jax.nn.silu(z_BxLxI.astype(jnp.float32))
        y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + self.norm_eps)
        return self.out((y * self.norm_scale[...]).astype(z_BxLxI.dtype))

    def forward(self, u_BxLxD, padding_mask, with_state: bool = True):
        """Outputs BxLxD, the forward scan's h_L (None without `with_state` under
        attention_impl="pallas") and the (masked) convolution inputs."""
        real_BxL = layers.valid_mask(padding_mask, *u_BxLxD.shape[:2])
        z, xbc, dt_raw = self.conv_inputs(u_BxLxD)
        xbc = jnp.where(real_BxL[..., None], xbc, 0.0)  # no window reads a padded input
        y, h = self.scan(self.forward_scan, xbc, dt_raw, real_BxL, with_state)
        if self.backward_scan is not None:
            y_back, _ = self.scan(self.backward_scan, jnp.flip(xbc, 1), jnp.flip(dt_raw, 1),
                                  jnp.flip(real_BxL, 1), with_state=False)
            y = y + jnp.flip(y_back, axis=2)
        return self.finish(y, z), h, xbc

    def __call__(self, u_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        del deterministic  # no dropout
        return self.forward(u_BxLxD, padding_mask, with_state=False)[0]

    # ------------------------------------------------------------------ decoding
    # "recurrent_state": h (BxHxPxN) and the convolution's last conv_size - 1 inputs.

    def _check_decodes(self) -> None:
        if not self.causal:
            raise decoding.DecodingError("Mamba2 was built with causal=False; only the causal "
                                         "form reads a state one token at a time")

    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        del max_len  # the state never grows with the position
        self._check_decodes()
        channels = self.num_heads * self.head_dim + 2 * self.state_size
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "h": jnp.zeros((batch, self.num_heads, self.head_dim, self.state_size)),
                "conv": jnp.zeros((batch, max(self.conv_size - 1, 0), channels))}

    def prefill(self, cache, u_BxLxD, padding_mask):
        """The parallel outputs of a right-padded prompt and the cache after each row's
        real tokens (h: the padded tail neither writes nor decays)."""
        del cache  # a prompt starts at position 0
        self._check_decodes()
        y_BxLxD, h, xbc_BxLxC = self.forward(u_BxLxD, padding_mask)
        pos_B = decoding.lengths_of(padding_mask, *u_BxLxD.shape[:2])
        return y_BxLxD, {"pos": pos_B, "h": h, "conv": self.conv_window(xbc_BxLxC, pos_B)}

    def conv_window(self, xbc_BxLxC, pos_B):
        """Row b's convolution window after a prompt: its inputs n_b - w .. n_b - 1 (zeros
        before the start), BxWxC."""
        w = max(self.conv_size - 1, 0)
        padded = jnp.pad(xbc_BxLxC.astype(jnp.float32), ((0, 0), (w, 0), (0, 0)))
        return jnp.take_along_axis(padded, (pos_B[:, None] + jnp.arange(w))[..., None], 1)

    def step_inputs(self, direction, cache, u_BxD):
        """One token's z, x, B, C (the convolution over the cached window) and raw dt, and
        the window after it."""
        z, xbc, dt_raw = self.conv_inputs(u_BxD[:, None])
        window_BxWxC = jnp.concatenate([cache["conv"], xbc.astype(jnp.float32)], axis=1)
        w_WxC, bias_C = direction.conv_kernel()
        conv_BxC = jnp.einsum("bwc,wc->bc", window_BxWxC, w_WxC)
        xbc = jax.nn.silu(conv_BxC + bias_C)[:, None]
        x, b, c = (t[:, :, 0] for t in self.ssd_inputs(xbc))
        return z, x, b, c, dt_raw, window_BxWxC[:, 1:]

    def step(self, cache, u_BxD):
        self._check_decodes()
        direction = self.forward_scan
        z, x, b, c, dt_raw, window = self.step_inputs(direction, cache, u_BxD)
        dt_BxH, log_a_BxH, sign_BxH = direction.transition(
            dt_raw[:, 0], jnp.ones(u_BxD.shape[:1], jnp.bool_))
        y_BxHxP, h = ssd_step(cache["h"], x * dt_BxH[..., None], log_a_BxH, b, c, sign_BxH)
        y_BxHxP = y_BxHxP + direction.d[...][:, None] * x
        y_BxD = self.finish(y_BxHxP[:, :, None], z)[:, 0]
        return y_BxD, {"pos": cache["pos"] + 1, "h": h, "conv": window}


@registry.register("mamba2", capabilities=registry.Capabilities(
    description="Mamba-2 SSD: scalar data-dependent decay per head, short conv, gated norm, "
                "chunked form (Dao and Gu 2024; XLA or attention_impl=pallas); causal=False "
                "sums a forward and a backward scan",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5, "state_size": 16},
    rotary_refusal="its C.B products are read through a recurrent state whose order gives "
    "positions (the paper adds no position embedding)",
    # mamba_ssm's and fla's Mamba-2 models add no position table to the token embeddings
    # (the depthwise convolution, conv_kernel 4 with bias, and the scan give positions).
    pos_emb="none", short_conv_hparam="conv_size"))
def build_mamba2(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                 expand: int = 2, state_size: int = STATE_SIZE, conv_size: int = CONV_SIZE,
                 chunk_size: int | None = None, norm_eps: float = NORM_EPS,
                 attention_impl: str = "dense", allow_neg_eigval: bool = False,
                 decay: bool = True) -> Mamba2:
    """mamba_ssm's Mamba2 defaults (expand 2, d_state 128, d_conv 4, chunk 256); the heads
    are the config's (head size expand * dim / num_heads). attention_impl: "dense"
    (chunk_ssd under XLA) or "pallas" (the decayed-attention kernels). allow_neg_eigval:
    the decay 2 exp(dt A) - 1 in (-1, 1) (Grazzi et al. 2025; XLA form only). chunk_size
    (the XLA form's) by default 256, or CPU_CHUNK where the CPU builds the layer (a MAD
    mini step 1.4 times faster than at 256 on a CPU core: results/cpu/chunk_sizes.md).
    decay=False (ours, an ablation): A = 0, so a = 1 at every step (A_log not built; dt
    still scales each input), the layer otherwise the same: a comparison changes the decay
    alone."""
    del max_len  # any length
    if chunk_size is None:
        chunk_size = backend_chunk(DEFAULT_CHUNK, CPU_CHUNK)
    return Mamba2(dim=dim, num_heads=num_heads, causal=causal, expand=expand,
                  state_size=state_size, conv_size=conv_size, chunk_size=chunk_size,
                  norm_eps=norm_eps, rngs=rngs, attention_impl=attention_impl,
                  neg_eigval=bool(allow_neg_eigval), decay=bool(decay))
