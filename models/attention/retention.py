"""Decayed linear attention: `retnet` (Sun et al. 2023) and `gla` (Yang et al. 2024).

Both are linear attention without a denominator whose d_k x d_v state decays by a factor
per step:

    S_t = diag(a_t) S_{t-1} + k_t^T v_t,     o_t = q_t S_t      (q scaled by d_k^-1/2)

- `retnet` (multi-scale retention): a fixed scalar a_t = gamma_h per head, gamma_h =
  1 - 2^(-5-h) for h = 0..H-1 (the paper's); in parallel form (Q K^T o D) V with
  D[n, m] = gamma^(n-m) for n >= m.
- `gla` (gated linear attention): a data-dependent diagonal gate a_t in (0, 1)^d_k from a
  low-rank projection, in log space: log a_t = logsigmoid(W2 W1 x_t + b2) / 16.

Per head the output is normalised (fla's RMSNorm with a learned scale shared by the heads,
in place of the paper's GroupNorm; group_norm="layer" also centres, the paper's form
without its bias) and gated: y = W_o (swish(W_g x) o Norm(o)). Taken from fla (flash-linear-attention, layers/multiscale_retention.py and
layers/gla.py, read at commit bc3b101): no biases in the projections, norm eps 1e-5,
output gate swish, no short convolution, no feature map, q scaled by d_k^-1/2 (fla's ops'
default `scale`); key and value widths expand_k and expand_v times qkv_dim (fla's
hidden_size): retnet 1.0 and 2.0 (value heads twice the key heads, the paper's), gla 0.5
and 1.0; gla's gate: low-rank dim 16, logit normaliser 16, no clamp; its two gate
projections start as fla's `_init_weights` gives them (normal, std 0.02, bias 0), so at
init log a ~ logsigmoid(0) / 16 = -ln(2)/16 (a ~ 0.958). The other projections use the
repository's xavier init (fla: normal 0.02).

Positions, as fla and the papers run them (fla at bc3b101; fla's models add no position
table to the token embeddings): fla's MultiScaleRetention always rotates q and k
(`self.rotary = RotaryEmbedding(dim=head_k_dim)`: RoPE, base 10000, no xPos scale), the
paper's Theta, so retnet's Capabilities.pos_emb is 'rotary' and the task configs build it
with rotated q and k and no learned table (`--config.pos_emb=learned` gives the old
default). Our rotation pairs features (2i, 2i+1) where fla's (interleaved=False) pairs i
and i + d/2: a fixed permutation of the key features, which the learned projections
absorb. gla adds no positions (fla's GatedLinearAttention has no rotary and no short
convolution): its pos_emb is 'none'; it refuses rotary: its diagonal gate sits between q
and k and does not commute with the rotation.

Three forms, equal up to float rounding (tests/models/test_retention.py):
1. `naive_retention` (explicit O(L^2) decay matrix, scalar decay) and `naive_gla`
   (step-by-step recurrence): the test oracles;
2. `chunked_retention`, the training form: inside a chunk of C positions the quadratic
   form with the decay matrix exp(b_i - b_j) taken from in-chunk cumulative sums of
   log a (log space, every exponent <= 0: no overflow at any length), across chunks the
   state carried by `jax.lax.scan`;
3. the recurrent step (`step`, decoding "recurrent_state"): the state S per head.

attention_impl="pallas" runs the training forms (__call__: causal, and both scans of the
bidirectional form, the backward one strict) through the Pallas kernels of
`models.kernels.decayed_attention` (Triton on GPU, Mosaic on TPU, interpreted on CPU),
with the kernel's own chunk size (chunk_size applies to the XLA form). Decoding's
`prefill` needs the final state, which the kernels do not return: it stays on
`chunked_retention` under either implementation (and `step` on the recurrence).

Padding: a padded position writes nothing (k = v = 0) and does not decay the state
(log a = 0), as if it were removed (fla's unpadded, varlen inputs); decays count real
tokens. Bidirectional (causal=False, LRA's classifiers): a forward scan plus a backward
scan over the reversed sequence, summed; the backward one is strict (the diagonal is the
forward's), so key j reaches query i through the gates from the query's position up to,
not including, the key's: prod_{j<s<=i} a_s forward, prod_{i<=s<j} a_s backward (retnet:
gamma^|i-j|).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention.linear_scan import _pad_to_chunks, backend_chunk
from models.kernels.decayed_attention import decayed_linear_attention

RETNET_CHUNK = 64  # retnet's XLA chunk on an accelerator
RETNET_CPU_CHUNK = 16  # where the CPU builds the layer (linear_scan.backend_chunk)

State = dict[str, jax.Array]
GROUP_NORMS = ("rms", "layer")
IMPLS = ("dense", "pallas", "pallas_mosaic")  # XLA chunked forms, or the Pallas kernels


# ----------------------------------------------------------------------------- core math


def retnet_log_gammas(num_heads: int) -> jax.Array:
    """log gamma_h = log(1 - 2^(-5-h)), h = 0..H-1 (log1p: gamma is within 2^-5 of 1)."""
    return jnp.log1p(-jnp.exp2(-5.0 - jnp.arange(num_heads, dtype=jnp.float32)))


@functools.partial(jax.jit, static_argnames=("chunk_size", "strict"))
def chunked_retention(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
                      log_a_BxHxLxG: jax.Array, *, chunk_size: int, strict: bool = False
                      ) -> tuple[jax.Array, jax.Array]:
    """o_i = sum_{j<=i} q_i diag(prod_{j<s<=i} a_s) k_j^T v_j (j < i if `strict`); and the
    state S after the last position (BxHxKxV), which a decoder continues from.

    log_a: BxHxLxG, G = 1 (a scalar per head: retnet) or K (a diagonal gate: gla), <= 0.
    Chunks of `chunk_size` (any L; the zero-padded tail writes and decays nothing). In a
    chunk, with b the inclusive cumulative sum of log a from its start: the intra-chunk
    weights exp(b_i - b_j) (masked where j > i before the exp), the previous state read
    through exp(b_i), keys carried to the chunk's end by exp(b_C - b_j) and the state
    decayed by exp(b_C): every exponent is <= 0. float32 inside; o in v's dtype.
    """
    b, h, l, k_dim = q_BxHxLxK.shape
    v_dim, diagonal = v_BxHxLxV.shape[-1], log_a_BxHxLxG.shape[-1] > 1
    chunk = max(1, min(chunk_size, l))
    f32 = jnp.float32
    xs = tuple(_pad_to_chunks(t.astype(f32), chunk) for t in
               (q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, log_a_BxHxLxG))
    seen_CxC = jnp.tril(jnp.ones((chunk, chunk), jnp.bool_), -1 if strict else 0)

    def body(s_BxHxKxV, chunk_xs):
        q_BxHxCxK, k_BxHxCxK, v_BxHxCxV, log_a_BxHxCxG = chunk_xs
        b_BxHxCxG = jnp.cumsum(log_a_BxHxCxG, axis=2)
        diff = b_BxHxCxG[:, :, :, None, :] - b_BxHxCxG[:, :, None, :, :]  # BxHxCxCxG
        # where() before exp: the masked differences (j > i) are >= 0 and may overflow.
        decay = jnp.exp(jnp.where(seen_CxC[:, :, None], diff, -jnp.inf))
        if diagonal:
            scores_BxHxCxC = jnp.einsum("bhik,bhjk,bhijk->bhij", q_BxHxCxK, k_BxHxCxK, decay)
        else:
            scores_BxHxCxC = (jnp.einsum("bhik,bhjk->bhij", q_BxHxCxK, k_BxHxCxK)
                              * decay[..., 0])
        o_BxHxCxV = (jnp.einsum("bhij,bhjv->bhiv", scores_BxHxCxC, v_BxHxCxV)
                     + jnp.einsum("bhik,bhkv->bhiv", q_BxHxCxK * jnp.exp(b_BxHxCxG),
                                  s_BxHxKxV))
        end_BxHx1xG = b_BxHxCxG[:, :, -1:]
        to_end_BxHxCxK = k_BxHxCxK * jnp.exp(end_BxHx1xG - b_BxHxCxG)
        s_BxHxKxV = (jnp.exp(end_BxHx1xG)[:, :, 0, :, None] * s_BxHxKxV
                     + jnp.einsum("bhjk,bhjv->bhkv", to_end_BxHxCxK, v_BxHxCxV))
        return s_BxHxKxV, o_BxHxCxV

    if diagonal:
        # The CxCxK decay would be saved per chunk for the backward pass (C K floats per
        # position); recomputing it keeps only the state at chunk boundaries.
        body = jax.checkpoint(body)
    s_BxHxKxV, o_NxBxHxCxV = jax.lax.scan(body, jnp.zeros((b, h, k_dim, v_dim), f32), xs)
    n = o_NxBxHxCxV.shape[0]
    o_BxHxLxV = o_NxBxHxCxV.transpose(1, 2, 0, 3, 4).reshape(b, h, n * chunk, v_dim)[:, :, :l]
    return o_BxHxLxV.astype(v_BxHxLxV.dtype), s_BxHxKxV


@functools.partial(jax.jit, static_argnames=("chunk_size",))
def bidirectional_retention(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array,
                            v_BxHxLxV: jax.Array, log_a_BxHxLxG: jax.Array, *,
                            chunk_size: int) -> jax.Array:
    """The forward chunked scan plus the strict one over the reversed sequence: key j
    reaches query i through prod_{j<s<=i} a_s (j <= i) or prod_{i<=s<j} a_s (j > i)."""
    forward, _ = chunked_retention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, log_a_BxHxLxG,
                                   chunk_size=chunk_size)
    flip = functools.partial(jnp.flip, axis=2)
    backward, _ = chunked_retention(flip(q_BxHxLxK), flip(k_BxHxLxK), flip(v_BxHxLxV),
                                    flip(log_a_BxHxLxG), chunk_size=chunk_size, strict=True)
    return forward + flip(backward)


def pallas_retention(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
                     log_a_BxHxLxG: jax.Array, *, causal: bool,
                     gpu_form: str = "triton") -> jax.Array:
    """`chunked_retention`'s output (causal) or `bidirectional_retention` (not causal)
    through the Pallas kernels (their own chunk; the kernel flavour and interpret mode
    follow the platform the program is lowered for: models/kernels/targets.py). The
    kernels return no final state. gpu_form: "triton" or "mosaic" (Mosaic GPU kernels on
    a GPU where they take the call: `decayed_linear_attention`)."""
    forward = decayed_linear_attention(q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, log_a_BxHxLxG,
                                       gpu_form=gpu_form)
    if causal:
        return forward
    flip = functools.partial(jnp.flip, axis=2)
    backward = decayed_linear_attention(flip(q_BxHxLxK), flip(k_BxHxLxK), flip(v_BxHxLxV),
                                        flip(log_a_BxHxLxG), strict=True, gpu_form=gpu_form)
    return forward + flip(backward)


@functools.partial(jax.jit, static_argnames=("causal",))
def naive_retention(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
                    log_gamma_H: jax.Array, *, causal: bool,
                    padding_mask: jax.Array | None = None) -> jax.Array:
    """Reference: (Q K^T o D) V with the explicit LxL decay D[n, m] = gamma^|c_n - c_m|
    (c_n: real tokens up to n; n - m without padding), D = 0 above the diagonal if causal,
    padded keys dropped. O(L^2); float32."""
    b, _, l, _ = q_BxHxLxK.shape
    real_BxL = layers.valid_mask(padding_mask, b, l)
    count_BxL = jnp.cumsum(real_BxL.astype(jnp.float32), axis=1)
    gap_BxLxL = jnp.abs(count_BxL[:, :, None] - count_BxL[:, None, :])
    d_BxHxLxL = jnp.exp(log_gamma_H[None, :, None, None] * gap_BxLxL[:, None])
    keep_BxLxL = jnp.broadcast_to(real_BxL[:, None, :], (b, l, l))
    if causal:
        keep_BxLxL = keep_BxLxL & jnp.tril(jnp.ones((l, l), jnp.bool_))
    d_BxHxLxL = jnp.where(keep_BxLxL[:, None], d_BxHxLxL, 0.0)
    scores = jnp.einsum("bhnk,bhmk->bhnm", q_BxHxLxK.astype(jnp.float32),
                        k_BxHxLxK.astype(jnp.float32)) * d_BxHxLxL
    return jnp.einsum("bhnm,bhmv->bhnv", scores, v_BxHxLxV.astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("causal",))
def naive_gla(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxV: jax.Array,
              log_a_BxHxLxG: jax.Array, *, causal: bool) -> jax.Array:
    """Reference: the recurrence one step at a time (fla's naive_recurrent_gla), float32.
    Forward: S_t = a_t S_{t-1} + k_t^T v_t, o_t = q_t S_t. causal=False adds the backward
    recurrence R_t = a_t R_{t+1} + k_t^T v_t read strictly: o_t += q_t (a_t R_{t+1}).
    G = 1 broadcasts a scalar decay. Padded positions must come with k = v = log a = 0."""
    f32 = jnp.float32
    b, h, _, k_dim = q_BxHxLxK.shape
    time_major = tuple(jnp.moveaxis(t.astype(f32), 2, 0) for t in
                       (q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, log_a_BxHxLxG))
    init = jnp.zeros((b, h, k_dim, v_BxHxLxV.shape[-1]), f32)

    def forward(s, xs):
        q, k, v, log_a = xs
        s = jnp.exp(log_a)[..., None] * s + k[..., None] * v[..., None, :]
        return s, jnp.einsum("bhk,bhkv->bhv", q, s)

    def backward(r, xs):
        q, k, v, log_a = xs
        r = jnp.exp(log_a)[..., None] * r
        o = jnp.einsum("bhk,bhkv->bhv", q, r)
        return r + k[..., None] * v[..., None, :], o

    _, o_LxBxHxV = jax.lax.scan(forward, init, time_major)
    if not causal:
        o_LxBxHxV = o_LxBxHxV + jax.lax.scan(backward, init, time_major, reverse=True)[1]
    return jnp.moveaxis(o_LxBxHxV, 0, 2)


# ----------------------------------------------------------------------------- modules


class _DecayedAttention(nnx.Module):
    """Projections, per-head norm, output gate and the three forms around `log_decay`.

    Parameters: query, key (dim -> H d_k), value, output_gate (dim -> H d_v), out
    (H d_v -> dim), norm_scale (d_v, shared by the heads as fla's g_norm).
    """

    def __init__(self, *, dim: int, num_heads: int, causal: bool, qkv_dim: int | None,
                 expand_k: float, expand_v: float, chunk_size: int, use_bias: bool,
                 group_norm: str, norm_eps: float, rotary: bool, rngs: nnx.Rngs,
                 attention_impl: str = "dense"):
        width = dim if qkv_dim is None else qkv_dim
        key_dim, value_dim = int(width * expand_k), int(width * expand_v)
        if num_heads <= 0 or key_dim <= 0 or value_dim <= 0 or key_dim % num_heads \
                or value_dim % num_heads:
            raise ValueError(f"key width {key_dim} (qkv_dim * expand_k) and value width "
                             f"{value_dim} (qkv_dim * expand_v) must be positive multiples "
                             f"of num_heads ({num_heads})")
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if attention_impl not in IMPLS:
            raise registry.RegistryError(
                f"attention_impl={attention_impl!r} is not available for decayed linear "
                f"attention; valid: {', '.join(IMPLS)}")
        self.attention_impl = attention_impl
        if group_norm not in GROUP_NORMS:
            raise ValueError(f"unknown group_norm {group_norm!r}; valid: "
                             f"{', '.join(GROUP_NORMS)}")
        self.num_heads, self.causal, self.rotary = num_heads, causal, rotary
        self.head_k, self.head_v = key_dim // num_heads, value_dim // num_heads
        if rotary and self.head_k % 2:
            raise ValueError(f"pos_emb='rotary' rotates pairs of a head's key features; the "
                             f"key head size {self.head_k} is odd")
        self.chunk_size, self.group_norm, self.norm_eps = chunk_size, group_norm, norm_eps
        proj = dict(use_bias=use_bias, rngs=rngs)
        self.query = layers.dense(dim, key_dim, ("embed", "qkv"), **proj)
        self.key = layers.dense(dim, key_dim, ("embed", "qkv"), **proj)
        self.value = layers.dense(dim, value_dim, ("embed", "qkv"), **proj)
        self.output_gate = layers.dense(dim, value_dim, ("embed", "qkv"), **proj)
        self.out = layers.dense(value_dim, dim, ("qkv", "embed"), **proj)
        self.norm_scale = layers.param(layers.ones, (None,), (self.head_v,), rngs=rngs)

    def log_decay(self, x_BxLxD: jax.Array) -> jax.Array:
        """log a_t, BxHxLxG float32 (G = 1 or d_k), <= 0."""
        raise NotImplementedError

    def _split(self, x_BxLxF: jax.Array, head: int) -> jax.Array:
        b, l, _ = x_BxLxF.shape
        return x_BxLxF.reshape(b, l, self.num_heads, head).transpose(0, 2, 1, 3)

    def heads(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None,
              positions: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """q (rotated under rotary, scaled by d_k^-1/2), k (rotated), v, log a: what the
        three forms take; k = v = log a = 0 at padded positions (no write, no decay).
        `positions` (broadcast against BxHxL) defaults to 0..L-1."""
        q_BxHxLxK = self._split(self.query(x_BxLxD), self.head_k)
        k_BxHxLxK = self._split(self.key(x_BxLxD), self.head_k)
        v_BxHxLxV = self._split(self.value(x_BxLxD), self.head_v)
        if self.rotary:
            at = jnp.arange(x_BxLxD.shape[1]) if positions is None else positions
            q_BxHxLxK, k_BxHxLxK = layers.rotary(q_BxHxLxK, at), layers.rotary(k_BxHxLxK, at)
        q_BxHxLxK = q_BxHxLxK * (self.head_k ** -0.5)
        log_a_BxHxLxG = self.log_decay(x_BxLxD)
        if padding_mask is not None:
            real_Bx1xLx1 = padding_mask.astype(jnp.bool_)[:, None, :, None]
            k_BxHxLxK, v_BxHxLxV, log_a_BxHxLxG = (
                jnp.where(real_Bx1xLx1, t, 0.0) for t in (k_BxHxLxK, v_BxHxLxV, log_a_BxHxLxG))
        return q_BxHxLxK, k_BxHxLxK, v_BxHxLxV, log_a_BxHxLxG

    def finish(self, o_BxHxLxV: jax.Array, x_BxLxD: jax.Array) -> jax.Array:
        """W_o (swish(W_g x) o Norm(o)): the per-head norm in float32, then the gate."""
        o = o_BxHxLxV.astype(jnp.float32)
        if self.group_norm == "layer":
            o = o - jnp.mean(o, axis=-1, keepdims=True)
        o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + self.norm_eps)
        o = o * self.norm_scale[...]
        b, _, l, _ = o.shape
        o_BxLxF = o.transpose(0, 2, 1, 3).reshape(b, l, -1).astype(x_BxLxD.dtype)
        return self.out(jax.nn.silu(self.output_gate(x_BxLxD)) * o_BxLxF)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        del deterministic  # no dropout inside (fla's layers have none)
        q, k, v, log_a = self.heads(x_BxLxD, padding_mask)
        if self.attention_impl in ("pallas", "pallas_mosaic"):
            o_BxHxLxV = pallas_retention(
                q, k, v, log_a, causal=self.causal,
                gpu_form="mosaic" if self.attention_impl == "pallas_mosaic" else "triton")
        elif self.causal:
            o_BxHxLxV, _ = chunked_retention(q, k, v, log_a, chunk_size=self.chunk_size)
        else:
            o_BxHxLxV = bidirectional_retention(q, k, v, log_a, chunk_size=self.chunk_size)
        return self.finish(o_BxHxLxV, x_BxLxD)

    # Decoding ("recurrent_state"): the state S (BxHxd_kxd_v, float32) at every position.
    def init_cache(self, batch: int, max_len: int) -> State:
        del max_len  # the state does not grow with the position
        self._check_decodes()
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "s": jnp.zeros((batch, self.num_heads, self.head_k, self.head_v),
                               jnp.float32)}

    def prefill(self, cache: State, x_BxLxD: jax.Array, padding_mask_BxL: jax.Array | None
                ) -> tuple[jax.Array, State]:
        """A right-padded prompt in one chunked call: the padded tail neither writes nor
        decays, so the scan's final state is the state after each row's real tokens."""
        del cache  # a prompt starts at position 0
        self._check_decodes()
        q, k, v, log_a = self.heads(x_BxLxD, padding_mask_BxL)
        o_BxHxLxV, s_BxHxKxV = chunked_retention(q, k, v, log_a, chunk_size=self.chunk_size)
        pos_B = decoding.lengths_of(padding_mask_BxL, *x_BxLxD.shape[:2])
        return self.finish(o_BxHxLxV, x_BxLxD), {"pos": pos_B, "s": s_BxHxKxV}

    def step(self, cache: State, x_BxD: jax.Array) -> tuple[jax.Array, State]:
        """S <- diag(a_t) S + k_t^T v_t and o_t = q_t S, row b at position pos[b]."""
        self._check_decodes()
        pos_B = cache["pos"]
        x_Bx1xD = x_BxD[:, None]
        q, k, v, log_a = self.heads(x_Bx1xD, None, positions=pos_B[:, None, None])
        f32 = jnp.float32
        s_BxHxKxV = (jnp.exp(log_a[:, :, 0])[..., None] * cache["s"]
                     + jnp.einsum("bhk,bhv->bhkv", k[:, :, 0].astype(f32),
                                  v[:, :, 0].astype(f32)))
        o_BxHxV = jnp.einsum("bhk,bhkv->bhv", q[:, :, 0].astype(f32), s_BxHxKxV)
        y_BxD = self.finish(o_BxHxV[:, :, None], x_Bx1xD)[:, 0]
        return y_BxD, {"pos": pos_B + 1, "s": s_BxHxKxV}

    def _check_decodes(self) -> None:
        if not self.causal:
            raise decoding.DecodingError(
                f"{type(self).__name__} was built with causal=False; only the causal form "
                "reads a state one token at a time")


class MultiScaleRetention(_DecayedAttention):
    """RetNet's retention: a fixed decay gamma_h = 1 - 2^(-5-h) per head (no parameter);
    decay=False (an ablation) gamma = 1."""

    def __init__(self, *, decay: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.decay = bool(decay)

    def log_gammas(self) -> jax.Array:
        gammas = retnet_log_gammas(self.num_heads)
        return gammas if self.decay else jnp.zeros_like(gammas)

    def log_decay(self, x_BxLxD: jax.Array) -> jax.Array:
        b, l, _ = x_BxLxD.shape
        return jnp.broadcast_to(self.log_gammas()[None, :, None, None],
                                (b, self.num_heads, l, 1))


@registry.register("retnet", capabilities=registry.Capabilities(
    description="RetNet retention: decay gamma_h = 1 - 2^(-5-h) per head, group norm, swish "
                "gate; chunked (XLA or attention_impl=pallas); bidirectional = forward + "
                "strict backward scan summed",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5}, rotary=True, pos_emb="rotary"))
def build_retnet(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                 rotary: bool = False, qkv_dim: int | None = None, expand_k: float = 1.0,
                 expand_v: float = 2.0, chunk_size: int | None = None,
                 use_bias: bool = False, group_norm: str = "rms", norm_eps: float = 1e-5,
                 decay: bool = True, attention_impl: str = "dense") -> MultiScaleRetention:
    """expand_k, expand_v: key and value widths over qkv_dim (fla's 1 and 2: value heads
    twice the key heads, as the paper). group_norm: "rms" (fla) or "layer".
    decay=False (ours, an ablation): gamma = 1 in every head, the layer otherwise the same
    (no parameter changes), so a comparison changes the decay alone.
    attention_impl: "dense" (the XLA chunked form) or "pallas" (the kernels). chunk_size
    (the XLA form's) by default 64, or 16 where the CPU builds the layer (a MAD mini step
    1.3 times faster on a CPU core: results/cpu/chunk_sizes.md)."""
    del max_len  # any length
    if chunk_size is None:
        chunk_size = backend_chunk(RETNET_CHUNK, RETNET_CPU_CHUNK)
    return MultiScaleRetention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                               expand_k=expand_k, expand_v=expand_v, chunk_size=chunk_size,
                               use_bias=use_bias, group_norm=group_norm, norm_eps=norm_eps,
                               rotary=rotary, rngs=rngs, attention_impl=attention_impl,
                               decay=decay)


class GatedLinearAttention(_DecayedAttention):
    """GLA: log a_t = logsigmoid(W2 W1 x_t + b2) / normaliser, a diagonal gate per head."""

    def __init__(self, *, gate_low_rank_dim: int, gate_logit_normalizer: float,
                 rngs: nnx.Rngs, decay: bool = True, **kwargs):
        super().__init__(rngs=rngs, **kwargs)
        if gate_low_rank_dim <= 0 or gate_logit_normalizer <= 0:
            raise ValueError("gla: gate_low_rank_dim and gate_logit_normalizer must be "
                             f"positive, got {gate_low_rank_dim} and {gate_logit_normalizer}")
        self.gate_logit_normalizer = gate_logit_normalizer
        if not decay:  # the ablation: a = 1, the gate's projections not built
            self.alpha_down = self.alpha_up = None
            return
        # fla's _init_weights: normal(0.02) kernels, zero bias, so the logits start near 0.
        fla_init = layers.normal(0.02)
        self.alpha_down = layers.dense(kwargs["dim"], gate_low_rank_dim, ("embed", None),
                                       use_bias=False, kernel_init=fla_init, rngs=rngs)
        self.alpha_up = layers.dense(gate_low_rank_dim, self.num_heads * self.head_k,
                                     (None, "qkv"), kernel_init=fla_init, rngs=rngs)

    def log_decay(self, x_BxLxD: jax.Array) -> jax.Array:
        if self.alpha_up is None:
            b, l, _ = x_BxLxD.shape
            return jnp.zeros((b, self.num_heads, l, self.head_k), jnp.float32)
        logits_BxLxF = self.alpha_up(self.alpha_down(x_BxLxD)).astype(jnp.float32)
        log_a_BxLxF = jax.nn.log_sigmoid(logits_BxLxF) / self.gate_logit_normalizer
        return self._split(log_a_BxLxF, self.head_k)


@registry.register("gla", capabilities=registry.Capabilities(
    description="gated linear attention: low-rank data-dependent diagonal decay in log space "
                "(fla defaults), chunked (XLA or attention_impl=pallas); bidirectional = "
                "forward + strict backward scan summed",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5}, pos_emb="none",
    rotary_refusal="its diagonal gate sits between q and k and does not commute with a "
                   "rotation"))
def build_gla(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
              qkv_dim: int | None = None, expand_k: float = 0.5, expand_v: float = 1.0,
              gate_low_rank_dim: int = 16, gate_logit_normalizer: float = 16.0,
              chunk_size: int = 16, use_bias: bool = False, group_norm: str = "rms",
              norm_eps: float = 1e-5, decay: bool = True,
              attention_impl: str = "dense") -> GatedLinearAttention:
    """fla's GatedLinearAttention defaults. attention_impl: "dense" (the XLA chunked
    form) or "pallas" (the kernels). chunk_size 16: the chunk's decay is C x C x d_k
    (fla's chunk_gla computes its exact log-space part on sub-chunks of 16 too).
    decay=False (ours, an ablation): the same layer without its gate (a = 1; the gate's
    low-rank projections not built), so a comparison changes the decay alone."""
    del max_len  # any length
    return GatedLinearAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                                expand_k=expand_k, expand_v=expand_v, chunk_size=chunk_size,
                                use_bias=use_bias, group_norm=group_norm, norm_eps=norm_eps,
                                rotary=False, gate_low_rank_dim=gate_low_rank_dim,
                                gate_logit_normalizer=gate_logit_normalizer, rngs=rngs,
                                attention_impl=attention_impl, decay=decay)
