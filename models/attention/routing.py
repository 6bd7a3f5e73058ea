"""Routing Transformer attention (Roy et al. 2021): attention within online k-means clusters.

Tokens are routed by their L2-normalised query (and, without shared QK, their normalised
key) to the nearest of k unit centroids per head. The centroids are `Centroids` state, not
Params (the optimiser never touches them): a training call (deterministic=False) moves each
centroid by an exponential moving average towards the mean of its assigned tokens
(stop-gradient), an evaluation call leaves them fixed. A commitment loss
`commitment * mean ||x - stop_grad(mu(x))||^2` is sown as `aux_loss` in training.

Shared QK (the paper's setting, default): keys are the L2-normalised queries, as in
Reformer; a query never attends to itself unless it has no other key. `shared_qk=False`
uses the `key` projection (and no self mask), which is what makes the variant equal to
`transformer` with one cluster and w = L (the conformance suite's dense limit).

Non-causal (the paper's balanced routing): each centroid takes its top-w closest tokens
(w = ceil(L / k) by default), so every group has a static size; attention runs within
each group. A token in several groups gets the mean of its outputs; a token in no group
gets 0 (the residual carries it), as the reference's scatter-mean does.

Causal: top-w ranks a token against later tokens, so membership would leak the future.
The causal path therefore assigns every token to its nearest centroid (a decision from the
token alone) and cuts each cluster, in position order, into runs of w tokens (the run of a
token depends only on earlier tokens); a query attends to the earlier tokens of its run.

rotary: queries and keys are rotated by position right after their projections, so the
routing (and the centroids) see the rotated vectors: those whose products are the logits
that routing tries to keep, which now depend on content and offset.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import layers, registry
from models.attention.dense import MultiHeadAttention, attend_logits

# The logit of a query for its own (shared) key: below any real logit, above masked keys,
# so a query attends to itself only when it has nothing else to attend to (as Reformer).
SELF_LOGIT = -5e4


class Centroids(nnx.Variable):
    """k-means centroids, heads x clusters x head_dim, unit rows; EMA-updated, not trained."""


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _gather(x_BxHxLxF: jax.Array, idx_BxHxN: jax.Array) -> jax.Array:
    """x[b, h, idx[b, h, ...]] for index arrays of any trailing shape."""
    return jax.vmap(jax.vmap(lambda x, i: x[i]))(x_BxHxLxF, idx_BxHxN)


class RoutingAttention(MultiHeadAttention):
    """Attention within k-means clusters of (shared) queries and keys."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, num_clusters: int,
                 window: int | None, decay: float, commitment: float, shared_qk: bool,
                 qkv_dim: int | None, attention_dropout: float, use_bias: bool,
                 rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if num_clusters <= 0:
            raise ValueError(f"routing: num_clusters must be positive, got {num_clusters}")
        if window is not None and window <= 0:
            raise ValueError(f"routing: window must be positive (or None), got {window}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"routing: decay must be in [0, 1), got {decay}")
        self.num_clusters, self.window = num_clusters, window
        self.decay, self.commitment, self.shared_qk = decay, commitment, shared_qk
        if shared_qk:
            del self.key  # keys are the normalised queries
        shape = (num_heads, num_clusters, self.head_dim)
        key = rngs.params()
        try:
            # Drawn in numpy from the params stream: a jax.random program per shape
            # compiles slowly on small CPUs.
            seed = np.asarray(jax.random.key_data(key)).tolist()
            mu = jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)
        except jax.errors.TracerArrayConversionError:  # built under jit / eval_shape
            mu = jax.random.normal(key, shape, jnp.float32)
        self.centroids = Centroids(l2_normalize(mu))

    def group_size(self, seq_len: int) -> int:
        w = math.ceil(seq_len / self.num_clusters) if self.window is None else self.window
        return min(w, seq_len)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        b, seq_len, _ = x_BxLxD.shape
        q_BxHxLxK = self.rotate(self.split_heads(self.query(x_BxLxD)))
        v_BxHxLxK = self.split_heads(self.value(x_BxLxD))
        qn_BxHxLxK = l2_normalize(q_BxHxLxK)
        if self.shared_qk:
            k_BxHxLxK = kn_BxHxLxK = qn_BxHxLxK
        else:
            k_BxHxLxK = self.rotate(self.split_heads(self.key(x_BxLxD)))
            kn_BxHxLxK = l2_normalize(k_BxHxLxK)
        real_BxL = layers.valid_mask(padding_mask, b, seq_len)
        mu_HxCxK = self.centroids[...]
        w = self.group_size(seq_len)
        dropout_fn = self.dropout_fn(deterministic)
        if self.causal:
            o_BxHxLxK = self._causal(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, qn_BxHxLxK, real_BxL,
                                     mu_HxCxK, w, dropout_fn)
        else:
            o_BxHxLxK = self._top_w(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, qn_BxHxLxK, kn_BxHxLxK,
                                    real_BxL, mu_HxCxK, w, dropout_fn)
        if not deterministic:
            routed = [qn_BxHxLxK] if self.shared_qk else [qn_BxHxLxK, kn_BxHxLxK]
            x_BxHxNxK = jnp.concatenate(routed, axis=2)
            real_BxN = jnp.concatenate([real_BxL] * len(routed), axis=1)
            self._train_update(x_BxHxNxK, real_BxN, mu_HxCxK)
        return self.out(self.merge_heads(o_BxHxLxK))

    def _train_update(self, x_BxHxNxK: jax.Array, real_BxN: jax.Array,
                      mu_HxCxK: jax.Array) -> None:
        """EMA step of the centroids and the commitment loss, over real tokens."""
        assign_BxHxN = jnp.argmax(jnp.einsum("bhnk,hck->bhnc", x_BxHxNxK, mu_HxCxK), axis=-1)
        real_BxHxN = jnp.broadcast_to(real_BxN[:, None, :], assign_BxHxN.shape)
        count = jnp.maximum(jnp.sum(real_BxHxN), 1)
        mu_BxHxNxK = _gather(jnp.broadcast_to(mu_HxCxK, (x_BxHxNxK.shape[0],
                                                         *mu_HxCxK.shape)), assign_BxHxN)
        sq_err_BxHxN = jnp.sum((x_BxHxNxK - jax.lax.stop_gradient(mu_BxHxNxK)) ** 2, axis=-1)
        self.sow(nnx.Intermediate, "aux_loss",
                 self.commitment * jnp.sum(jnp.where(real_BxHxN, sq_err_BxHxN, 0.0)) / count)

        onehot_BxHxNxC = jax.nn.one_hot(assign_BxHxN, self.num_clusters) * real_BxHxN[..., None]
        x_BxHxNxK = jax.lax.stop_gradient(x_BxHxNxK)
        sums_HxCxK = jnp.einsum("bhnc,bhnk->hck", onehot_BxHxNxC, x_BxHxNxK)
        counts_HxC = jnp.sum(onehot_BxHxNxC, axis=(0, 2))
        mean_HxCxK = sums_HxCxK / jnp.maximum(counts_HxC, 1.0)[..., None]
        moved_HxCxK = self.decay * mu_HxCxK + (1.0 - self.decay) * mean_HxCxK
        # Empty clusters stay put; renormalising keeps routing by cosine similarity.
        self.centroids[...] = jnp.where(counts_HxC[..., None] > 0, l2_normalize(moved_HxCxK),
                                        mu_HxCxK)

    def _attend(self, q_BxHxGxWxK, k_BxHxGxSxK, v_BxHxGxSxK, mask_BxHxGxWxS, self_BxHxGxWxS,
                dropout_fn) -> jax.Array:
        """Softmax attention inside each of G groups, BxHxGxWxK."""
        b, h, g, w, kd = q_BxHxGxWxK.shape
        logits = jnp.einsum("bhgqk,bhgsk->bhgqs", q_BxHxGxWxK, k_BxHxGxSxK,
                            preferred_element_type=jnp.float32) / math.sqrt(kd)
        if self_BxHxGxWxS is not None:
            logits = jnp.where(self_BxHxGxWxS, SELF_LOGIT, logits)
        s = k_BxHxGxSxK.shape[3]
        o = attend_logits(logits.reshape(b, h * g, w, s), v_BxHxGxSxK.reshape(b, h * g, s, -1),
                          mask=mask_BxHxGxWxS.reshape(b, h * g, w, s), dropout_fn=dropout_fn)
        return o.reshape(b, h, g, w, -1)

    def _top_w(self, q, k, v, qn, kn, real_BxL, mu_HxCxK, w, dropout_fn) -> jax.Array:
        """Each centroid's top-w queries attend to its top-w keys; outputs averaged back."""
        b, h, seq_len, kd = q.shape

        def top_w(x_BxHxLxK):
            scores_BxHxCxL = jnp.einsum("bhlk,hck->bhcl", x_BxHxLxK, mu_HxCxK)
            # Padded tokens rank last, so real tokens' groups ignore padded content.
            scores_BxHxCxL = jnp.where(real_BxL[:, None, None, :], scores_BxHxCxL, -jnp.inf)
            return jax.lax.top_k(scores_BxHxCxL, w)[1]

        qi_BxHxCxW = top_w(qn)
        ki_BxHxCxW = qi_BxHxCxW if self.shared_qk else top_w(kn)
        real_BxHxL = jnp.broadcast_to(real_BxL[:, None, :], (b, h, seq_len))
        mask_BxHxCx1xW = _gather(real_BxHxL, ki_BxHxCxW)[..., None, :]
        mask_BxHxCxWxW = jnp.broadcast_to(mask_BxHxCx1xW, (*qi_BxHxCxW.shape, w))
        is_self = None
        if self.shared_qk:
            is_self = qi_BxHxCxW[..., :, None] == ki_BxHxCxW[..., None, :]
        o_BxHxCxWxK = self._attend(_gather(q, qi_BxHxCxW), _gather(k, ki_BxHxCxW),
                                   _gather(v, ki_BxHxCxW), mask_BxHxCxWxW, is_self, dropout_fn)

        def scatter_mean(o_CxWxK, idx_CxW):
            idx_N = idx_CxW.reshape(-1)
            sums_LxK = jnp.zeros((seq_len, kd), o_CxWxK.dtype).at[idx_N].add(
                o_CxWxK.reshape(-1, kd))
            counts_L = jnp.zeros((seq_len,), o_CxWxK.dtype).at[idx_N].add(1.0)
            return sums_LxK / jnp.maximum(counts_L, 1.0)[:, None]

        return jax.vmap(jax.vmap(scatter_mean))(o_BxHxCxWxK, qi_BxHxCxW)

    def _causal(self, q, k, v, qn, real_BxL, mu_HxCxK, w, dropout_fn) -> jax.Array:
        """Nearest-centroid clusters cut into runs of w in position order; causal inside."""
        b, h, seq_len, kd = q.shape
        c = self.num_clusters
        assign_BxHxL = jnp.argmax(jnp.einsum("bhlk,hck->bhlc", qn, mu_HxCxK), axis=-1)
        # Padded tokens form their own cluster c, so they never shift a real token's run.
        assign_BxHxL = jnp.where(real_BxL[:, None, :], assign_BxHxL, c)
        earlier_BxHxLxC = jnp.cumsum(jax.nn.one_hot(assign_BxHxL, c + 1, dtype=jnp.int32),
                                     axis=2)
        slot_BxHxL = jnp.take_along_axis(earlier_BxHxLxC, assign_BxHxL[..., None],
                                         axis=-1)[..., 0] - 1
        group_BxHxL = assign_BxHxL * seq_len + slot_BxHxL // w
        # Stable: inside a group the sorted order is the position order.
        perm_BxHxL = jnp.argsort(group_BxHxL, axis=-1, stable=True)
        n = -(-seq_len // w)
        pad = n * w - seq_len

        def sort_chunk(x_BxHxL, fill):
            x = _gather(x_BxHxL, perm_BxHxL)
            x = jnp.pad(x, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 3),
                        constant_values=fill)
            return x.reshape(b, h, n, w, *x.shape[3:])

        def with_previous(x_BxHxNxW, fill):
            prev = jnp.pad(x_BxHxNxW, [(0, 0), (0, 0), (1, 0)] + [(0, 0)] * (x_BxHxNxW.ndim - 3),
                           constant_values=fill)[:, :, :-1]
            return jnp.concatenate([prev, x_BxHxNxW], axis=3)

        pos_BxHxL = jnp.broadcast_to(jnp.arange(seq_len), (b, h, seq_len))
        gq = sort_chunk(group_BxHxL, -1)
        pq = sort_chunk(pos_BxHxL, seq_len)
        # A group holds <= w tokens, contiguous when sorted: its earlier members lie in the
        # query's chunk or the one before.
        gk, pk = with_previous(gq, -2), with_previous(pq, seq_len)
        mask = ((gq[..., :, None] == gk[..., None, :])
                & (pk[..., None, :] <= pq[..., :, None]))
        is_self = (pk[..., None, :] == pq[..., :, None]) if self.shared_qk else None
        o_BxHxNxWxK = self._attend(sort_chunk(q, 0.0), with_previous(sort_chunk(k, 0.0), 0.0),
                                   with_previous(sort_chunk(v, 0.0), 0.0), mask, is_self,
                                   dropout_fn)
        o_BxHxLxK = o_BxHxNxWxK.reshape(b, h, n * w, kd)[:, :, :seq_len]
        return _gather(o_BxHxLxK, jnp.argsort(perm_BxHxL, axis=-1))


