"""Log-linear Mamba-2 (Guo, Yang, Goel, Xing, Dao and Kim 2025, "Log-Linear Attention",
arXiv 2506.04761): `loglinear_mamba2`.

Mamba-2's SSD (models/attention/ssd.py) is y = (M o C B^T)(dt x) with the scalar decays
M_ij = exp(sum_{j<s<=i} dt_s A). Log-linear attention splits the prefix 0..i of every query
into O(log i) Fenwick-tree buckets and weighs each bucket by its own data-dependent scale:

    y_i = sum_{j<=i} lambda_i^{l(i,j)} M_ij (C_i . B_j) dt_j x_j + D x_i,
    l(i, j) = bit_length(i XOR j)       (0 on the diagonal; at most ceil(log2 L))

which is fla's `construct_level_mask` (fla/ops/log_linear_attn/naive.py at bc3b101) in
closed form: level l >= 1 of query i is the block of 2^(l-1) keys just before i with its
low l - 1 bits cleared, present when bit l - 1 of i is set. The scales are per head, per
level and per token, lambda_t = softplus(L_h o dl_t) with dl_t = W_dl u_t (H x 15, fla's
in_proj's last columns) and L (H x 15, ones at init; fla's `L`): 15 = fla's MAX_NUM_LEVELS,
enough for 2^14 = 16384 positions. fla fixes it and refuses longer sequences; here
`num_levels` (a model hparam, default: fla's 15, or the levels max_len needs past 16384)
adds levels: 16 up to 32768 positions, one more lambda column per head, a model fla has
no form of. A shorter sequence never reads the extra columns. With every lambda = 1 the
mask is Mamba-2's (tests/models/test_loglinear.py checks it against `ssd.chunk_ssd`).

The block is `ssd.Mamba2` (this class subclasses it): fla's LogLinearMamba2 as its model
builds it (LogLinearMamba2Config -> Mamba2Config's defaults: bias-free in_proj and out_proj,
a 4-tap convolution with bias over [x, B, C], SiLU, D per head, one group, the gated
RMSNorm after the gate, eps 1e-5, expand 2, state 128, chunk 64). fla's layer constructor
alone defaults to use_bias=True and use_conv_bias=False; its model passes the config's, as
here. A = 1..H per head (fla's S4D-real init, not Mamba-2's U(1, 16)); dt_bias as Mamba-2.
Heads: the config's num_heads, head size expand * dim / num_heads (fla fixes 64).

Three forms, equal (tests): `loglinear_reference` (fla's naive: the L x L hierarchical
mask), `chunk_loglinear` (what the layer runs, fla chunk.py's algorithm in O(L log L):
inside an aligned chunk of C = 2^c positions the levels are <= c and the C x C block is
exact; across chunks, levels c + 1 + s come from chunk-level Fenwick states S_s, one per
bit s of the chunk index, which a scan carries and merges as fla's kernel does), and
`loglinear_step` (decoding: the same Fenwick states at token granularity, bit_length(
max_len - 1) of them, each P x N per head; fla's LogLinearAttentionState instead keeps
chunk-level states plus the inputs of its partial 64-token chunk, a layout choice: the
states hold the same sums). Merging: after token (or chunk) t has been added to S_0, the
trailing ones of t are the levels that just filled; S_0 .. S_k (k = their count) are summed
into S_k and the lower ones emptied (fla: `kv_{l+1} += kv_l; kv_l = 0` for each bit of
`(~t & (t + 1)) - 1`). So before token t, slot s holds the keys j with l(t, j) = s + 1,
exactly the slots whose bit s of t is set (the others are zero).

Padding: padded positions neither write nor decay (dt = 0) and enter the convolution as
zeros (ssd.py). They still count as positions of the hierarchy: prompts are right-padded,
so the real positions keep their indices. causal=False: Mamba2's convention, a forward and
a backward scan summed before the gated norm, each with its own convolution, dt_bias,
A_log, D and L (the projections shared). The backward hierarchy is the same Fenwick tree
over each row's real tokens reversed (position n - 1 - i for a row of n real tokens), so
a right-padded row gives what its unpadded prefix gives. fla has no bidirectional form.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention import ssd
from models.attention.delta import CONV_SIZE, NORM_EPS, causal_conv
from models.attention.linear_scan import _pad_to_chunks

DEFAULT_CHUNK = 64  # fla's chunk_log_linear_attn: BT = 64 (its only chunk size)
NUM_LEVELS = 15  # fla's MAX_NUM_LEVELS = ceil(log2 16384) + 1: lambda columns per head


# ----------------------------------------------------------------------------- core math


def bit_length(x: jax.Array) -> jax.Array:
    """Bits of a non-negative int32 (0 for 0): the level of a key at XOR distance x."""
    x = x.astype(jnp.int32)
    return 32 - jax.lax.clz(x)


def trailing_ones(t: jax.Array) -> jax.Array:
    """How many low bits of t are 1: the levels that fill once position (or chunk) t is
    added (t XOR (t + 1) is 2^(k + 1) - 1 for k trailing ones)."""
    t = t.astype(jnp.int32)
    return bit_length(t ^ (t + 1)) - 1


def merge_filled(s_BxSx: jax.Array, t_B: jax.Array) -> jax.Array:
    """fla's merge after t was added to slot 0: slots 0..k (k = trailing_ones(t)) summed
    into slot k, the ones below emptied. A merge past the last slot (the sequence's last
    position) is dropped: no later position reads it."""
    k_B = trailing_ones(t_B)
    slot = jnp.arange(s_BxSx.shape[1]).reshape((1, -1) + (1,) * (s_BxSx.ndim - 2))
    k = k_B.reshape((-1,) + (1,) * (s_BxSx.ndim - 1))
    return jnp.where(slot < k, 0.0, jnp.where(slot == k, jnp.cumsum(s_BxSx, axis=1), s_BxSx))


def _f32(*arrays):
    return tuple(a.astype(jnp.float32) for a in arrays)


def _levels_needed(length: int) -> int:
    """Levels 0..bit_length(L - 1): the lambda columns a sequence of L positions reads."""
    return max(length - 1, 0).bit_length() + 1


def _check_levels(length: int, lam_BxHxLxK: jax.Array) -> None:
    if _levels_needed(length) > lam_BxHxLxK.shape[-1]:
        raise ValueError(f"loglinear: {length} positions need {_levels_needed(length)} "
                         f"levels, lambda has {lam_BxHxLxK.shape[-1]}")


@jax.jit
def loglinear_reference(x_BxHxLxP: jax.Array, log_a_BxHxL: jax.Array, b_BxHxLxN: jax.Array,
                        c_BxHxLxN: jax.Array, lam_BxHxLxK: jax.Array) -> jax.Array:
    """fla's naive_log_linear_attn: y (BxHxLxP, float32, without D) = (H o C B^T) x with
    H_ij = lambda_i^{l(i,j)} exp(sum_{j<s<=i} log_a_s). x already times dt, log_a = dt A."""
    x, log_a, b, c, lam = _f32(x_BxHxLxP, log_a_BxHxL, b_BxHxLxN, c_BxHxLxN, lam_BxHxLxK)
    length = x.shape[2]
    _check_levels(length, lam)
    pos = jnp.arange(length)
    level_LxL = bit_length(pos[:, None] ^ pos[None, :])
    cum = jnp.cumsum(log_a, axis=-1)
    lower = pos[:, None] >= pos[None, :]
    decay = jnp.exp(jnp.where(lower, cum[..., :, None] - cum[..., None, :], -jnp.inf))
    scale = jnp.take_along_axis(lam, jnp.broadcast_to(level_LxL, lam.shape[:2] + level_LxL.shape),
                                axis=-1)  # lambda_i at level l(i, j)
    scores = jnp.einsum("bhin,bhjn->bhij", c, b) * decay * scale
    return jnp.einsum("bhij,bhjp->bhip", scores, x)


@functools.partial(jax.jit, static_argnames=("chunk_size",))
def chunk_loglinear(x_BxHxLxP: jax.Array, log_a_BxHxL: jax.Array, b_BxHxLxN: jax.Array,
                    c_BxHxLxN: jax.Array, lam_BxHxLxK: jax.Array, *,
                    chunk_size: int = DEFAULT_CHUNK) -> jax.Array:
    """`loglinear_reference`'s y, chunk by chunk in O(L log L) (fla's chunkwise_fwd_kernel).
    chunk_size: a power of two (levels are aligned blocks); a sequence shorter than it is
    one chunk of the next power of two. The tail is zero-padded (no write, no decay)."""
    x, log_a, b, c, lam = _f32(x_BxHxLxP, log_a_BxHxL, b_BxHxLxN, c_BxHxLxN, lam_BxHxLxK)
    batch, heads, length, p_dim = x.shape
    n_dim = b.shape[-1]
    _check_levels(length, lam)
    chunk = min(chunk_size, 1 << max(length - 1, 0).bit_length())
    intra = int(math.log2(chunk)) + 1  # levels 0..log2(C) live inside a chunk
    num_chunks = -(-length // chunk)
    slots = max(1, (num_chunks - 1).bit_length())  # chunk-level states (read by bit s)
    # Slot s is level intra + s; columns beyond the sequence's levels are never read.
    lam = jnp.pad(lam, ((0, 0), (0, 0), (0, 0), (0, max(0, intra + slots - lam.shape[-1]))))
    pos = jnp.arange(chunk)
    lower_CxC = pos[:, None] >= pos[None, :]
    onehot_CxCxI = jax.nn.one_hot(bit_length(pos[:, None] ^ pos[None, :]), intra)
    xs = (_pad_to_chunks(x, chunk), _pad_to_chunks(b, chunk), _pad_to_chunks(c, chunk),
          jnp.cumsum(_pad_to_chunks(log_a[..., None], chunk)[..., 0], axis=-1),
          _pad_to_chunks(lam[..., :intra + slots], chunk), jnp.arange(num_chunks))

    @jax.checkpoint  # the backward pass keeps the states at chunk boundaries only
    def body(s_BxSxHxPxN, xs):
        x_BxHxCxP, b_BxHxCxN, c_BxHxCxN, cum_BxHxC, lam_BxHxCxK, index = xs
        # Inside the chunk: the exact C x C block, lambda_i at level l(i, j) <= log2 C.
        decay = jnp.exp(jnp.where(lower_CxC, cum_BxHxC[..., :, None] - cum_BxHxC[..., None, :],
                                  -jnp.inf))
        scale = jnp.einsum("bhik,ijk->bhij", lam_BxHxCxK[..., :intra], onehot_CxCxI)
        scores = jnp.einsum("bhin,bhjn->bhij", c_BxHxCxN, b_BxHxCxN) * decay * scale
        y_BxHxCxP = jnp.einsum("bhij,bhjp->bhip", scores, x_BxHxCxP)
        # Earlier chunks: slot s holds the chunks at chunk level s + 1 (bit s of the index
        # set), decayed to the chunk's start; level intra + s.
        bits_S = (index >> jnp.arange(slots)) & 1
        read_BxHxCxS = (lam_BxHxCxK[..., intra:] * bits_S * jnp.exp(cum_BxHxC)[..., None])
        y_BxHxCxP = y_BxHxCxP + jnp.einsum("bhcs,bhcn,bshpn->bhcp", read_BxHxCxS, c_BxHxCxN,
                                           s_BxSxHxPxN)
        # Decay every slot over the chunk, add the chunk to slot 0, merge the filled levels.
        s_BxSxHxPxN = jnp.exp(cum_BxHxC[..., -1])[:, None, :, None, None] * s_BxSxHxPxN
        to_end = jnp.exp(cum_BxHxC[..., -1:] - cum_BxHxC)[..., None]
        s_BxSxHxPxN = s_BxSxHxPxN.at[:, 0].add(
            jnp.einsum("bhcp,bhcn->bhpn", x_BxHxCxP * to_end, b_BxHxCxN))
        s_BxSxHxPxN = merge_filled(s_BxSxHxPxN, jnp.full((batch,), index))
        return s_BxSxHxPxN, y_BxHxCxP

    s0 = jnp.zeros((batch, slots, heads, p_dim, n_dim), jnp.float32)
    _, y_NxBxHxCxP = jax.lax.scan(body, s0, xs)
    y = y_NxBxHxCxP.transpose(1, 2, 0, 3, 4).reshape(batch, heads, num_chunks * chunk, p_dim)
    return y[:, :, :length]


def loglinear_step(s_BxSxHxPxN: jax.Array, pos_B: jax.Array, x_BxHxP: jax.Array,
                   log_a_BxH: jax.Array, b_BxHxN: jax.Array, c_BxHxN: jax.Array,
                   lam_BxHxK: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One token at position pos (per row): decay the slots by a = exp(log_a), read
    y = lambda^0 (c.b) x + sum_s [bit s of pos] lambda^{s+1} S_s c, add x b^T to slot 0,
    merge the filled levels. Returns y (BxHxP) and the slots."""
    slots = s_BxSxHxPxN.shape[1]
    lam = jnp.pad(lam_BxHxK, ((0, 0), (0, 0), (0, max(0, slots + 1 - lam_BxHxK.shape[-1]))))
    s = jnp.exp(log_a_BxH)[:, None, :, None, None] * s_BxSxHxPxN
    bits_BxS = (pos_B[:, None] >> jnp.arange(slots)) & 1
    read_BxHxS = lam[..., 1:slots + 1] * bits_BxS[:, None, :]
    y = (lam[..., 0:1] * jnp.sum(c_BxHxN * b_BxHxN, -1, keepdims=True) * x_BxHxP
         + jnp.einsum("bhs,bhn,bshpn->bhp", read_BxHxS, c_BxHxN, s))
    s = s.at[:, 0].add(jnp.einsum("bhp,bhn->bhpn", x_BxHxP, b_BxHxN))
    return y, merge_filled(s, pos_B)


