"""Clustered attention: `clustered` (Vyas et al. 2020), modes 'clustered' and 'improved'.

Per head, queries are clustered into C groups: each query is hashed to a B-bit code
(signs of B random projections), then K-means runs in Hamming space for a fixed
number of Lloyd iterations (assign each code to the nearest centroid; a centroid
becomes the bitwise majority of its members). Clustering takes no gradient. The
centroid query of a cluster is the mean of its member queries, Q_c.

- 'clustered': A^c = softmax(Q_c K^T / sqrt(d)); each query gets its centroid's
  output A^c_j V. Cost O(L C d) instead of O(L^2 d).
- 'improved' (the paper's i-clustered, its eq. for A^t): for cluster j, T_j holds
  the top-k keys of A^c_j and m_j = sum_{l in T_j} A^c_jl their mass. A member
  query i re-computes the weights of T_j exactly and keeps the centroid's elsewhere:

      A^t_il = m_j exp(q_i . k_l / sqrt(d)) / sum_{r in T_j} exp(q_i . k_r / sqrt(d))
               for l in T_j,   A^c_jl otherwise.

Reductions to dense attention (both tested): 'clustered' with C = L, when the L
query codes are distinct (each query is then its own cluster and centroid; with
B = 32 bits a collision is unlikely, not impossible); and 'improved' with topk >= L
for any C (T_j is every key, m_j = 1). One cluster covering all tokens is not
dense: every query gets the mean query's attention.

Padding: the initial centroids are the codes of evenly spaced real queries, and
only real queries enter the majority votes and the centroid means, so padded
queries never move a real query's cluster; padded keys are masked.

Deviations: the hyperplanes are drawn fresh on every training call (as the
reference does) but fixed by `hash_seed` when deterministic, so eval is
reproducible; the projections have no random bias term. No causal form: clusters
and centroids mix queries from all positions, so a past query's output would
depend on future tokens.

rotary: queries and keys are rotated by position before hashing, as their products are
the logits; a centroid query is then a mean of rotated queries, and its product with
a rotated key a mean of terms that each depend on an offset only.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention.dense import DropoutFn, MultiHeadAttention

MODES = ("clustered", "improved")
_LOWEST = jnp.finfo(jnp.float32).min


def hash_codes(q_BxHxLxK: jax.Array, planes_KxB: jax.Array) -> jax.Array:
    """{0, 1} codes BxHxLxBits: the signs of random projections (SimHash)."""
    return (jnp.einsum("bhlk,kn->bhln", q_BxHxLxK, planes_KxB) > 0).astype(jnp.float32)


def hamming(codes_BxHxLxN: jax.Array, centroids_BxHxCxN: jax.Array) -> jax.Array:
    """Hamming distances BxHxLxC between {0, 1} codes (integer-valued floats)."""
    return (jnp.einsum("bhln,bhcn->bhlc", codes_BxHxLxN, 1.0 - centroids_BxHxCxN)
            + jnp.einsum("bhln,bhcn->bhlc", 1.0 - codes_BxHxLxN, centroids_BxHxCxN))


@functools.partial(jax.jit, static_argnames=("num_clusters", "iterations"))
def kmeans_hamming(codes_BxHxLxN: jax.Array, valid_BxL: jax.Array, *, num_clusters: int,
                   iterations: int) -> jax.Array:
    """Lloyd's K-means on codes in Hamming space; returns cluster ids BxHxL.

    Centroids start at the codes of C evenly spaced real queries; an update is the
    bitwise majority of a cluster's real members (an empty cluster keeps its code).
    """
    b, h, _, _ = codes_BxHxLxN.shape
    # Real positions first, in order: order[r] is the r-th real query.
    order_BxL = jnp.argsort(~valid_BxL, axis=-1, stable=True)
    n_real_Bx1 = valid_BxL.sum(-1, keepdims=True)
    rank_BxC = (jnp.arange(num_clusters)[None, :] * n_real_Bx1) // num_clusters
    init_BxC = jnp.take_along_axis(order_BxL, rank_BxC, axis=-1)
    bi = jnp.arange(b)[:, None, None]
    hi = jnp.arange(h)[None, :, None]
    centroids_BxHxCxN = codes_BxHxLxN[bi, hi, init_BxC[:, None, :]]
    real_Bx1xLx1 = valid_BxL[:, None, :, None].astype(jnp.float32)

    def assign(centroids_BxHxCxN):
        return jnp.argmin(hamming(codes_BxHxLxN, centroids_BxHxCxN), axis=-1)

    def lloyd_step(_, centroids_BxHxCxN):
        members_BxHxLxC = jax.nn.one_hot(assign(centroids_BxHxCxN), num_clusters) * real_Bx1xLx1
        count_BxHxC = members_BxHxLxC.sum(2)
        ones_BxHxCxN = jnp.einsum("bhlc,bhln->bhcn", members_BxHxLxC, codes_BxHxLxN)
        majority_BxHxCxN = (2.0 * ones_BxHxCxN > count_BxHxC[..., None]).astype(jnp.float32)
        return jnp.where(count_BxHxC[..., None] > 0, majority_BxHxCxN, centroids_BxHxCxN)

    centroids_BxHxCxN = jax.lax.fori_loop(0, iterations, lloyd_step, centroids_BxHxCxN)
    return assign(centroids_BxHxCxN)


def masked_softmax(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """softmax over the last axis in float32; masked entries (False) get weight 0."""
    logits = logits.astype(jnp.float32)
    if mask is None:
        return jax.nn.softmax(logits, axis=-1)
    weights = jax.nn.softmax(jnp.where(mask, logits, _LOWEST), axis=-1)
    return jnp.where(mask, weights, 0.0)


class ClusteredAttention(MultiHeadAttention):
    """Queries clustered per head; attention per centroid ('improved': exact top-k)."""

    def __init__(self, *, dim: int, num_heads: int, num_clusters: int, iterations: int,
                 topk: int, bits: int, mode: str, hash_seed: int, qkv_dim: int | None,
                 attention_dropout: float, use_bias: bool, rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=False, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if mode not in MODES:
            raise ValueError(f"clustered: unknown mode {mode!r}; valid: {', '.join(MODES)}")
        for name, value, low in (("num_clusters", num_clusters, 1), ("bits", bits, 1),
                                 ("topk", topk, 1), ("iterations", iterations, 0)):
            if value < low:
                raise ValueError(f"clustered: {name} must be >= {low}, got {value}")
        self.num_clusters, self.iterations, self.topk = num_clusters, iterations, topk
        self.bits, self.mode, self.hash_seed = bits, mode, hash_seed
        self.hash_rngs = layers.noise_stream(rngs)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        b, h, length, _ = q_BxHxLxK.shape
        valid_BxL = layers.valid_mask(padding_mask, b, length)
        key = jax.random.key(self.hash_seed) if deterministic else self.hash_rngs()
        cluster_BxHxL, ac_BxHxCxL = centroid_attention(
            q_BxHxLxK, k_BxHxLxK, valid_BxL, key, bits=self.bits,
            num_clusters=self.num_clusters, iterations=self.iterations,
            mask_keys=padding_mask is not None)
        dropout_fn = self.dropout_fn(deterministic)
        bi = jnp.arange(b)[:, None, None]
        hi = jnp.arange(h)[None, :, None]
        if self.mode == "clustered":
            oc_BxHxCxK = _apply(ac_BxHxCxL, v_BxHxLxK, dropout_fn)
            o_BxHxLxK = oc_BxHxCxK[bi, hi, cluster_BxHxL]
        else:
            rest_BxHxCxL, mass_BxHxLx1, w_BxHxLxT, vt_BxHxLxTxK = improved_weights(
                q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, valid_BxL, ac_BxHxCxL, cluster_BxHxL,
                num_top=min(self.topk, length))
            if dropout_fn is not None:
                w_BxHxLxT = dropout_fn(w_BxHxLxT)
            exact_BxHxLxK = jnp.einsum("bhlt,bhltk->bhlk",
                                       w_BxHxLxT.astype(vt_BxHxLxTxK.dtype), vt_BxHxLxTxK)
            rest_BxHxCxK = _apply(rest_BxHxCxL, v_BxHxLxK, dropout_fn)
            o_BxHxLxK = mass_BxHxLx1 * exact_BxHxLxK + rest_BxHxCxK[bi, hi, cluster_BxHxL]
        return self.out(self.merge_heads(o_BxHxLxK))


# Jitted so that eager calls (tests, notebooks) compile one program, not one per op.
@functools.partial(jax.jit, static_argnames=("bits", "num_clusters", "iterations",
                                             "mask_keys"))
def centroid_attention(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, valid_BxL: jax.Array,
                       key: jax.Array, *, bits: int, num_clusters: int, iterations: int,
                       mask_keys: bool) -> tuple[jax.Array, jax.Array]:
    """Cluster ids BxHxL and the centroids' attention weights A^c, BxHxCxL (float32)."""
    head_dim = q_BxHxLxK.shape[-1]
    planes_KxN = jax.random.normal(key, (head_dim, bits))
    codes_BxHxLxN = hash_codes(jax.lax.stop_gradient(q_BxHxLxK), planes_KxN)
    cluster_BxHxL = kmeans_hamming(codes_BxHxLxN, valid_BxL, num_clusters=num_clusters,
                                   iterations=iterations)
    members_BxHxLxC = (jax.nn.one_hot(cluster_BxHxL, num_clusters, dtype=q_BxHxLxK.dtype)
                       * valid_BxL[:, None, :, None].astype(q_BxHxLxK.dtype))
    qc_BxHxCxK = (jnp.einsum("bhlc,bhlk->bhck", members_BxHxLxC, q_BxHxLxK)
                  / jnp.maximum(members_BxHxLxC.sum(2), 1.0)[..., None])
    logits_BxHxCxL = jnp.einsum("bhck,bhlk->bhcl", qc_BxHxCxK, k_BxHxLxK,
                                preferred_element_type=jnp.float32) / math.sqrt(head_dim)
    return cluster_BxHxL, masked_softmax(
        logits_BxHxCxL, valid_BxL[:, None, None, :] if mask_keys else None)


