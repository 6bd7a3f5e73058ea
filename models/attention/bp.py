"""BP-Transformer (Ye et al. 2019): attention over a binary partition of the sequence.

Tokens are the leaves of a binary tree; a span node at level l >= 1 covers the
2^l consecutive tokens [m 2^l, (m+1) 2^l) (the last node of a level may be cut
short by the sequence end). Each query attends, fine to coarse, to its level-0
neighbour tokens and, per level, to the nearest span nodes on each side that
lie beyond what the lower levels already cover, so the context grows
geometrically: O(k log L) keys per query.

Per side, level l contributes k nodes of size 2^l, plus one more when needed
to end on a multiple of 2^(l+1) (so that level l+1 can continue with aligned
nodes): the selected nodes tile a contiguous interval around the query with no
gap and no overlap. The top level (`max_level`) takes exactly k nodes.

Deviations from the paper, for a drop-in token mixer:
- span nodes are not persistent states updated by their own attention; each
  layer rebuilds their keys/values as the mean of their real (unpadded) tokens'
  key/value projections, and only tokens are queries;
- no relative position embeddings per (level, offset);
- computed densely: a masked softmax over [L tokens; N span nodes] (N < L),
  with the static mask built on the host. There is no block-sparse path.

With causal=True only tokens <= i and span nodes entirely in the past are kept
(the left side of the tree), which is the paper's autoregressive form.

rotary: token queries and keys are rotated by position before a span node's key is
taken as the mean of its tokens' keys, so q_i . mean_j R_j k_j is a mean of terms that
each depend on the offset j - i only (in place of the paper's per-(level, offset)
relative embeddings).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import layers, registry
from models.attention.dense import MultiHeadAttention, dot_product_attention


def num_levels(max_len: int) -> int:
    """ceil(log2(max_len)): the level whose single node spans max_len tokens."""
    return max(0, math.ceil(math.log2(max(max_len, 1))))


def span_nodes(length: int, max_level: int) -> np.ndarray:
    """(level, start, end) of every span node with start < length, level 1..max_level.

    Rows are ordered by level, then start; `end` is nominal (start + 2^level),
    not clipped to `length`.
    """
    rows = [(lv, a, a + 2 ** lv) for lv in range(1, max_level + 1)
            for a in range(0, length, 2 ** lv)]
    return np.asarray(rows, np.int64).reshape(-1, 3)


def frontiers(pos_Q: np.ndarray, k: int, max_level: int) -> tuple[np.ndarray, np.ndarray]:
    """Left (inclusive) and right (exclusive) bounds covered after each level.

    Returns (left_QxT, right_QxT) with T = max_level + 1 and column l the bound
    after level l; level l's nodes lie in [left[l], left[l-1]) and
    [right[l-1], right[l]), with left[-1] = i and right[-1] = i + 1.
    """
    left, right = pos_Q.astype(np.int64), pos_Q.astype(np.int64) + 1
    lefts, rights = [], []
    for lv in range(max_level + 1):
        size = 2 ** lv
        left, right = left - k * size, right + k * size
        if lv < max_level:  # round outwards to a multiple of the next level's size
            left = (left // (2 * size)) * (2 * size)
            right = -((-right) // (2 * size)) * (2 * size)
        lefts.append(left)
        rights.append(right)
    return np.stack(lefts, 1), np.stack(rights, 1)


def bp_mask(length: int, k: int, max_level: int, causal: bool = False) -> np.ndarray:
    """Bool L x (L + N): query i -> [tokens; span nodes of `span_nodes(L, max_level)`]."""
    pos_Q = np.arange(length)
    left_QxT, right_QxT = frontiers(pos_Q, k, max_level)
    j_1xL = pos_Q[None, :]
    tokens_QxL = (left_QxT[:, :1] <= j_1xL) & (j_1xL < right_QxT[:, :1])
    if causal:
        tokens_QxL &= j_1xL <= pos_Q[:, None]
    nodes = span_nodes(length, max_level)
    lv_N, start_N, end_N = nodes[:, 0], nodes[:, 1], nodes[:, 2]
    # Bounds before and after each node's level (columns l - 1 and l), per query.
    inner_l_QxN, outer_l_QxN = left_QxT[:, lv_N - 1], left_QxT[:, lv_N]
    inner_r_QxN, outer_r_QxN = right_QxT[:, lv_N - 1], right_QxT[:, lv_N]
    nodes_QxN = (outer_l_QxN <= start_N) & (end_N <= inner_l_QxN)
    if not causal:
        nodes_QxN |= (inner_r_QxN <= start_N) & (end_N <= outer_r_QxN)
    return np.concatenate([tokens_QxL, nodes_QxN], axis=1)


def pooling_matrix(length: int, max_level: int) -> np.ndarray:
    """N x L: 1 where token j lies in span node n (a node's tokens, before normalising)."""
    nodes = span_nodes(length, max_level)
    j_1xL = np.arange(length)[None, :]
    return (nodes[:, 1:2] <= j_1xL) & (j_1xL < nodes[:, 2:3])


class BPAttention(MultiHeadAttention):
    """Tokens attend to [tokens; mean-pooled span nodes] under the BP-Transformer mask."""

    def __init__(self, *, k: int, max_level: int, **kwargs):
        super().__init__(**kwargs)
        if k < 1 or max_level < 0:
            raise registry.RegistryError(
                f"bp_transformer: need k >= 1 and max_level >= 0, got k={k}, "
                f"max_level={max_level}")
        self.k = k
        self.max_level = max_level

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        b, length, _ = x_BxLxD.shape
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        real_BxL = layers.valid_mask(padding_mask, b, length)
        # Static on the host: the shapes depend only on L.
        pool_NxL = jnp.asarray(pooling_matrix(length, self.max_level))
        allowed_LxLN = jnp.asarray(bp_mask(length, self.k, self.max_level, self.causal))
        # Mean over each node's real tokens; a node of padding only is masked below.
        member_BxNxL = pool_NxL[None] & real_BxL[:, None, :]
        count_BxN = member_BxNxL.sum(-1)
        weights_BxNxL = member_BxNxL.astype(k_BxHxLxK.dtype) / jnp.maximum(
            count_BxN, 1)[..., None].astype(k_BxHxLxK.dtype)
        kn_BxHxNxK = jnp.einsum("bnl,bhlk->bhnk", weights_BxNxL, k_BxHxLxK)
        vn_BxHxNxK = jnp.einsum("bnl,bhlk->bhnk", weights_BxNxL, v_BxHxLxK)
        keys_BxHxMxK = jnp.concatenate([k_BxHxLxK, kn_BxHxNxK], axis=2)
        values_BxHxMxK = jnp.concatenate([v_BxHxLxK, vn_BxHxNxK], axis=2)
        key_real_BxM = jnp.concatenate([real_BxL, count_BxN > 0], axis=1)
        mask = allowed_LxLN[None, None] & key_real_BxM[:, None, None, :]
        o_BxHxLxK = dot_product_attention(q_BxHxLxK, keys_BxHxMxK, values_BxHxMxK,
                                          mask=mask, dropout_fn=self.dropout_fn(deterministic))
        return self.out(self.merge_heads(o_BxHxLxK))


@registry.register("bp_transformer", capabilities=registry.Capabilities(
    description="BP-Transformer: each token attends to k neighbour tokens and, per level "
                "of a binary partition, k mean-pooled span nodes on each side",
    causal=True, padding=True, variable_length=True,
    dense_equivalent=dict(k=16), test_hparams=dict(k=1), rotary=True, decode="recompute"))
def build_bp_transformer(*, dim, num_heads, max_len, causal, rngs, rotary: bool = False,
                         k: int = 4, max_level: int | None = None, qkv_dim=None,
                         attention_dropout=0.1, use_bias=True):
    max_level = num_levels(max_len) if max_level is None else max_level
    return BPAttention(k=k, max_level=max_level, dim=dim, num_heads=num_heads,
                       causal=causal, qkv_dim=qkv_dim, attention_dropout=attention_dropout,
                       use_bias=use_bias, rotary=rotary, rngs=rngs)