def fenwick_states(x_BxHxLxP: jax.Array, log_a_BxHxL: jax.Array, b_BxHxLxN: jax.Array,
                   pos_B: jax.Array, slots: int) -> jax.Array:
    """The slots `loglinear_step` holds before position pos (per row), from the whole
    prompt at once: slot s = sum over j < pos with l(pos, j) = s + 1 of
    exp(sum_{j<r<pos} log_a_r) x_j b_j^T (BxSxHxPxN). Positions from pos on must have
    log_a = 0 (the padded tail), so the decay to pos - 1 is the decay to the end."""
    cum = jnp.cumsum(log_a_BxHxL, axis=-1)
    to_end_BxHxL = jnp.exp(cum[..., -1:] - cum)
    j = jnp.arange(x_BxHxLxP.shape[2])
    level_BxL = jnp.where(j[None] < pos_B[:, None], bit_length(pos_B[:, None] ^ j[None]), 0)
    member_BxSxL = (level_BxL[:, None, :] == jnp.arange(1, slots + 1)[None, :, None])
    return jnp.einsum("bsl,bhl,bhlp,bhln->bshpn", member_BxSxL.astype(jnp.float32),
                      to_end_BxHxL, x_BxHxLxP, b_BxHxLxN)


# ----------------------------------------------------------------------------- modules