@functools.partial(jax.jit, static_argnames=("num_top",))
def improved_weights(q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxK: jax.Array,
                     valid_BxL: jax.Array, ac_BxHxCxL: jax.Array, cluster_BxHxL: jax.Array, *,
                     num_top: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The pieces of A^t: the centroid weights outside T_j (BxHxCxL), each query's mass
    m_j (BxHxLx1), its exact weights on T_j (BxHxLxT) and the values of T_j."""
    b, h, _, head_dim = q_BxHxLxK.shape
    num_clusters = ac_BxHxCxL.shape[2]
    _, top_BxHxCxT = jax.lax.top_k(ac_BxHxCxL, num_top)
    bi4 = jnp.arange(b)[:, None, None, None]
    hi4 = jnp.arange(h)[None, :, None, None]
    ci4 = jnp.arange(num_clusters)[None, None, :, None]
    in_top_BxHxCxL = jnp.zeros(ac_BxHxCxL.shape, jnp.bool_).at[
        bi4, hi4, ci4, top_BxHxCxT].set(True)
    mass_BxHxC = jnp.where(in_top_BxHxCxL, ac_BxHxCxL, 0.0).sum(-1)
    # Each query re-weights its cluster's top keys with its own dot products.
    bi = jnp.arange(b)[:, None, None]
    hi = jnp.arange(h)[None, :, None]
    top_BxHxLxT = top_BxHxCxT[bi, hi, cluster_BxHxL]
    kt_BxHxLxTxK = k_BxHxLxK[bi4, hi4, top_BxHxLxT]
    logits_BxHxLxT = jnp.einsum("bhlk,bhltk->bhlt", q_BxHxLxK, kt_BxHxLxTxK,
                                preferred_element_type=jnp.float32) / math.sqrt(head_dim)
    # topk may exceed the real keys: the extra picks are padded and masked here.
    real_BxHxLxT = valid_BxL[bi4, top_BxHxLxT]
    return (jnp.where(in_top_BxHxCxL, 0.0, ac_BxHxCxL),
            mass_BxHxC[bi, hi, cluster_BxHxL][..., None],
            masked_softmax(logits_BxHxLxT, real_BxHxLxT),
            v_BxHxLxK[bi4, hi4, top_BxHxLxT])


def _apply(weights_BxHxCxL: jax.Array, v_BxHxLxK: jax.Array,
           dropout_fn: DropoutFn | None) -> jax.Array:
    if dropout_fn is not None:
        weights_BxHxCxL = dropout_fn(weights_BxHxCxL)
    return jnp.einsum("bhcl,bhlk->bhck", weights_BxHxCxL.astype(v_BxHxLxK.dtype), v_BxHxLxK)


@registry.register("clustered", capabilities=registry.Capabilities(
    description="Clustered attention: queries K-means-clustered on hashes; 'improved' top-k",
    causal=False, padding=True, variable_length=True,
    dense_equivalent={"mode": "clustered", "num_clusters": 16, "bits": 32},
    test_hparams={"mode": "improved", "num_clusters": 4, "topk": 4, "bits": 16,
                  "iterations": 3}, rotary=True))
def build_clustered(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                    rotary: bool = False,
                    num_clusters: int = 100, iterations: int = 10, topk: int = 32,
                    bits: int = 32, mode: str = "clustered", hash_seed: int = 0,
                    qkv_dim: int | None = None, attention_dropout: float = 0.1,
                    use_bias: bool = True) -> ClusteredAttention:
    """num_clusters: C; iterations: Lloyd steps; topk: keys re-computed per query
    ('improved'); bits: hash bits; hash_seed: the hyperplanes when deterministic."""
    del max_len, causal  # any length; the registry refuses causal=True
    return ClusteredAttention(dim=dim, num_heads=num_heads, num_clusters=num_clusters,
                              iterations=iterations, topk=topk, bits=bits, mode=mode,
                              hash_seed=hash_seed, qkv_dim=qkv_dim,
                              attention_dropout=attention_dropout, use_bias=use_bias,
                              rotary=rotary, rngs=rngs)
