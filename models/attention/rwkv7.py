"""RWKV-7 "Goose" time mixing (`rwkv7`; Peng et al. 2025, "RWKV-7 "Goose" with Expressive
Dynamic State Evolution", arXiv 2503.14456): a delta rule whose state decays per key
channel and whose erase direction and learning rate are separate from the written key,

    S_t = S_{t-1} (Diag(e^{w_t}) - kk_t^T (a_t * kk_t)) + v_t^T k_t,     o_t = S_t r_t

(row vectors, w the log decay; S is V x K per head, as delta.py's). In the generalised
(DPLR) delta rule's terms, S_t = S_{t-1} (Diag(e^{w_t}) + alpha_t beta_t^T) + v_t k_t^T
with alpha = -kk, beta = kk * a (fla's `chunk_rwkv7(a=-kk, b=kk*a)`): the state decays,
reads its previous self along kk, removes a fraction a of that read (per channel) and
writes v along k.

The layer is fla's `RWKV7Attention` (fla/layers/rwkv7.py at bc3b101) at its defaults, each
line of its forward here:
- token shift: x_prev (zeros before the first token), and six lerps x + (x_prev - x) mu_c
  for c in r, w, k, v, a, g (fla's fused_addcmul_rwkv7);
- r, k, v: bias-free projections D -> D (key width = value width = hidden size; head size
  D / num_heads: the config's head count, as every variant here; fla's default head_dim 64
  is what LRA's 512 wide, 8 head configs give);
- log decay w = -e^{-1/2} sigmoid(w_lora(x_w)), so the decay e^w lies in (0.545, 1):
  w_lora is Linear(D, d_w, no bias) -> tanh -> Linear(d_w, D, bias) (fla's LoRA);
- a = sigmoid(a_lora(x_a)) (no activation inside), g = g_lora(x_g) (sigmoid inside, no
  bias at the end);
- kk = l2norm(k * k_k) per head (F.normalize, eps 1e-12); k <- k (1 + (a - 1) k_a);
- the recurrence above with scale 1; GroupNorm per head (mean and variance over the head's
  V channels, eps = head size x 1e-5, affine); + sum(r * k * r_k) v per head (the "bonus"
  r_k, with the updated k); times g; o_proj bias-free.
The low-rank widths are fla's rule from the hidden size: d_w = d_a = max(32, round(2.5
sqrt(D) (head/64) / 32) * 32), d_g = max(32, round(5 sqrt(D) / 32) * 32).

The value residual (fla's v_first: layers after the first lerp their v towards the first
layer's v through v_lora) needs an input from the first layer that our blocks do not
carry; every layer here is fla's layer_idx = 0 form: v_first is its own v, there is no
v_lora. Initialisation is fla's layer init for layer_idx 0 (ratio_0_to_1 = 0,
ratio_1_to_almost0 = 1): the lerps 1 - (n / D)^p (p = 0.2, 0.9, 0.7, 0.7, 0.9, 0.2),
k_k = 0.71 - 0.1 linear, k_a = 1.02, r_k = -0.04, w_lora's bias -6 + 6 n / (D - 1) + 0.5
+ 2.5 zigzag, a_lora's -0.19 + 0.3 zigzag + 0.4 linear, the LoRAs' first matrices zero and
second orthogonal x 0.1, r and v orthogonal, k orthogonal x 0.1. It differs in two places:
GroupNorm's weight is 1 (fla: ((layer_idx + 1) / num_layers)^0.7, a depth the mixer does
not know) and o_proj is xavier-uniform as in every variant here (fla's layer zeroes it;
its model's rescale_prenorm_residual draws it again, kaiming-uniform / sqrt(2 num_layers)).
Not ported: value_dim != hidden size, fuse_norm's fused GroupNorm (the same function), the
channel-mixing FFN (the block's MLP stands in for it).

The token shift is a depthwise causal convolution of 2 taps per lerp (weights 1 - mu and
mu on x_t and x_{t-1}): the scaffold's `builtin_conv` reaches it as it reaches the other
variants' own short convolutions (`token_shift`, Capabilities.short_conv_hparam: 2 is
RWKV-7's, 0 reads x_t for x_{t-1}, so every lerp is x_t: the layer without its shift, as
`conv_size=0` is deltanet without its convolutions), and the scaffold card shows it as
the mixer's own convolution (lra/runs/card.py reads `token_shift`). Under a benchmark
scaffold whose variants' convolutions are off (configs/scaffold.py ZOOLOGY_MQAR, MAD), rwkv7
runs without it, beside the scaffold's shared convolution, like every other row.

Three forms of the op, equal (tests/models/test_rwkv7.py): `dplr_reference` (a scan over
time of `dplr_step`, the decoding step), and `chunk_dplr`, what the layer runs: per chunk
of C positions with b_i the cumulative log decay up to i (a vector over K) and b_{i-1}
the one before,
    u_i = S_{i-1} alpha_i = S_0 (alpha_i e^{b_{i-1}}) + sum_{j<i} (A_ab)_ij u_j + (A_ak)_ij v_j,
    (A_ab)_ij = sum_d alpha_id beta_jd e^{b_{i-1,d} - b_jd},  A_ak the same with k_j,
so U = (I - A_ab)^{-1} (A_ak V + (alpha e^{b_{i-1}}) S_0^T), solved for every chunk at once
(delta.unit_lower_inverse); then a scan over chunks: O = (r e^b) S_0^T + (A_rk) V + (A_rb) U
(the same sums with r_i and e^{b_i - b_j}, j <= i) and S_C = S_0 e^{b_C} + (U^T beta + V^T
k) e^{b_C - b}: fla's naive `dplr_chunkwise`, with every difference masked before exp, so
every exponent is <= 0. Memory and time L C K per head, so the default chunk is 16 (fla's
kernel: chunks of 64 in sub-chunks of 16); on 2 CPU cores the op's gradient at B 4, H 2,
L 1024, K 64 took 0.39 s at C 16, 0.78 s at 32, 1.7 s at 64 and 0.23 s at 8. So where the
CPU builds the layer the default is 4 (CPU_CHUNK; at L 256, B 64, H 4, K 16: 0.62 s against
1.18 s at 16, results/cpu/chunk_sizes.md); 16 on an accelerator.

Padding: inputs are zeroed at padded positions before the token shift (fla's x * mask),
so a real token whose neighbour is padded reads zeros, as at the sequence's start; at
padded positions w = 0, a = 0 and v = 0, so they neither decay, erase nor write (fla
zeroes x and v only: a right-padded tail still decays and erases its final state).
causal=False (LRA's classifiers; fla has no such form): a forward and a backward
direction, each the causal layer (the backward one read from the end, its token shift
reading the next token), summed before o_proj. A direction owns what is directional, as
delta.py's directions own their convolutions and gates: the six lerps (the token shift)
and the decay and learning-rate LoRAs; r/k/v projections, k_k, k_a, r_k, g_lora,
GroupNorm and o_proj are shared. Decoding (`models.decoding`'s "recurrent_state"): the
cache holds S per head and the last input (the token shift's).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention import delta
from models.attention.linear_scan import _pad_to_chunks, backend_chunk

DEFAULT_CHUNK = 16  # C x C x K decays per chunk (module docstring): fla's sub-chunk
CPU_CHUNK = 4  # the default where the CPU builds the layer (linear_scan.backend_chunk)
DECAY_SCALE = 0.6065306597126334  # e^{-1/2}: fla's w = -e^{-1/2} sigmoid(.), w >= -0.6065
NORM_EPS = 1e-5  # fla's norm_eps; GroupNorm's eps is head size times it
L2_EPS = 1e-12  # F.normalize: x / max(|x|, eps)
LERPS = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")
LERP_POWERS = (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)  # fla's layer init: mu = 1 - (n / D)^p


# ----------------------------------------------------------------------------- the op


def dplr_step(s_BxHxVxK, r_BxHxK, w_BxHxK, k_BxHxK, v_BxHxV, a_BxHxK, b_BxHxK):
    """One token: S <- S Diag(e^w) + (S a) b^T + v k^T, o = S r (BxHxV). a, b are fla's
    (alpha, beta; rwkv7: -kk and kk * a)."""
    sa_BxHxV = jnp.einsum("bhvk,bhk->bhv", s_BxHxVxK, a_BxHxK)
    s_BxHxVxK = (s_BxHxVxK * jnp.exp(w_BxHxK)[:, :, None, :]
                 + sa_BxHxV[..., None] * b_BxHxK[:, :, None, :]
                 + v_BxHxV[..., None] * k_BxHxK[:, :, None, :])
    return jnp.einsum("bhvk,bhk->bhv", s_BxHxVxK, r_BxHxK), s_BxHxVxK


def _f32(*arrays):
    return tuple(a.astype(jnp.float32) for a in arrays)


@jax.jit
def dplr_reference(r, w, k, v, a, b):
    """The recurrence step by step (a scan over time; the tests' oracle): r, w, k, a, b
    BxHxLxK, v BxHxLxV; outputs BxHxLxV and the final state BxHxVxK, float32."""
    r, w, k, v, a, b = _f32(r, w, k, v, a, b)
    batch, h, _, k_dim = r.shape

    def step(s, xs):
        o, s = dplr_step(s, *xs)
        return s, o

    xs = tuple(jnp.moveaxis(t, 2, 0) for t in (r, w, k, v, a, b))
    s_final, o_LxBxHxV = jax.lax.scan(step, jnp.zeros((batch, h, v.shape[-1], k_dim)), xs)
    return jnp.moveaxis(o_LxBxHxV, 0, 2), s_final


@functools.partial(jax.jit, static_argnames=("chunk_size",))
def chunk_dplr(r, w, k, v, a, b, *, chunk_size: int = DEFAULT_CHUNK):
    """`dplr_reference`'s outputs and final state, chunk by chunk (module docstring). Any
    L: the tail is zero-padded (w = 0, a = b = k = v = 0: no decay, no erase, no write).
    The scan over chunks is rematerialised, as delta.py's."""
    r, w, k, v, a, b = _f32(r, w, k, v, a, b)
    batch, h, length, k_dim = r.shape
    v_dim = v.shape[-1]
    chunk = max(1, min(chunk_size, length))
    r_N, w_N, k_N, v_N, a_N, b_N = (_pad_to_chunks(t, chunk) for t in (r, w, k, v, a, b))
    cum_N = jnp.cumsum(w_N, axis=-2)  # b_i, inclusive, reset at each chunk
    before_N = cum_N - w_N  # b_{i-1}
    upto = jnp.tril(jnp.ones((chunk, chunk), jnp.bool_))[..., None]  # j <= i
    below = jnp.tril(jnp.ones((chunk, chunk), jnp.bool_), -1)[..., None]  # j < i

    def decay(top_xCxK, base_xCxK, mask_CxCx1):
        """exp(top_i - base_j) per channel where the mask holds, 0 elsewhere (xCxCxK).
        where() inside exp: the masked differences are positive and could overflow."""
        diff = top_xCxK[..., :, None, :] - base_xCxK[..., None, :, :]
        return jnp.exp(jnp.where(mask_CxCx1, diff, -jnp.inf))

    # u_i = S_{i-1} a_i within the chunk: (I - A_ab) U = A_ak V + (a e^{b_{i-1}}) S_0^T.
    e_strict = decay(before_N, cum_N, below)
    a_ab = jnp.einsum("nbhik,nbhjk,nbhijk->nbhij", a_N, b_N, e_strict)
    a_ak = jnp.einsum("nbhik,nbhjk,nbhijk->nbhij", a_N, k_N, e_strict)
    rhs = jnp.concatenate([a_ak @ v_N, a_N * jnp.exp(before_N)], axis=-1)
    uw = delta.unit_lower_inverse(-a_ab) @ rhs
    u0_N, uw_N = uw[..., :v_dim], uw[..., v_dim:]  # U = u0 + uw S_0^T

    @jax.checkpoint
    def body(s_BxHxVxK, xs):
        r_c, k_c, v_c, b_c, u0_c, uw_c, cum_c = xs
        u_c = u0_c + jnp.einsum("bhck,bhvk->bhcv", uw_c, s_BxHxVxK)
        e_upto = decay(cum_c, cum_c, upto)
        a_rk = jnp.einsum("bhik,bhjk,bhijk->bhij", r_c, k_c, e_upto)
        a_rb = jnp.einsum("bhik,bhjk,bhijk->bhij", r_c, b_c, e_upto)
        o_c = (jnp.einsum("bhck,bhvk->bhcv", r_c * jnp.exp(cum_c), s_BxHxVxK)
               + a_rk @ v_c + a_rb @ u_c)
        end = cum_c[..., -1:, :]
        to_end = jnp.exp(end - cum_c)
        s_BxHxVxK = (jnp.exp(end) * s_BxHxVxK
                     + jnp.einsum("bhcv,bhck->bhvk", u_c, b_c * to_end)
                     + jnp.einsum("bhcv,bhck->bhvk", v_c, k_c * to_end))
        return s_BxHxVxK, o_c

    s_final, o_N = jax.lax.scan(body, jnp.zeros((batch, h, v_dim, k_dim), jnp.float32),
                                (r_N, k_N, v_N, b_N, u0_N, uw_N, cum_N))
    n = o_N.shape[0]
    o_BxHxLxV = o_N.transpose(1, 2, 0, 3, 4).reshape(batch, h, n * chunk, v_dim)
    return o_BxHxLxV[:, :, :length], s_final


# ----------------------------------------------------------------------------- init


def low_rank_dims(dim: int, head_dim: int) -> dict[str, int]:
    """fla's RWKV7Attention widths when not given (decay and a grow with head_dim / 64)."""
    factor = head_dim / 64
    rule = lambda c, f: max(32, int(round(c * dim ** 0.5 * f / 32) * 32))  # noqa: E731
    return {"decay": rule(2.5, factor), "a": rule(2.5, factor), "gate": rule(5.0, 1.0)}


def _fixed(values):
    """An initialiser that returns `values` (fla's deterministic layer init)."""
    return lambda key, shape, dtype=jnp.float32: jnp.broadcast_to(
        jnp.asarray(values, dtype), shape)


def _ramps(dim: int, head_dim: int):
    """fla's n / D, linear (n / (D - 1) - 0.5), zigzag (per head, signed square) and www
    (-6 + 6 n / (D - 1), layer 0) over the D channels."""
    n = jnp.arange(dim, dtype=jnp.float32)
    linear = n / (dim - 1) - 0.5
    half = (head_dim - 1) / 2
    zig = ((n % head_dim) - half) / half
    return n / dim, linear, zig * jnp.abs(zig), -6.0 + 6.0 * n / (dim - 1)


def lora_up_init(rank: int, out: int) -> layers.Initializer:
    """fla's LoRA: orthogonal x 0.1 x sqrt(rank / out) if rank > out (else x 0.1)."""
    gain = math.sqrt(rank / out) if rank > out else 1.0
    return jax.nn.initializers.orthogonal(scale=0.1 * gain)


class LoRA(nnx.Module):
    """fla's LoRA: Linear(D, rank, no bias) -> activation -> Linear(rank, out[, bias])."""

    def __init__(self, dim: int, out: int, rank: int, *, activation, bias_init=None,
                 rngs: nnx.Rngs):
        self.activation = activation
        self.down = layers.dense(dim, rank, ("embed", None), use_bias=False,
                                 kernel_init=layers.zeros, rngs=rngs)
        self.up = layers.dense(rank, out, (None, "qkv"), use_bias=bias_init is not None,
                               kernel_init=lora_up_init(rank, out),
                               bias_init=bias_init or layers.zeros, rngs=rngs)

    def __call__(self, x):
        return self.up(self.activation(self.down(x)))


class Direction(nnx.Module):
    """What is directional: the token shift's six lerps and the decay (w) and learning-rate
    (a) LoRAs, at fla's layer-0 init."""

    def __init__(self, *, dim: int, head_dim: int, decay_rank: int, a_rank: int,
                 rngs: nnx.Rngs):
        ddd, linear, zigzag, www = _ramps(dim, head_dim)
        for name, p in zip(LERPS, LERP_POWERS):
            setattr(self, name, layers.param(_fixed(1.0 - ddd ** p), ("embed",), (dim,),
                                             rngs=rngs, no_weight_decay=True))
        self.w_lora = LoRA(dim, dim, decay_rank, activation=jnp.tanh,
                           bias_init=_fixed(www + 0.5 + 2.5 * zigzag), rngs=rngs)
        self.a_lora = LoRA(dim, dim, a_rank, activation=lambda x: x,
                           bias_init=_fixed(-0.19 + 0.3 * zigzag + 0.4 * linear), rngs=rngs)


# ----------------------------------------------------------------------------- the layer


class RWKV7Attention(nnx.Module):
    """fla's RWKV7Attention, layer_idx 0 (module docstring); r_proj, k_proj, v_proj,
    o_proj as fla names them."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, chunk_size: int,
                 decay_low_rank_dim: int | None, a_low_rank_dim: int | None,
                 gate_low_rank_dim: int | None, norm_eps: float, token_shift: int,
                 rngs: nnx.Rngs):
        if num_heads <= 0 or dim % num_heads or dim // num_heads < 2:
            raise ValueError(f"dim ({dim}) must be num_heads ({num_heads}) heads of at "
                             "least 2 channels (fla's init spreads values over a head)")
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if token_shift not in (0, 2):
            raise ValueError(f"token_shift={token_shift!r}: RWKV-7's token shift has 2 taps "
                             "(x_t and x_{t-1}); 0 builds the layer without it")
        # Read by the scaffold card (lra/runs/card.py) as the mixer's own convolution.
        self.token_shift = token_shift
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.causal, self.chunk_size = causal, chunk_size
        self.norm_eps = self.head_dim * norm_eps  # fla: eps = head_dim * norm_eps
        ranks = low_rank_dims(dim, self.head_dim)
        ranks.update({k: v for k, v in (("decay", decay_low_rank_dim), ("a", a_low_rank_dim),
                                         ("gate", gate_low_rank_dim)) if v is not None})
        if min(ranks.values()) <= 0:
            raise ValueError(f"low-rank dims must be positive, got {ranks}")
        self.ranks = tuple(sorted(ranks.items()))
        _, linear, _, _ = _ramps(dim, self.head_dim)
        orth = jax.nn.initializers.orthogonal
        proj = dict(use_bias=False, rngs=rngs)
        self.r_proj = layers.dense(dim, dim, ("embed", "qkv"), kernel_init=orth(), **proj)
        self.k_proj = layers.dense(dim, dim, ("embed", "qkv"), kernel_init=orth(0.1), **proj)
        self.v_proj = layers.dense(dim, dim, ("embed", "qkv"), kernel_init=orth(), **proj)
        self.o_proj = layers.dense(dim, dim, ("qkv", "embed"), **proj)
        channel = dict(rngs=rngs, no_weight_decay=True)
        self.k_k = layers.param(_fixed(0.71 - 0.1 * linear), ("qkv",), (dim,), **channel)
        self.k_a = layers.param(_fixed(1.02), ("qkv",), (dim,), **channel)
        self.r_k = layers.param(_fixed(-0.04), ("heads", None), (num_heads, self.head_dim),
                                **channel)
        self.g_lora = LoRA(dim, dim, ranks["gate"], activation=jax.nn.sigmoid, rngs=rngs)
        self.norm_scale = layers.param(layers.ones, ("qkv",), (dim,), **channel)
        self.norm_bias = layers.param(layers.zeros, ("qkv",), (dim,), **channel)
        direction = dict(dim=dim, head_dim=self.head_dim, decay_rank=ranks["decay"],
                         a_rank=ranks["a"], rngs=rngs)
        self.forward_dir = Direction(**direction)
        self.backward_dir = None if causal else Direction(**direction)

    def split_heads(self, x_BxLxF):
        b, l, f = x_BxLxF.shape
        return x_BxLxF.reshape(b, l, self.num_heads, f // self.num_heads).transpose(0, 2, 1, 3)

    def merge_heads(self, x_BxHxLxF):
        b, h, l, f = x_BxHxLxF.shape
        return x_BxHxLxF.transpose(0, 2, 1, 3).reshape(b, l, h * f)

    def features(self, direction: Direction, x_BxLxD, prev_BxD, real_BxL):
        """The token shift, lerps, projections and LoRAs of fla's forward, float32, for x
        already zeroed at padded positions; prev is the input before x (zeros at the
        start). Heads first: r, w, k, v, kk, a, g (BxHxLxF)."""
        x = x_BxLxD.astype(jnp.float32)
        if self.token_shift:
            shifted = jnp.concatenate([prev_BxD.astype(jnp.float32)[:, None], x[:, :-1]],
                                      axis=1)
        else:  # no shift: every lerp is x itself
            shifted = x
        xr, xw, xk, xv, xa, xg = (x + (shifted - x) * getattr(direction, n)[...]
                                  for n in LERPS)
        r = self.r_proj(xr)
        w = -DECAY_SCALE * jax.nn.sigmoid(direction.w_lora(xw))
        k = self.k_proj(xk)
        v = self.v_proj(xv)
        a = jax.nn.sigmoid(direction.a_lora(xa))
        g = self.g_lora(xg)
        kk = self.split_heads(k * self.k_k[...])
        # F.normalize: x / max(|x|, eps); written on the squared norm so that a zero
        # vector has a finite gradient.
        kk = kk * jax.lax.rsqrt(jnp.maximum(jnp.sum(kk * kk, -1, keepdims=True), L2_EPS ** 2))
        k = k * (1.0 + (a - 1.0) * self.k_a[...])  # fla's fused_k_rwkv7
        real = real_BxL[..., None]
        # Padded positions: no decay (w = 0), no erase (a = 0), no write (v = 0).
        w, a, v = (jnp.where(real, t, 0.0) for t in (w, a, v))
        return tuple(self.split_heads(t.astype(jnp.float32)) for t in (r, w, k, v)) + (
            kk.astype(jnp.float32),) + tuple(self.split_heads(t.astype(jnp.float32))
                                             for t in (a, g))

    def finish(self, o_BxHxLxV, r, k, v, g):
        """GroupNorm per head (affine), + sum(r k r_k) v, times g (fla's g_norm and
        gate_output_correction), BxHxLxV."""
        o = o_BxHxLxV
        mean = jnp.mean(o, -1, keepdims=True)
        var = jnp.mean(jnp.square(o - mean), -1, keepdims=True)
        o = (o - mean) * jax.lax.rsqrt(var + self.norm_eps)
        scale = self.norm_scale[...].reshape(self.num_heads, 1, -1)
        o = o * scale + self.norm_bias[...].reshape(self.num_heads, 1, -1)
        bonus = jnp.sum(r * k * self.r_k[...][:, None, :], -1, keepdims=True)
        return (o + bonus * v) * g

    def direction(self, direction, x_BxLxD, prev_BxD, real_BxL):
        """One direction's finished outputs BxHxLxV and final state."""
        r, w, k, v, kk, a, g = self.features(direction, x_BxLxD, prev_BxD, real_BxL)
        o, s = chunk_dplr(r, w, k, v, -kk, kk * a, chunk_size=self.chunk_size)
        return self.finish(o, r, k, v, g), s

    def attend(self, x_BxLxD, padding_mask):
        b, length, dim = x_BxLxD.shape
        real_BxL = layers.valid_mask(padding_mask, b, length)
        x = jnp.where(real_BxL[..., None], x_BxLxD.astype(jnp.float32), 0.0)  # fla: x * mask
        start = jnp.zeros((b, dim), jnp.float32)
        o_BxHxLxV, s = self.direction(self.forward_dir, x, start, real_BxL)
        if self.backward_dir is not None:
            o_back, _ = self.direction(self.backward_dir, jnp.flip(x, 1), start,
                                       jnp.flip(real_BxL, 1))
            o_BxHxLxV = o_BxHxLxV + jnp.flip(o_back, 2)
        return o_BxHxLxV, x, s

    def __call__(self, x_BxLxD, padding_mask=None, deterministic: bool = True):
        del deterministic  # no dropout
        o_BxHxLxV, _, _ = self.attend(x_BxLxD, padding_mask)
        return self.o_proj(self.merge_heads(o_BxHxLxV).astype(x_BxLxD.dtype))

    # ------------------------------------------------------------------ decoding

    def init_cache(self, batch: int, max_len: int):
        """pos, S per head (BxHxVxK) and the token shift's last input (BxD)."""
        del max_len  # the state never grows
        decoding.require_causal(self, "rwkv7")
        h, d = self.num_heads, self.head_dim
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "s": jnp.zeros((batch, h, d, d), jnp.float32),
                "shift": jnp.zeros((batch, h * d), jnp.float32)}

    def prefill(self, cache, x_BxLxD, padding_mask_BxL):
        """A right-padded prompt: the parallel outputs, S after row b's real tokens, and
        its last real input (zeros for an empty row)."""
        del cache  # a prompt starts at position 0
        decoding.require_causal(self, "rwkv7")
        o_BxHxLxV, x, s = self.attend(x_BxLxD, padding_mask_BxL)
        pos_B = decoding.lengths_of(padding_mask_BxL, *x_BxLxD.shape[:2])
        padded = jnp.pad(x, ((0, 0), (1, 0), (0, 0)))  # row b's last real input at pos_b
        shift = jnp.take_along_axis(padded, pos_B[:, None, None], axis=1)[:, 0]
        y = self.o_proj(self.merge_heads(o_BxHxLxV).astype(x_BxLxD.dtype))
        return y, {"pos": pos_B, "s": s, "shift": shift}

    def step(self, cache, x_BxD):
        decoding.require_causal(self, "rwkv7")
        x = x_BxD.astype(jnp.float32)
        real = jnp.ones((x.shape[0], 1), jnp.bool_)
        r, w, k, v, kk, a, g = (t[:, :, 0] for t in self.features(
            self.forward_dir, x[:, None], cache["shift"], real))
        o, s = dplr_step(cache["s"], r, w, k, v, -kk, kk * a)
        o = self.finish(o[:, :, None], *(t[:, :, None] for t in (r, k, v, g)))
        y = self.o_proj(self.merge_heads(o).astype(x_BxD.dtype))[:, 0]
        return y, {"pos": cache["pos"] + 1, "s": s, "shift": x}


