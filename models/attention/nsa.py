"""Native Sparse Attention (`nsa`; Yuan et al. 2025, "Native Sparse Attention: Hardware-
Aligned and Natively Trainable Sparse Attention", arXiv 2502.11089), as fla-org/flash-
linear-attention's `NativeSparseAttention` (fla/layers/nsa.py, fla/ops/nsa/naive.py at
bc3b101). Per query token t (0-based) and query head h of kv group g(h) (GQA: G query
heads share one key/value head, as fla's `repeat(..., '(h g)')`), with scale K^-1/2:

    compressed  o_cmp = softmax_c(q . kc_c) vc_c over the blocks c complete at t,
                (c + 1) * block_size - 1 <= t; kc_c, vc_c: the mean of block c's keys,
                values (fla's mean_pooling); no complete block (t < block_size - 1): 0.
    selected    o_slc = softmax over the keys j <= t of the block_counts blocks chosen
                per kv group by p_c = mean over the group's heads of the compressed
                branch's softmax probabilities; blocks 0, own - 1 and own = t //
                block_size are forced (always chosen); candidates
                are the complete blocks and the forced ones, never a later block.
                Fewer candidates than block_counts: the free slots are empty (fla's -1).
    window      o_swa = softmax over the window_size keys t - window_size + 1 .. t
                (flash_attn's window (window_size - 1, 0)); window_size 0: no branch.
    o = sigmoid(g_slc) o_slc + sigmoid(g_cmp) o_cmp + sigmoid(g_swa) o_swa, the three gates
    per head from one bias-free linear (fla's g_proj, its columns (h, 3)), then the
    bias-free output projection. q/k/v projections biased only with qkv_bias (fla: False).

The choice is discrete: no gradient reaches it (fla's top-k returns integer indices);
gradients reach q, k, v through all three branches, k and v through the block means.
Rotary (rotary=True, the encoder's pos_emb='rotary'; fla always rotates): queries and
keys rotated by position before the branches, so the block means pool rotated keys, as
fla's. Ours is models.layers.rotary (pairs 2i, 2i+1); fla's RotaryEmbedding rotates
halves (i, i + K/2): the same map up to a fixed permutation of the q and k projections'
columns (scripts/fla_comparison/nsa_fla.py applies it).

Deviations from fla (none arises in the comparison, results/cpu/nsa_vs_fla.md: groups
of 16, no tied scores, right padding): (1) no GQA constraint: fla's Triton
kernels need G a power of 2 >= 16; here any num_kv_heads dividing num_heads (default
num_heads // 16 where that is >= 1, fla's G = 16, else 1). (2) Ties: fla's top-k (torch
topk / a bitonic sort) breaks equal scores in no stated order; ours takes the lower block
index (jax.lax.top_k), and forced blocks score above 1 (fla: 1.0, which a mean probability
can equal), the own block first, then own - 1 (and own + 1), then block 0: they differ
only where scores tie exactly, e.g. block_counts below the number of forced blocks.
(3) Padding: fla unpads (cu_seqlens) and renumbers positions from each sequence's first
real token; ours keeps positions and excludes padded keys from the block means, the
candidates (a block without a real key is never chosen or attended) and all three
softmaxes: the same numbers for right padding (a prefix of real tokens, the library's
padding and decoding convention), not for left padding (block boundaries and rotary
positions then count the padding).

causal=False (LRA's classifiers; NSA is causal), ours, as moba's: every block with a
real key is complete and a candidate, the forced blocks are 0, own - 1, own, own + 1, the
window is two-sided (|t - j| <= window_size - 1). Every real key then reaches every
output through the block means ("global"), as it does causally for j <= t.

Computation: the compressed branch is dense over the L / block_size block means (Q x N
logits). The selected branch gathers each query's block_counts x block_size keys
(O(L S block_size) memory): models/kernels' block-sparse attention takes a static
(host-side) layout per query block, and NSA's tables are chosen per query token from its
content, so they cannot be one; the masked softmax is dense.attend_logits' convention.
The window is a static pattern and goes through models.kernels.block_sparse_attention
(masks.local, XLA backend: O(L window) work) in the parallel form.
attention_impl='flash' (the config argument every task config takes) computes the
selected branch with the O(L)-memory chunked softmax of models/kernels/chunked_attention.py
instead, the chosen blocks as its per-query table of blocks (Q x N booleans per head, not
Q x S x block_size gathered keys): the same numbers (tests/models/test_nsa.py), memory
O(L N) instead of O(L S block_size), but the compute of every tile one of whose queries
chose one of its blocks (most tiles at long L) where the gather reads only the chosen keys.

Decoding (kv_cache): every cached key and value (the selection can reach any block);
each step recomputes the block means over the cache and chooses as the parallel form
does at that position; its window is a mask over the cache.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, masks, registry
from models.kernels.block_sparse_attention import block_sparse_attention
from models.kernels.chunked_attention import chunked_attention

IMPLS = ("dense", "flash")  # the selected branch gathered, or chunked (module docstring)

# fla's layer defaults (fla/layers/nsa.py NativeSparseAttention.__init__).
BLOCK_SIZE, BLOCK_COUNTS, WINDOW_SIZE = 64, 16, 512
FLA_GROUP = 16  # fla's num_heads / num_kv_heads (64 / 4), the smallest its kernels take
_FILL = jnp.finfo(jnp.float32).min  # a finite fill: an empty row stays finite


def _masked_softmax(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """softmax over the last axis where mask (float32); a row without a True is all 0
    (dense.attend_logits' convention, fla's nan_to_num(nan=0))."""
    w = jax.nn.softmax(jnp.where(mask, logits.astype(jnp.float32), _FILL), axis=-1)
    return jnp.where(mask, w, 0.0)


def block_means(k_BxGxKvxK: jax.Array, valid_BxKv: jax.Array,
                block_size: int) -> tuple[jax.Array, jax.Array]:
    """(mean of each block's real keys BxGxNxK, number of real keys BxN); N = ceil(Kv /
    block_size). An incomplete last block is the mean of what it has (fla's mean_pooling)."""
    b, g, kv_len, dim = k_BxGxKvxK.shape
    n = -(-kv_len // block_size)
    pad = n * block_size - kv_len
    valid = jnp.pad(valid_BxKv.astype(k_BxGxKvxK.dtype), ((0, 0), (0, pad)))
    k = jnp.pad(k_BxGxKvxK, ((0, 0), (0, 0), (0, pad), (0, 0)))
    count_BxN = valid.reshape(b, n, block_size).sum(-1)
    sums = jnp.einsum("bgnck,bnc->bgnk", k.reshape(b, g, n, block_size, dim),
                      valid.reshape(b, n, block_size))
    return sums / jnp.maximum(count_BxN, 1.0)[:, None, :, None], count_BxN


def visible_blocks(q_pos_BxQ: jax.Array, count_BxN: jax.Array, *, block_size: int,
                   causal: bool) -> jax.Array:
    """bool BxQxN: the blocks the compressed branch reads (complete at the query, causal)."""
    real = (count_BxN > 0)[:, None, :]
    if not causal:
        return real
    c = jnp.arange(count_BxN.shape[-1])
    return real & ((c + 1) * block_size - 1 <= q_pos_BxQ[..., None])


def choose_blocks(probs_BxGxHgxQxN: jax.Array, visible_BxQxN: jax.Array,
                  count_BxN: jax.Array, q_pos_BxQ: jax.Array, *, block_size: int,
                  block_counts: int, causal: bool) -> jax.Array:
    """int32 BxGxQxS (S = block_counts): each kv group's chosen blocks per query, -1 for an
    empty slot (fla's naive_nsa_topk)."""
    n = count_BxN.shape[-1]
    c = jnp.arange(n)
    own = (q_pos_BxQ // block_size)[..., None]
    forced = (c == 0) | (c == own) | (c == own - 1)
    if not causal:
        forced = forced | (c == own + 1)
    allowed = (visible_BxQxN | forced) & (count_BxN > 0)[:, None, :]
    # A choice, no gradient (fla's indices are integers). Group mean, as fla's naive (its
    # kernel sums over the group: the same order). fla scores forced blocks 1.0, which a
    # mean probability can equal, and orders equal scores in no stated way; ours scores
    # them above 1 (always chosen, as fla states), own block first, then its neighbours,
    # then block 0, for block_counts below the number of forced blocks.
    score = jax.lax.stop_gradient(probs_BxGxHgxQxN).mean(axis=2)
    priority = jnp.where(c == own, 4.0, jnp.where(c == 0, 2.0, 3.0))
    score = jnp.where(forced[:, None], priority[:, None], score)
    score = jnp.where(allowed[:, None], score, -jnp.inf)
    top, idx = jax.lax.top_k(score, min(block_counts, n))
    idx = jnp.where(top > -jnp.inf, idx, -1).astype(jnp.int32)
    if block_counts > n:
        idx = jnp.pad(idx, ((0, 0),) * 3 + ((0, block_counts - n),), constant_values=-1)
    return idx


def selected_attention(q_BxGxHgxQxK: jax.Array, k_BxGxKvxK: jax.Array,
                       v_BxGxKvxD: jax.Array, idx_BxGxQxS: jax.Array, valid_BxKv: jax.Array,
                       q_pos_BxQ: jax.Array, *, block_size: int, causal: bool) -> jax.Array:
    """Softmax over the keys of the chosen blocks (real, and j <= t causally); each query
    gathers its S x block_size keys. Returns BxGxHgxQxD (fla's naive_nsa_selection)."""
    b, g, kv_len, _ = k_BxGxKvxK.shape
    pos = (idx_BxGxQxS[..., None] * block_size + jnp.arange(block_size))
    pos = pos.reshape(*idx_BxGxQxS.shape[:3], -1)  # BxGxQxT, T = S * block_size
    safe = jnp.clip(pos, 0, kv_len - 1)
    bi = jnp.arange(b)[:, None, None, None]
    gi = jnp.arange(g)[None, :, None, None]
    ok = (jnp.repeat(idx_BxGxQxS >= 0, block_size, axis=-1) & (pos < kv_len)
          & valid_BxKv.astype(jnp.bool_)[bi, safe])
    if causal:
        ok = ok & (pos <= q_pos_BxQ[:, None, :, None])
    k_sel, v_sel = k_BxGxKvxK[bi, gi, safe], v_BxGxKvxD[bi, gi, safe]  # BxGxQxTxF
    logits = jnp.einsum("bghqk,bgqtk->bghqt", q_BxGxHgxQxK, k_sel,
                        preferred_element_type=jnp.float32)
    w = _masked_softmax(logits / math.sqrt(q_BxGxHgxQxK.shape[-1]), ok[:, :, None])
    return jnp.einsum("bghqt,bgqtd->bghqd", w.astype(v_sel.dtype), v_sel)


def chunked_selected_attention(q_BxHxLxK: jax.Array, k_BxGxLxK: jax.Array,
                               v_BxGxLxD: jax.Array, idx_BxGxLxS: jax.Array,
                               valid_BxL: jax.Array, *, block_size: int,
                               causal: bool) -> jax.Array:
    """selected_attention for queries at the positions of the keys (the parallel form),
    as the chunked O(L)-memory softmax with the chosen blocks as its table; BxHxLxD."""
    b, h, length, _ = q_BxHxLxK.shape
    n = -(-length // block_size)
    chosen_BxGxLxN = jnp.any(idx_BxGxLxS[..., None] == jnp.arange(n), axis=-2)
    rep = lambda x: jnp.repeat(x, h // x.shape[1], axis=1)  # noqa: E731  GQA: h // G
    return chunked_attention(q_BxHxLxK, rep(k_BxGxLxK), rep(v_BxGxLxD),
                             masks.causal() if causal else None, valid_BxKv=valid_BxL,
                             key_blocks=(rep(chosen_BxGxLxN), block_size))


def nsa_branches(q_BxHxQxK: jax.Array, k_BxGxKvxK: jax.Array, v_BxGxKvxD: jax.Array,
                 valid_BxKv: jax.Array, q_pos_BxQ: jax.Array, *, block_size: int,
                 block_counts: int, causal: bool, block_idx: jax.Array | None = None,
                 chunked: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(o_cmp, o_slc BxHxQxD, chosen blocks BxGxQxS): the compressed and selected branches
    for queries at q_pos_BxQ over keys at positions 0..Kv-1. `block_idx` (BxGxQxS, -1 =
    empty) overrides the choice, as naive_nsa's `block_indices`. `chunked`: the selected
    branch as chunked_selected_attention (queries at 0..Kv-1 only)."""
    b, h, q_len, dim = q_BxHxQxK.shape
    g = k_BxGxKvxK.shape[1]
    q = q_BxHxQxK.reshape(b, g, h // g, q_len, dim)
    kc, count_BxN = block_means(k_BxGxKvxK, valid_BxKv, block_size)
    vc, _ = block_means(v_BxGxKvxD, valid_BxKv, block_size)
    visible = visible_blocks(q_pos_BxQ, count_BxN, block_size=block_size, causal=causal)
    logits = jnp.einsum("bghqk,bgnk->bghqn", q, kc,
                        preferred_element_type=jnp.float32) / math.sqrt(dim)
    probs = _masked_softmax(logits, visible[:, None, None])
    o_cmp = jnp.einsum("bghqn,bgnd->bghqd", probs.astype(vc.dtype), vc)
    if block_idx is None:
        block_idx = choose_blocks(probs, visible, count_BxN, q_pos_BxQ,
                                  block_size=block_size, block_counts=block_counts,
                                  causal=causal)
    merge = lambda o: o.reshape(b, h, q_len, -1)  # noqa: E731
    if chunked:
        o_slc = chunked_selected_attention(q_BxHxQxK, k_BxGxKvxK, v_BxGxKvxD, block_idx,
                                           valid_BxKv, block_size=block_size, causal=causal)
    else:
        o_slc = merge(selected_attention(q, k_BxGxKvxK, v_BxGxKvxD, block_idx, valid_BxKv,
                                         q_pos_BxQ, block_size=block_size, causal=causal))
    return merge(o_cmp), o_slc, block_idx


def window_pattern(window_size: int, causal: bool) -> masks.Pattern:
    """The window branch's keys: t - window_size + 1 .. t (and as far after, causal=False)."""
    return masks.local(window_size - 1, after=0 if causal else None)


def parallel_nsa(q_BxHxLxK: jax.Array, k_BxGxLxK: jax.Array, v_BxGxLxD: jax.Array,
                 gates: tuple[jax.Array, jax.Array, jax.Array], valid_BxL: jax.Array, *,
                 block_size: int, block_counts: int, window_size: int, causal: bool,
                 block_idx: jax.Array | None = None, chunked: bool = False
                 ) -> tuple[jax.Array, jax.Array]:
    """(o BxHxLxD, chosen blocks BxGxLxS): fla's parallel_nsa / naive_nsa on rotated
    q, k, v and the gates (g_cmp, g_slc, g_swa), each BxHxL after the sigmoid.
    `chunked`: the selected branch in O(L) memory (nsa_branches)."""
    b, h, length, _ = q_BxHxLxK.shape
    pos_BxL = jnp.broadcast_to(jnp.arange(length)[None], (b, length))
    o_cmp, o_slc, block_idx = nsa_branches(
        q_BxHxLxK, k_BxGxLxK, v_BxGxLxD, valid_BxL, pos_BxL, block_size=block_size,
        block_counts=block_counts, causal=causal, block_idx=block_idx, chunked=chunked)
    g_cmp, g_slc, g_swa = (gt[..., None] for gt in gates)
    o = g_slc * o_slc + g_cmp * o_cmp
    if window_size > 0:
        rep = lambda x: jnp.repeat(x, h // x.shape[1], axis=1)  # noqa: E731  GQA: h // G
        o = o + g_swa * block_sparse_attention(
            q_BxHxLxK, rep(k_BxGxLxK), rep(v_BxGxLxD), window_pattern(window_size, causal),
            padding_mask=valid_BxL, backend="xla")
    return o, block_idx


class NativeSparseAttention(nnx.Module):
    """NSA (module docstring): projections `query`, `key`, `value` (fla's q/k/v_proj),
    `gate` (g_proj) and `out` (o_proj)."""

    def __init__(self, *, dim: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 causal: bool, block_size: int, block_counts: int, window_size: int,
                 qkv_bias: bool, rotary: bool, rngs: nnx.Rngs, attention_impl: str = "dense"):
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads "
                             f"({num_heads})")
        if block_size < 1 or block_counts < 1 or window_size < 0:
            raise ValueError(f"block_size ({block_size}) and block_counts ({block_counts}) "
                             f"must be positive, window_size ({window_size}) >= 0")
        if rotary and head_dim % 2:
            raise ValueError(f"pos_emb='rotary' rotates pairs of a head's features; the head "
                             f"size {head_dim} is odd")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.causal, self.rotary, self.attention_impl = causal, rotary, attention_impl
        self.block_size, self.block_counts, self.window_size = (block_size, block_counts,
                                                                window_size)
        kv_dim = num_kv_heads * head_dim
        self.query = layers.dense(dim, num_heads * head_dim, ("embed", "qkv"),
                                  use_bias=qkv_bias, rngs=rngs)
        self.key = layers.dense(dim, kv_dim, ("embed", "qkv"), use_bias=qkv_bias, rngs=rngs)
        self.value = layers.dense(dim, kv_dim, ("embed", "qkv"), use_bias=qkv_bias, rngs=rngs)
        self.gate = layers.dense(dim, num_heads * 3, ("embed", None), use_bias=False,
                                 rngs=rngs)
        self.out = layers.dense(num_heads * head_dim, dim, ("qkv", "embed"), use_bias=False,
                                rngs=rngs)

    def _heads(self, x_BxLxF: jax.Array, pos) -> jax.Array:
        b, length, f = x_BxLxF.shape
        x = x_BxLxF.reshape(b, length, f // self.head_dim, self.head_dim).transpose(0, 2, 1, 3)
        return layers.rotary(x, pos) if self.rotary and pos is not None else x

    def project(self, x_BxLxD: jax.Array, pos) -> tuple[jax.Array, ...]:
        """q BxHxLxK, k and v BxGxLxK (rotated at `pos`, broadcast against BxHxL, under
        rotary), the gates (cmp, slc, swa), each BxHxL after the sigmoid."""
        q, k = self._heads(self.query(x_BxLxD), pos), self._heads(self.key(x_BxLxD), pos)
        v = self._heads(self.value(x_BxLxD), None)
        b, length, _ = x_BxLxD.shape
        gates = jax.nn.sigmoid(self.gate(x_BxLxD).reshape(b, length, self.num_heads, 3))
        return q, k, v, tuple(gates[..., i].transpose(0, 2, 1) for i in range(3))

    def merge(self, o_BxHxLxK: jax.Array) -> jax.Array:
        b, h, length, k = o_BxHxLxK.shape
        return self.out(o_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, length, h * k))

    def _repeat(self, x_BxGxLxF: jax.Array) -> jax.Array:
        return jnp.repeat(x_BxGxLxF, self.num_heads // self.num_kv_heads, axis=1)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        del deterministic  # fla's NSA has no dropout
        b, length = x_BxLxD.shape[:2]
        q, k, v, gates = self.project(x_BxLxD, jnp.arange(length))
        o, _ = parallel_nsa(q, k, v, gates, layers.valid_mask(padding_mask, b, length),
                            block_size=self.block_size, block_counts=self.block_counts,
                            window_size=self.window_size, causal=self.causal,
                            chunked=self.attention_impl == "flash")
        return self.merge(o)

    # ------------------------------------------------------------------ decoding

    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        decoding.require_causal(self, "nsa")
        shape = (batch, self.num_kv_heads, max_len, self.head_dim)
        return {"pos": jnp.zeros((batch,), jnp.int32), "k": jnp.zeros(shape, jnp.float32),
                "v": jnp.zeros(shape, jnp.float32)}

    def prefill(self, cache: decoding.Cache, x_BxLxD: jax.Array,
                padding_mask: jax.Array | None) -> tuple[jax.Array, decoding.Cache]:
        decoding.require_causal(self, "nsa")
        b, length = x_BxLxD.shape[:2]
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask)
        _, k, v, _ = self.project(x_BxLxD, jnp.arange(length))
        real = layers.valid_mask(padding_mask, b, length)[:, None, :, None]
        put = lambda buf, t: jax.lax.dynamic_update_slice(  # noqa: E731
            buf, jnp.where(real, t, 0.0).astype(jnp.float32), (0, 0, 0, 0))
        return y_BxLxD, {"pos": decoding.lengths_of(padding_mask, b, length),
                         "k": put(cache["k"], k), "v": put(cache["v"], v)}

    def step(self, cache: decoding.Cache, x_BxD: jax.Array) -> tuple[jax.Array, decoding.Cache]:
        decoding.require_causal(self, "nsa")
        pos_B = cache["pos"]
        q, k, v, gates = self.project(x_BxD[:, None], pos_B[:, None, None])
        write = lambda buf, t: decoding.write_row(  # noqa: E731
            buf.swapaxes(1, 2), pos_B, t[:, :, 0]).swapaxes(1, 2)
        k_cache, v_cache = write(cache["k"], k), write(cache["v"], v)
        k_all, v_all = k_cache.astype(q.dtype), v_cache.astype(q.dtype)
        j_M = jnp.arange(k_all.shape[2])
        seen_BxM = j_M[None] <= pos_B[:, None]
        o_cmp, o_slc, _ = nsa_branches(q, k_all, v_all, seen_BxM, pos_B[:, None],
                                       block_size=self.block_size,
                                       block_counts=self.block_counts, causal=True)
        g_cmp, g_slc, g_swa = (gt[..., None] for gt in gates)
        o = g_slc * o_slc + g_cmp * o_cmp
        if self.window_size > 0:  # the window as a mask over the cache (O(M) per step)
            in_window = seen_BxM & (j_M[None] > pos_B[:, None] - self.window_size)
            logits = jnp.einsum("bhqk,bhmk->bhqm", q, self._repeat(k_all),
                                preferred_element_type=jnp.float32) / math.sqrt(self.head_dim)
            w = _masked_softmax(logits, in_window[:, None, None])
            o = o + g_swa * jnp.einsum("bhqm,bhmd->bhqd", w.astype(q.dtype),
                                       self._repeat(v_all))
        y_BxD = self.merge(o)[:, 0]
        return y_BxD, {"pos": pos_B + 1, "k": k_cache, "v": v_cache}


@registry.register("nsa", capabilities=registry.Capabilities(
    description="Native Sparse Attention (DeepSeek, Yuan et al. 2025; fla's layer): "
                "gated sum of attention over mean-pooled key blocks, over the top "
                "block_counts blocks they score per kv group, and a sliding window; "
                "causal=False chooses among all blocks, window both sides",
    causal=True, decode="kv_cache", padding=True, variable_length=True,
    test_hparams={"block_size": 2, "block_counts": 4, "window_size": 2},
    rotary=True, receptive_field="global"))
def build_nsa(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
              rotary: bool = False, qkv_dim: int | None = None,
              num_kv_heads: int | None = None, qkv_bias: bool = False,
              block_size: int = BLOCK_SIZE, block_counts: int = BLOCK_COUNTS,
              window_size: int = WINDOW_SIZE,
              attention_impl: str = "dense") -> NativeSparseAttention:
    """fla's NativeSparseAttention defaults (block_size 64, block_counts 16, window 512,
    qkv_bias False). qkv_dim / num_heads is the head size (fla's head_dim); num_kv_heads
    defaults to num_heads // 16 (fla's group of 16) where that is >= 1, else 1.
    attention_impl: 'dense' (the gathered selected branch) or 'flash' (module docstring)."""
    del max_len  # any length
    if attention_impl not in IMPLS:
        raise registry.RegistryError(
            f"nsa: attention_impl={attention_impl!r} is not available; use 'dense' or "
            "'flash' (the selected branch in the chunked O(L)-memory form; its blocks are "
            "chosen by content, so the static block-sparse forms do not apply)")
    qkv_dim = dim if qkv_dim is None else qkv_dim
    if num_heads <= 0 or qkv_dim % num_heads:
        raise ValueError(f"qkv_dim ({qkv_dim}) must be a positive multiple of num_heads "
                         f"({num_heads})")
    if num_kv_heads is None:
        num_kv_heads = max(1, num_heads // FLA_GROUP)
    return NativeSparseAttention(dim=dim, num_heads=num_heads, num_kv_heads=int(num_kv_heads),
                                 head_dim=qkv_dim // num_heads, causal=causal,
                                 block_size=int(block_size), block_counts=int(block_counts),
                                 window_size=int(window_size), qkv_bias=bool(qkv_bias),
                                 rotary=rotary, rngs=rngs, attention_impl=attention_impl)
