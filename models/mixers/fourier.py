"""FNet (Lee-Thorp et al. 2022): the `fnet` token mixer, Re(FFT_seq(FFT_hidden(x))).

No attention and (by default) no parameters: the sublayer is the real part of a 2D
discrete Fourier transform over the sequence and hidden axes.

Padding: a plain FFT over the padded length would mix padded positions into real
ones and make the result depend on how much padding a batch carries. Here each
example is transformed over its own length n (the last real position + 1, padded
positions inside zeroed), with Bluestein's chirp-z algorithm: a length-n DFT as a
convolution computed by FFTs of one static size M >= 2L - 1, so n may differ per
example and stay a traced value (O(L log L), jit/vmap friendly). A padded input
thus gives exactly what its unpadded prefix gives. Without a padding mask, the
transform is one `jnp.fft.fft` per axis.

Deviations from the paper, both for the pre-LN block this runs in (FNet is post-LN,
whose LayerNorm after the residual absorbs any scale):
- `norm="ortho"` (default) scales the 2D DFT by 1/sqrt(n * dim), so the sublayer
  preserves the input's norm; the paper's unnormalised transform (`norm="backward"`)
  would add outputs ~sqrt(n * dim) times larger than the residual stream.
- `gain=True` adds a learned per-channel output scale (init 1); off by default (the
  paper has none).
Not causal: every output sees every position.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry

NORMS = ("ortho", "backward")


def real_lengths(padding_mask_BxL: jax.Array) -> jax.Array:
    """Per example, the last real position + 1 (0 when nothing is real); int32 [B]."""
    length = padding_mask_BxL.shape[-1]
    pos_1xL = jnp.arange(1, length + 1, dtype=jnp.int32)[None]
    return jnp.max(jnp.where(padding_mask_BxL, pos_1xL, 0), axis=-1)


def dft_per_length(x_BxLxF: jax.Array, n_B: jax.Array) -> jax.Array:
    """X[b, k] = sum_{j < n_b} x[b, j] exp(-2 pi i j k / n_b) for k < n_b (0 for k >= n_b).

    Bluestein: jk = (j^2 + k^2 - (k - j)^2) / 2, so X = w * ((w * x) conv conj(w)) with
    the chirp w_m = exp(-i pi m^2 / n), a linear convolution done by FFTs of size M.
    Inputs at j >= n_b are ignored.
    """
    _, length, _ = x_BxLxF.shape
    size = 1 << max(0, (2 * length - 2).bit_length())  # power of two >= 2L - 1
    n_Bx1 = jnp.maximum(n_B, 1).astype(jnp.int32)[:, None]

    def chirp_angle(m: jax.Array) -> jax.Array:
        # pi m^2 / n, with m^2 reduced mod 2n in integers (exp(-i pi m^2/n) has that
        # period), so float32 keeps the phase exact for long sequences.
        return math.pi * ((m * m) % (2 * n_Bx1)).astype(jnp.float32) / n_Bx1

    pos_L = jnp.arange(length, dtype=jnp.int32)
    w_BxL = jnp.exp(-1j * chirp_angle(pos_L[None]))
    inside_BxL = pos_L[None] < n_B[:, None]
    a_BxLxF = jnp.where(inside_BxL[..., None], x_BxLxF * w_BxL[..., None], 0)
    # conj(w) at offsets -(L-1)..(L-1), stored circularly (offset -m at index M - m).
    idx_M = jnp.arange(size, dtype=jnp.int32)
    offset_M = jnp.minimum(idx_M, size - idx_M)
    b_BxM = jnp.exp(1j * chirp_angle(offset_M[None]))
    conv_BxMxF = jnp.fft.ifft(jnp.fft.fft(a_BxLxF, n=size, axis=1)
                              * jnp.fft.fft(b_BxM, axis=1)[..., None], axis=1)
    out_BxLxF = w_BxL[..., None] * conv_BxMxF[:, :length]
    return jnp.where(inside_BxL[..., None], out_BxLxF, 0)


class FourierMixer(nnx.Module):
    """Re(DFT over the sequence of DFT over the hidden axis)."""

    def __init__(self, *, dim: int, norm: str, gain: bool, rngs: nnx.Rngs):
        if norm not in NORMS:
            raise ValueError(f"fnet: unknown norm {norm!r}; valid: {', '.join(NORMS)}")
        self.norm = norm
        self.gain = layers.param(layers.ones, ("embed",), (dim,), rngs=rngs) if gain else None

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        del deterministic  # nothing random
        if padding_mask is None:
            y_BxLxD = jnp.fft.fft2(x_BxLxD, axes=(1, 2), norm=self.norm).real
        else:
            real_BxL = padding_mask.astype(jnp.bool_)
            x_BxLxD = jnp.where(real_BxL[..., None], x_BxLxD, 0.0)
            h_BxLxD = jnp.fft.fft(x_BxLxD, axis=-1, norm=self.norm)
            n_B = real_lengths(real_BxL)
            y_BxLxD = dft_per_length(h_BxLxD, n_B).real
            if self.norm == "ortho":
                inv_sqrt_n_B = jax.lax.rsqrt(jnp.maximum(n_B, 1).astype(jnp.float32))
                y_BxLxD = y_BxLxD * inv_sqrt_n_B[:, None, None]
        y_BxLxD = y_BxLxD.astype(x_BxLxD.dtype)
        return y_BxLxD if self.gain is None else y_BxLxD * self.gain[...]


@registry.register("fnet", capabilities=registry.Capabilities(
    description="FNet: real part of a 2D DFT over sequence and hidden (per-example length)",
    causal=False, padding=True, variable_length=True,
    # The suite's gradient check needs a parameter; the transform itself is the same.
    test_hparams={"gain": True},
    rotary_refusal="it mixes tokens by a Fourier transform and forms no query-key products "
    "to rotate"))
def build_fnet(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
               norm: str = "ortho", gain: bool = False) -> FourierMixer:
    del num_heads, max_len, causal  # any length works; the registry refuses causal=True
    return FourierMixer(dim=dim, norm=norm, gain=gain, rngs=rngs)