@registry.register("rwkv7", capabilities=registry.Capabilities(
    description="RWKV-7 Goose: delta rule with per-channel decay, separate erase key and "
                "in-context learning rate, token shift, chunked DPLR form (Peng et al. "
                "2025); causal=False sums a forward and a backward direction",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5},
    rotary_refusal=("its receptance and keys meet through a recurrent state whose order "
                    "gives positions (RWKV-7 adds no position embedding)"),
    pos_emb="none", receptive_field="global", short_conv_hparam="token_shift"))
def build_rwkv7(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                chunk_size: int | None = None, decay_low_rank_dim: int | None = None,
                a_low_rank_dim: int | None = None, gate_low_rank_dim: int | None = None,
                norm_eps: float = NORM_EPS, token_shift: int = 2) -> RWKV7Attention:
    """fla's RWKV7Attention defaults: key and value widths = dim, head size dim /
    num_heads, low-rank dims by fla's rule unless given, GroupNorm eps head size x 1e-5;
    token_shift 2 taps (0: none, a scaffold's builtin_conv=0); chunk_size by default
    DEFAULT_CHUNK, or CPU_CHUNK where the CPU builds it (linear_scan.backend_chunk)."""
    del max_len  # any length
    if chunk_size is None:
        chunk_size = backend_chunk(DEFAULT_CHUNK, CPU_CHUNK)
    return RWKV7Attention(dim=dim, num_heads=num_heads, causal=causal, chunk_size=chunk_size,
                          decay_low_rank_dim=decay_low_rank_dim,
                          a_low_rank_dim=a_low_rank_dim, gate_low_rank_dim=gate_low_rank_dim,
                          norm_eps=norm_eps, token_shift=token_shift, rngs=rngs)
