"""LSH attention: `reformer` (Kitaev et al. 2020).

Queries and keys are shared (k_i = q_i / ||q_i||). Each of n_hashes rounds hashes
every position with random rotations R in R^{K x n_buckets/2},
h(x) = argmax([xR; -xR]), sorts the positions by (bucket, position), splits the
sorted sequence into chunks of chunk_len and lets each chunk attend to itself and
to the chunk before it (the first wraps around to the last). A position sees
itself only when nothing else is available (-1e5 on its own logit, as in trax).
The rounds are combined with the weights softmax_r(lse_r), lse_r the
log-sum-exp of round r's logits. Pairs found in several rounds are not
de-duplicated (as in trax's default): with n_hashes = 1 the result is exact.

Padded positions (and the internal padding up to a multiple of chunk_len) hash
to an extra bucket after all the others, so they sort last and never shift the
chunks of real positions; the wrap-around goes to the last chunk holding a real
position. A padded input thus gives the same real outputs as its unpadded prefix.

Rotations: deterministic calls use rotations drawn once at build time (from the
`params` stream, one set per layer); training calls draw fresh rotations from the
layer's `dropout` stream, as the paper does (the reversible stack replays that
stream, so recomputation sees the same buckets).

Causal form (`causal=True`, what enwik8 trains): in each round a query attends to itself
and to the `chunk_len` latest earlier positions of its own bucket, nothing else. The
paper's causal masking (and trax's LSHSelfAttention(causal=True)) keeps the fixed chunks of
the sorted order and only masks keys after the query; which earlier keys then share a
chunk with a query depends on how many later tokens sort before it, so later tokens change
earlier outputs and the model could not be decoded one token at a time. Here the chunks
slide with the query inside its bucket (the same sort; own chunk + the one before it hold
every key a query can reach, so the cost is the non-causal form's), which depends on
earlier tokens only. It is decoded from a kv cache that also holds every position's
buckets (`init_cache` / `prefill` / `step`): O(max_len) per token, exact against the
parallel form. trax decodes its LSH attention in a form close to this one and unlike its
training form: a new token attends to the latest n_hashes * chunk_len * (1 +
n_chunks_before) positions that share a bucket with it in some round (google/trax
trax/layers/research/efficient_attention.py at 8e10d6a8,
LSHSelfAttention.incremental_forward_unbatched); here one form trains and decodes.

`shared_qk=False` (a separate `key` projection, no key normalisation, no self
penalty) exists for the dense reduction check: with one chunk covering the input
it computes `transformer`'s attention exactly.

rotary: queries (and so the shared keys) are rotated by position before hashing: the
buckets are meant to gather the pairs with large products, and under rotary those are
the rotated products, which depend on content and offset.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention.dense import MultiHeadAttention

SELF_LOGIT = -1e5  # trax's self-attention penalty: used only when nothing else is there


class LSHAttention(MultiHeadAttention):
    """Multi-round LSH attention over sorted chunks (see the module docstring)."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, n_buckets: int,
                 n_hashes: int, chunk_len: int, shared_qk: bool, qkv_dim: int | None,
                 attention_dropout: float, use_bias: bool, rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if n_buckets < 1 or (n_buckets > 1 and n_buckets % 2):
            raise ValueError(f"reformer: n_buckets must be 1 or a positive even number, "
                             f"got {n_buckets}")
        if n_hashes < 1 or chunk_len < 1:
            raise ValueError(f"reformer: n_hashes and chunk_len must be >= 1, got "
                             f"{n_hashes} and {chunk_len}")
        self.n_buckets, self.n_hashes, self.chunk_len = n_buckets, n_hashes, chunk_len
        self.shared_qk = shared_qk
        if shared_qk:
            self.key = None  # keys are the normalised queries
        self.rotations = nnx.Variable(self._draw_rotations(rngs.params()))
        self.hash_rngs = rngs["dropout"].fork()

    def _draw_rotations(self, key: jax.Array) -> jax.Array:
        shape = (self.n_hashes, self.head_dim, max(self.n_buckets // 2, 1))
        return jax.random.normal(key, shape, jnp.float32)

    def hash(self, k_BxHxLxK: jax.Array, rotations_RxKxN: jax.Array) -> jax.Array:
        """Bucket of every position in every round, BxHxRxL, h(x) = argmax([xR; -xR])."""
        if self.n_buckets == 1:
            b, h, l, _ = k_BxHxLxK.shape
            return jnp.zeros((b, h, self.n_hashes, l), jnp.int32)
        rotated_BxHxRxLxN = jnp.einsum("bhlk,rkn->bhrln", k_BxHxLxK.astype(jnp.float32),
                                       rotations_RxKxN)
        both = jnp.concatenate([rotated_BxHxRxLxN, -rotated_BxHxRxLxN], axis=-1)
        return jnp.argmax(both, axis=-1).astype(jnp.int32)

    def qkv(self, x_BxLxD: jax.Array, positions: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries, keys and values, BxHxLxK, rotated at `positions` under rotary."""
        q_BxHxLxK = self.rotate(self.split_heads(self.query(x_BxLxD)), positions)
        v_BxHxLxK = self.split_heads(self.value(x_BxLxD))
        if self.shared_qk:  # a rotation keeps the norm: the key sits at its query's position
            norm = jnp.sqrt(jnp.sum(jnp.square(q_BxHxLxK), axis=-1, keepdims=True))
            return q_BxHxLxK, q_BxHxLxK / jnp.maximum(norm, 1e-6), v_BxHxLxK
        return (q_BxHxLxK, self.rotate(self.split_heads(self.key(x_BxLxD)), positions),
                v_BxHxLxK)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        batch, seq_len, _ = x_BxLxD.shape
        c = self.chunk_len
        n_chunks = -(-seq_len // c)
        padded_len = n_chunks * c
        extra = padded_len - seq_len
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.qkv(x_BxLxD)
        real_BxL = layers.valid_mask(padding_mask, batch, seq_len)
        pad = ((0, 0), (0, 0), (0, extra), (0, 0))
        q_BxHxPxK, k_BxHxPxK, v_BxHxPxK = (jnp.pad(t, pad) for t in
                                           (q_BxHxLxK, k_BxHxLxK, v_BxHxLxK))
        real_BxP = jnp.pad(real_BxL, ((0, 0), (0, extra)))

        rotations = (self.rotations[...] if deterministic
                     else self._draw_rotations(self.hash_rngs()))
        buckets_BxHxRxP = self.hash(k_BxHxPxK, rotations)
        # Padding goes to an extra last bucket; (bucket, position) as one sort key.
        buckets_BxHxRxP = jnp.where(real_BxP[:, None, None, :], buckets_BxHxRxP,
                                    self.n_buckets)
        pos_P = jnp.arange(padded_len)
        order_BxHxRxP = jnp.argsort(buckets_BxHxRxP * padded_len + pos_P, axis=-1)

        def gather(t_BxHxPxK: jax.Array) -> jax.Array:  # -> BxHxRxNxCxK, sorted
            t_BxHxRxPxK = jnp.take_along_axis(t_BxHxPxK[:, :, None],
                                              order_BxHxRxP[..., None], axis=3)
            return t_BxHxRxPxK.reshape(*order_BxHxRxP.shape[:3], n_chunks, c, -1)

        sq, sk, sv = gather(q_BxHxPxK), gather(k_BxHxPxK), gather(v_BxHxPxK)
        spos_BxHxRxNxC = order_BxHxRxP.reshape(*order_BxHxRxP.shape[:3], n_chunks, c)
        sreal_BxHxRxNxC = jnp.take_along_axis(
            jnp.broadcast_to(real_BxP[:, None, None, :], order_BxHxRxP.shape),
            order_BxHxRxP, axis=-1).reshape(spos_BxHxRxNxC.shape)

        chunk_N = jnp.arange(n_chunks)
        if self.causal:  # one chunk back, none before the first
            prev_BxN = jnp.broadcast_to(jnp.maximum(chunk_N - 1, 0)[None], (batch, n_chunks))
        else:  # one chunk back, wrapping around to the last chunk with a real position
            real_chunks_B = jnp.maximum(-(-jnp.sum(real_BxP, axis=-1) // c), 1)
            prev_BxN = jnp.mod(chunk_N[None, :] - 1, real_chunks_B[:, None])
        is_own_BxN = prev_BxN == chunk_N[None, :]  # a single chunk: do not count it twice

        def with_previous(t: jax.Array) -> jax.Array:  # BxHxRxNxC... -> BxHxRxNx2C...
            idx = prev_BxN.reshape(batch, 1, 1, n_chunks, *([1] * (t.ndim - 4)))
            prev = jnp.take_along_axis(t, idx, axis=3)
            return jnp.concatenate([t, prev], axis=4)

        kk_BxHxRxNx2CxK, kv_BxHxRxNx2CxK = with_previous(sk), with_previous(sv)
        kpos_BxHxRxNx2C = with_previous(spos_BxHxRxNxC)
        kreal_BxHxRxNx2C = with_previous(sreal_BxHxRxNxC)
        own_half_2C = jnp.arange(2 * c) < c
        kreal_BxHxRxNx2C = kreal_BxHxRxNx2C & (
            own_half_2C | ~is_own_BxN[:, None, None, :, None])

        scale = 1.0 / math.sqrt(self.head_dim)
        logits = jnp.einsum("bhrnqk,bhrnsk->bhrnqs", sq, kk_BxHxRxNx2CxK,
                            preferred_element_type=jnp.float32) * scale
        qpos = spos_BxHxRxNxC[..., :, None]
        kpos = kpos_BxHxRxNx2C[..., None, :]
        mask = jnp.broadcast_to(kreal_BxHxRxNx2C[..., None, :], logits.shape)
        if self.causal:
            # Same bucket, not later, at most chunk_len places back in the sorted order:
            # sorted by (bucket, position), that is the bucket's chunk_len latest keys.
            sidx_BxHxRxNxC = jnp.broadcast_to(
                jnp.arange(padded_len).reshape(n_chunks, c), spos_BxHxRxNxC.shape)
            sbucket_BxHxRxNxC = jnp.take_along_axis(
                buckets_BxHxRxP, order_BxHxRxP, axis=-1).reshape(spos_BxHxRxNxC.shape)
            qidx, kidx = sidx_BxHxRxNxC[..., :, None], with_previous(sidx_BxHxRxNxC)[..., None, :]
            same = (sbucket_BxHxRxNxC[..., :, None]
                    == with_previous(sbucket_BxHxRxNxC)[..., None, :])
            mask = mask & same & (kidx <= qidx) & (kidx >= qidx - c)
        if self.shared_qk:
            logits = jnp.where(kpos == qpos, SELF_LOGIT, logits)
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
        lse_BxHxRxNxC = jax.nn.logsumexp(logits, axis=-1)
        # where() zeroes rows with no key at all (padded queries), gradient included.
        weights = jnp.where(mask, jnp.exp(logits - lse_BxHxRxNxC[..., None]), 0.0)
        dropout_fn = self.dropout_fn(deterministic)
        if dropout_fn is not None:
            weights = dropout_fn(weights)
        so_BxHxRxNxCxK = jnp.einsum("bhrnqs,bhrnsk->bhrnqk", weights.astype(sv.dtype),
                                    kv_BxHxRxNx2CxK)

        # Unsort each round back to positions, then combine rounds by their lse.
        undo_BxHxRxP = jnp.argsort(order_BxHxRxP, axis=-1)
        o_BxHxRxPxK = jnp.take_along_axis(
            so_BxHxRxNxCxK.reshape(*order_BxHxRxP.shape, -1), undo_BxHxRxP[..., None], axis=3)
        lse_BxHxRxP = jnp.take_along_axis(lse_BxHxRxNxC.reshape(order_BxHxRxP.shape),
                                          undo_BxHxRxP, axis=-1)
        round_w_BxHxRxP = jax.nn.softmax(lse_BxHxRxP, axis=2)
        o_BxHxPxK = jnp.sum(o_BxHxRxPxK * round_w_BxHxRxP[..., None].astype(sv.dtype),
                            axis=2)
        return self.out(self.merge_heads(o_BxHxPxK[:, :, :seq_len]))

    # Decoding the causal form: keys, values and every position's bucket in each round.
    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        if not self.causal:
            raise decoding.DecodingError("reformer decodes only its causal form")
        shape = (batch, self.num_heads, max_len, self.head_dim)
        return {"pos": jnp.zeros((batch,), jnp.int32), "k": jnp.zeros(shape, jnp.float32),
                "v": jnp.zeros(shape, jnp.float32),
                "bucket": jnp.full((batch, self.num_heads, self.n_hashes, max_len), -1,
                                   jnp.int32)}

    def prefill(self, cache: decoding.Cache, x_BxLxD: jax.Array,
                padding_mask_BxL: jax.Array | None) -> tuple[jax.Array, decoding.Cache]:
        batch, length, _ = x_BxLxD.shape
        pos_B = decoding.lengths_of(padding_mask_BxL, batch, length)
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask_BxL, deterministic=True)
        _, k_BxHxLxK, v_BxHxLxK = self.qkv(x_BxLxD)
        real_BxL = jnp.arange(length)[None] < pos_B[:, None]
        bucket_BxHxRxL = jnp.where(real_BxL[:, None, None],
                                   self.hash(k_BxHxLxK, self.rotations[...]), -1)
        real_Bx1xLx1 = real_BxL[:, None, :, None]
        k_BxHxLxK, v_BxHxLxK = (jnp.where(real_Bx1xLx1, t, 0.0).astype(jnp.float32)
                                for t in (k_BxHxLxK, v_BxHxLxK))
        return y_BxLxD, {
            "pos": pos_B,
            "k": jax.lax.dynamic_update_slice(cache["k"], k_BxHxLxK, (0, 0, 0, 0)),
            "v": jax.lax.dynamic_update_slice(cache["v"], v_BxHxLxK, (0, 0, 0, 0)),
            "bucket": jax.lax.dynamic_update_slice(cache["bucket"], bucket_BxHxRxL,
                                                   (0, 0, 0, 0))}

    def step(self, cache: decoding.Cache, x_BxD: jax.Array
             ) -> tuple[jax.Array, decoding.Cache]:
        pos_B = cache["pos"]
        q_BxHx1xK, k_BxHx1xK, v_BxHx1xK = self.qkv(x_BxD[:, None], pos_B[:, None, None])
        bucket_BxHxR = self.hash(k_BxHx1xK, self.rotations[...])[..., 0]
        # write_row's slot axis is axis 1: rows written as BxMx... and transposed back.
        k_BxHxMxK, v_BxHxMxK = (
            decoding.write_row(cache[n].transpose(0, 2, 1, 3), pos_B,
                               t[:, :, 0]).transpose(0, 2, 1, 3)
            for n, t in (("k", k_BxHx1xK), ("v", v_BxHx1xK)))
        bucket_BxHxRxM = decoding.write_row(cache["bucket"].transpose(0, 3, 1, 2), pos_B,
                                            bucket_BxHxR).transpose(0, 2, 3, 1)
        slot_M = jnp.arange(bucket_BxHxRxM.shape[-1])
        seen_Bx1x1xM = (slot_M[None] <= pos_B[:, None])[:, None, None]
        same_BxHxRxM = (bucket_BxHxRxM == bucket_BxHxR[..., None]) & seen_Bx1x1xM
        # Positions of the bucket after slot m, up to the query: at most chunk_len.
        count = same_BxHxRxM.astype(jnp.int32)
        after_BxHxRxM = jnp.cumsum(count[..., ::-1], axis=-1)[..., ::-1] - count
        mask_BxHxRxM = same_BxHxRxM & (after_BxHxRxM <= self.chunk_len)
        logits_BxHx1xM = jnp.einsum("bhqk,bhmk->bhqm", q_BxHx1xK,
                                    k_BxHxMxK.astype(q_BxHx1xK.dtype),
                                    preferred_element_type=jnp.float32)
        logits_BxHx1xM = logits_BxHx1xM / math.sqrt(self.head_dim)
        if self.shared_qk:
            is_self_Bx1x1xM = (slot_M[None] == pos_B[:, None])[:, None, None]
            logits_BxHx1xM = jnp.where(is_self_Bx1x1xM, SELF_LOGIT, logits_BxHx1xM)
        logits_BxHxRxM = jnp.where(mask_BxHxRxM, logits_BxHx1xM,
                                   jnp.finfo(jnp.float32).min)
        lse_BxHxR = jax.nn.logsumexp(logits_BxHxRxM, axis=-1)
        weights = jnp.where(mask_BxHxRxM, jnp.exp(logits_BxHxRxM - lse_BxHxR[..., None]),
                            0.0)
        o_BxHxRxK = jnp.einsum("bhrm,bhmk->bhrk", weights, v_BxHxMxK)
        round_w_BxHxR = jax.nn.softmax(lse_BxHxR, axis=-1)
        o_BxHxK = jnp.sum(o_BxHxRxK * round_w_BxHxR[..., None], axis=2)
        y_BxD = self.out(self.merge_heads(o_BxHxK[:, :, None].astype(x_BxD.dtype)))[:, 0]
        return y_BxD, {"pos": pos_B + 1, "k": k_BxHxMxK, "v": v_BxHxMxK,
                       "bucket": bucket_BxHxRxM}


@registry.register("reformer", capabilities=registry.Capabilities(
    description="Reformer: multi-round LSH attention on shared QK over sorted chunks",
    causal=True, decode="kv_cache", padding=True, variable_length=True,
    receptive_field="limited",
    dense_form=("shared_qk",),
    dense_equivalent={"n_buckets": 1, "n_hashes": 1, "chunk_len": 16, "shared_qk": False},
    test_hparams={"n_buckets": 4, "n_hashes": 2, "chunk_len": 4},
    block={"stack": "reversible", "ffn_chunks": 1}, rotary=True))
def build_reformer(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                   rotary: bool = False,
                   n_buckets: int = 32, n_hashes: int = 2, chunk_len: int = 64,
                   shared_qk: bool = True, qkv_dim: int | None = None,
                   attention_dropout: float = 0.1, use_bias: bool = True) -> LSHAttention:
    del max_len  # any length works: it is padded to a multiple of chunk_len inside
    return LSHAttention(dim=dim, num_heads=num_heads, causal=causal, n_buckets=n_buckets,
                        n_hashes=n_hashes, chunk_len=chunk_len, shared_qk=shared_qk,
                        qkv_dim=qkv_dim, attention_dropout=attention_dropout,
                        use_bias=use_bias, rotary=rotary, rngs=rngs)