def a_log_init(key, shape, dtype=jnp.float32):
    """log A with A = 1, 2, .., H (fla's LogLinearMamba2 and its model's _init_weights)."""
    del key
    return jnp.log(jnp.arange(1, shape[0] + 1, dtype=dtype))


class LevelDirection(ssd.SSDDirection):
    """One scan direction: Mamba-2's convolution, dt_bias, A_log, D, and the level
    weights L (H x num_levels, ones: fla's `L`, no weight decay)."""

    def __init__(self, *, num_heads: int, channels: int, conv_size: int, num_levels: int,
                 rngs: nnx.Rngs):
        super().__init__(num_heads=num_heads, channels=channels, conv_size=conv_size,
                         rngs=rngs)
        self.a_log = layers.param(a_log_init, ("heads",), (num_heads,), rngs=rngs,
                                  no_weight_decay=True, keep_float32=True)
        self.level_weight = layers.param(layers.ones, ("heads", None), (num_heads, num_levels),
                                         rngs=rngs, no_weight_decay=True, keep_float32=True)

    def level_scales(self, dl_xHxK: jax.Array) -> jax.Array:
        """lambda = softplus(L o dl) > 0, ...xHxK float32 (fla's hmamba_chunk_scan_combined)."""
        return jax.nn.softplus(self.level_weight[...] * dl_xHxK.astype(jnp.float32))