@registry.register("routing", capabilities=registry.Capabilities(
    description="Routing Transformer: attention within online k-means clusters (EMA centroids)",
    causal=True, decode="recompute", padding=True, variable_length=True, receptive_field="limited",
    dense_form=("shared_qk",),
    dense_equivalent={"num_clusters": 1, "window": None, "shared_qk": False},
    test_hparams={"num_clusters": 2, "window": 6}, rotary=True))
def build_routing(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                  rotary: bool = False, num_clusters: int | None = None, window: int | None = None,
                  decay: float = 0.999, commitment: float = 1e-4, shared_qk: bool = True,
                  qkv_dim: int | None = None, attention_dropout: float = 0.1,
                  use_bias: bool = True) -> RoutingAttention:
    """num_clusters: k (default round(sqrt(max_len))); window: tokens per group w (default
    ceil(L / k)); decay: centroid EMA decay; commitment: weight of the commitment loss;
    shared_qk: keys = normalised queries (the paper's setting)."""
    if num_clusters is None:
        num_clusters = max(1, round(math.sqrt(max_len)))
    return RoutingAttention(dim=dim, num_heads=num_heads, causal=causal,
                            num_clusters=num_clusters, window=window, decay=decay,
                            commitment=commitment, shared_qk=shared_qk, qkv_dim=qkv_dim,
                            attention_dropout=attention_dropout, use_bias=use_bias,
                            rotary=rotary, rngs=rngs)