class LogLinearMamba2(ssd.Mamba2):
    """`ssd.Mamba2` with per-level weights over a Fenwick hierarchy (module docstring)."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, max_len: int, expand: int,
                 state_size: int, conv_size: int, chunk_size: int, norm_eps: float,
                 num_levels: int | None = None, rngs: nnx.Rngs):
        if chunk_size <= 0 or chunk_size & (chunk_size - 1):
            raise ValueError(f"loglinear_mamba2: chunk_size ({chunk_size}) must be a power of "
                             "two (chunks are aligned blocks of the level hierarchy)")
        if num_levels is None:
            num_levels = max(NUM_LEVELS, _levels_needed(max_len))
        if num_levels < 1:
            raise ValueError(f"loglinear_mamba2: num_levels ({num_levels}) must be >= 1")
        self.num_levels = num_levels
        self.max_length = 2 ** (num_levels - 1)
        if max_len > self.max_length:
            need = _levels_needed(max_len)
            raise ValueError(f"loglinear_mamba2: max_len {max_len} > {self.max_length}: its "
                             f"{num_levels} lambda columns cover 2^{num_levels - 1} positions "
                             f"(fla's MAX_NUM_LEVELS is {NUM_LEVELS}); {max_len} positions "
                             f"need num_levels={need} (or leave it unset)")
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, expand=expand,
                         state_size=state_size, conv_size=conv_size, chunk_size=chunk_size,
                         norm_eps=norm_eps, rngs=rngs)
        # fla's dl: in_proj's last H * num_levels outputs (a projection of its own here).
        self.levels = layers.dense(dim, num_heads * num_levels, ("embed", None),
                                   use_bias=False, rngs=rngs)
        # Mamba2 built SSDDirections; these add L and fla's A init (the others are dropped).
        direction = dict(num_heads=num_heads, channels=self.num_heads * self.head_dim
                         + 2 * state_size, conv_size=conv_size, num_levels=num_levels,
                         rngs=rngs)
        self.forward_scan = LevelDirection(**direction)
        self.backward_scan = None if causal else LevelDirection(**direction)

    def level_inputs(self, u_BxLxD: jax.Array) -> jax.Array:
        """dl, BxLxHxK."""
        dl = self.levels(u_BxLxD)
        return dl.reshape(dl.shape[:-1] + (self.num_heads, self.num_levels))

    def scan(self, direction: LevelDirection, xbc_BxLxC, dt_raw_BxLxH, dl_BxLxHxK, real_BxL):
        """One direction's y + D x (BxHxLxP) and its SSD inputs (x dt, log a, B). Replaces
        Mamba2.scan (the levels' dl is one more input)."""
        w, bias = direction.conv_kernel()
        conv_BxLxC = causal_conv(xbc_BxLxC.astype(jnp.float32)[:, None], w[:, None])[:, 0]
        x, b, c = self.ssd_inputs(jax.nn.silu(conv_BxLxC + bias))
        dt_BxLxH, log_a_BxLxH = direction.steps(dt_raw_BxLxH, real_BxL)
        x_dt = x * dt_BxLxH.transpose(0, 2, 1)[..., None]
        log_a = log_a_BxLxH.transpose(0, 2, 1)
        lam_BxHxLxK = direction.level_scales(dl_BxLxHxK).transpose(0, 2, 1, 3)
        y = chunk_loglinear(x_dt, log_a, b, c, lam_BxHxLxK, chunk_size=self.chunk_size)
        return y + direction.d[...][:, None, None] * x, (x_dt, log_a, b)

    def forward(self, u_BxLxD, padding_mask, with_state: bool = True):
        """Outputs BxLxD, the forward direction's SSD inputs (prefill's states are built
        from them) and the masked convolution inputs."""
        del with_state  # always available (no kernel path)
        batch, length = u_BxLxD.shape[:2]
        real_BxL = layers.valid_mask(padding_mask, batch, length)
        z, xbc, dt_raw = self.conv_inputs(u_BxLxD)
        dl = self.level_inputs(u_BxLxD)
        xbc = jnp.where(real_BxL[..., None], xbc, 0.0)  # no window reads a padded input
        y, inputs = self.scan(self.forward_scan, xbc, dt_raw, dl, real_BxL)
        if self.backward_scan is not None:
            # Each row's n real tokens reversed (n - 1 - i), its padding after them: the
            # map is its own inverse, and a padded row's hierarchy is its prefix's.
            n_B = decoding.lengths_of(padding_mask, batch, length)
            rev_BxL = jnp.mod(n_B[:, None] - 1 - jnp.arange(length)[None], length)
            flip = lambda t: jnp.take_along_axis(  # noqa: E731
                t, rev_BxL.reshape(rev_BxL.shape + (1,) * (t.ndim - 2)), axis=1)
            y_back, _ = self.scan(self.backward_scan, flip(xbc), flip(dt_raw), flip(dl),
                                 flip(real_BxL))
            y = y + jnp.take_along_axis(y_back, rev_BxL[:, None, :, None], axis=2)
        return self.finish(y, z), inputs, xbc

    # ------------------------------------------------------------------ decoding
    # "recurrent_state": the Fenwick slots (BxSxHxPxN, S = bit_length(max_len - 1)) and
    # the convolution's last conv_size - 1 inputs.

    def _check_decodes(self) -> None:
        if not self.causal:
            raise decoding.DecodingError("loglinear_mamba2 was built with causal=False; only "
                                         "the causal form reads its states one token at a time")

    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        self._check_decodes()
        if max_len > self.max_length:
            raise decoding.DecodingError(f"loglinear_mamba2 decodes at most {self.max_length} "
                                         f"positions ({self.num_levels} levels), asked for "
                                         f"{max_len}")
        slots = max(1, (max_len - 1).bit_length())
        channels = self.num_heads * self.head_dim + 2 * self.state_size
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "h": jnp.zeros((batch, slots, self.num_heads, self.head_dim, self.state_size)),
                "conv": jnp.zeros((batch, max(self.conv_size - 1, 0), channels))}

    def prefill(self, cache, u_BxLxD, padding_mask):
        """The parallel outputs of a right-padded prompt and the slots and window after
        each row's real tokens."""
        self._check_decodes()
        y_BxLxD, (x_dt, log_a, b), xbc_BxLxC = self.forward(u_BxLxD, padding_mask)
        batch, length = u_BxLxD.shape[:2]
        pos_B = decoding.lengths_of(padding_mask, batch, length)
        h = fenwick_states(x_dt, log_a, b, pos_B, cache["h"].shape[1])
        return y_BxLxD, {"pos": pos_B, "h": h, "conv": self.conv_window(xbc_BxLxC, pos_B)}

    def step(self, cache, u_BxD):
        self._check_decodes()
        direction = self.forward_scan
        z, x, b, c, dt_raw, window = self.step_inputs(direction, cache, u_BxD)
        dl_BxHxK = self.level_inputs(u_BxD)
        dt_BxH, log_a_BxH = direction.steps(dt_raw[:, 0], jnp.ones(u_BxD.shape[:1], jnp.bool_))
        y_BxHxP, h = loglinear_step(cache["h"], cache["pos"], x * dt_BxH[..., None], log_a_BxH,
                                    b, c, direction.level_scales(dl_BxHxK))
        y_BxHxP = y_BxHxP + direction.d[...][:, None] * x
        y_BxD = self.finish(y_BxHxP[:, :, None], z)[:, 0]
        return y_BxD, {"pos": cache["pos"] + 1, "h": h, "conv": window}


@registry.register("loglinear_mamba2", capabilities=registry.Capabilities(
    description="Log-linear Mamba-2: Mamba-2's SSD with per-head, per-level data-dependent "
                "weights over a Fenwick hierarchy of O(log L) states, chunked O(L log L) "
                "(Guo et al. 2025; fla's LogLinearMamba2); causal=False sums a forward and "
                "a backward scan",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 4, "state_size": 16},
    rotary_refusal="its C.B products are read through Fenwick states whose order gives "
    "positions (the paper adds no position embedding)",
    # As mamba2: fla's LogLinearMamba2 model adds no position table.
    pos_emb="none", short_conv_hparam="conv_size"))
def build_loglinear_mamba2(*, dim: int, num_heads: int, max_len: int, causal: bool,
                           rngs: nnx.Rngs, expand: int = 2, state_size: int = ssd.STATE_SIZE,
                           conv_size: int = CONV_SIZE, chunk_size: int = DEFAULT_CHUNK,
                           norm_eps: float = NORM_EPS,
                           num_levels: int | None = None) -> LogLinearMamba2:
    """fla's LogLinearMamba2 as its model builds it (expand 2, state 128, conv 4 with bias,
    chunk 64, a power of two here); heads are the config's. num_levels: fla's 15 (2^14 =
    16384 positions), or what max_len needs past that; a value given must cover max_len."""
    return LogLinearMamba2(dim=dim, num_heads=num_heads, causal=causal, max_len=max_len,
                           expand=expand, state_size=state_size, conv_size=conv_size,
                           chunk_size=chunk_size, norm_eps=norm_eps, num_levels=num_levels,
                           rngs=rngs)
