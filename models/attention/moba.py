"""Mixture of Block Attention (`moba`; Lu et al. 2025, "MoBA: Mixture of Block Attention
for Long-Context LLMs", arXiv 2502.13189): softmax attention in which each query reads
only top_k blocks of `block_size` keys, chosen by its content,

    gate_ij = q_i . mean(k over block j)          (for the blocks j the query may choose)
    query i reads block own(i) (always, causally masked within) and the top_k - 1 other
    blocks of highest gate_ij among the complete blocks before it.

As MoonshotAI/MoBA's reference `moba_attn_varlen_naive` (moba/moba_naive.py at 61e456b):
the query's own block is forced (gate +inf), blocks not yet complete excluded (-inf),
top_k counts the own block; the gate is float32, unscaled; the selection is discrete (no
gradient through the gate, as the reference's, which overwrites it with 0 / -inf). Padded
keys are excluded from the block means (a block without a real key is never chosen) and
from the attention. causal=False (LRA's classifiers; MoBA is causal): every other block
with a real key is a candidate; ours.

attention_impl='dense' (the default) computes it with the L x L mask, the reference's own
naive form (O(L^2) memory, as `transformer`'s dense path). attention_impl='flash' (the
config argument every task config takes): the O(L)-memory chunked softmax of
models/kernels/chunked_attention.py with the chosen blocks as a per-query table of
blocks (Q x L / block_size booleans; tiles none of whose queries chose a block skipped),
the memory of MoonshotAI/MoBA's flash form, not its sparse compute (its varlen kernel
reads only the chosen blocks; here every tile holding one chosen block is computed).
The two are tested equal (tests/models/test_moba.py). top_k >= the number of blocks is
softmax attention (the conformance suite's dense limit).

Decoding: a kv cache of every position; each step recomputes the block means over the
cached keys and chooses its blocks as the parallel form does at that position (the dense
form: one query).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, masks, registry
from models.attention import dense
from models.kernels.chunked_attention import chunked_attention

IMPLS = ("dense", "flash")


def selected_blocks(q_BxHxQxK: jax.Array, k_BxHxKvxK: jax.Array, valid_BxKv: jax.Array,
                    q_pos_BxQ: jax.Array, *, block_size: int, top_k: int,
                    causal: bool) -> jax.Array:
    """Which blocks each query reads: bool BxHxQxN (N = ceil(Kv / block_size))."""
    b, h, kv_len, k_dim = k_BxHxKvxK.shape
    n = -(-kv_len // block_size)
    pad = n * block_size - kv_len
    k = jnp.pad(k_BxHxKvxK.astype(jnp.float32), ((0, 0), (0, 0), (0, pad), (0, 0)))
    valid = jnp.pad(valid_BxKv.astype(jnp.float32), ((0, 0), (0, pad)))
    count_BxN = valid.reshape(b, n, block_size).sum(-1)
    sums_BxHxNxK = jnp.einsum("bhnck,bnc->bhnk", k.reshape(b, h, n, block_size, k_dim),
                              valid.reshape(b, n, block_size))
    mean_BxHxNxK = sums_BxHxNxK / jnp.maximum(count_BxN, 1.0)[:, None, :, None]
    gate = jnp.einsum("bhqk,bhnk->bhqn", q_BxHxQxK.astype(jnp.float32), mean_BxHxNxK)
    gate = jax.lax.stop_gradient(gate)  # a choice, as the reference's (no gradient)
    blocks_N = jnp.arange(n)
    own_BxQ = q_pos_BxQ // block_size
    if causal:  # the complete blocks before the query's own
        candidate = blocks_N[None, None] < own_BxQ[..., None]
    else:
        candidate = blocks_N[None, None] != own_BxQ[..., None]
    candidate = (candidate & (count_BxN > 0)[:, None, :])[:, None]  # Bx1xQxN
    own = (blocks_N[None, None] == own_BxQ[..., None])[:, None]
    gate = jnp.where(candidate, gate, -jnp.inf)
    gate = jnp.where(own, jnp.inf, gate)
    _, index_BxHxQxT = jax.lax.top_k(gate, min(top_k, n))
    chosen = jnp.any(index_BxHxQxT[..., None] == blocks_N, axis=-2)
    return chosen & (candidate | own)


def key_mask(chosen_BxHxQxN: jax.Array, valid_BxKv: jax.Array, q_pos_BxQ: jax.Array, *,
             block_size: int, causal: bool) -> jax.Array:
    """bool BxHxQxKv: the keys of the chosen blocks that are real (and not after the
    query, causal)."""
    kv_len = valid_BxKv.shape[-1]
    mask = jnp.repeat(chosen_BxHxQxN, block_size, axis=-1)[..., :kv_len]
    mask = mask & valid_BxKv.astype(jnp.bool_)[:, None, None, :]
    if causal:
        mask = mask & (jnp.arange(kv_len)[None, None] <= q_pos_BxQ[..., None])[:, None]
    return mask


class MixtureOfBlockAttention(dense.MultiHeadAttention):
    """MoBA (module docstring) with `transformer`'s projections."""

    def __init__(self, *, block_size: int, top_k: int, attention_impl: str = "dense",
                 **kwargs):
        if block_size < 1 or top_k < 1:
            raise ValueError(f"block_size ({block_size}) and top_k ({top_k}) must be positive")
        super().__init__(**kwargs)
        self.block_size, self.top_k = block_size, top_k
        self.attention_impl = attention_impl

    def attend(self, q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxK, valid_BxKv, q_pos_BxQ, dropout_fn):
        chosen = selected_blocks(q_BxHxQxK, k_BxHxKvxK, valid_BxKv, q_pos_BxQ,
                                 block_size=self.block_size, top_k=self.top_k,
                                 causal=self.causal)
        mask = key_mask(chosen, valid_BxKv, q_pos_BxQ, block_size=self.block_size,
                        causal=self.causal)
        return dense.dot_product_attention(q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxK, mask=mask,
                                           dropout_fn=dropout_fn)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        b, length = x_BxLxD.shape[:2]
        q, k, v = self.project_qkv(x_BxLxD)
        pos_BxL = jnp.broadcast_to(jnp.arange(length)[None], (b, length))
        valid_BxL = layers.valid_mask(padding_mask, b, length)
        if self.attention_impl == "flash":
            chosen = selected_blocks(q, k, valid_BxL, pos_BxL, block_size=self.block_size,
                                     top_k=self.top_k, causal=self.causal)
            rate = 0.0 if deterministic else self.attention_dropout.rate
            o = chunked_attention(q, k, v, masks.causal() if self.causal else None,
                                  valid_BxKv=valid_BxL, dropout_rate=rate,
                                  dropout_seed=self.dropout_seed() if rate > 0 else None,
                                  key_blocks=(chosen, self.block_size))
        else:
            o = self.attend(q, k, v, valid_BxL, pos_BxL, self.dropout_fn(deterministic))
        return self.out(self.merge_heads(o))

    # ------------------------------------------------------------------ decoding

    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        decoding.require_causal(self, "moba")
        shape = (batch, self.num_heads, max_len, self.head_dim)
        return {"pos": jnp.zeros((batch,), jnp.int32), "k": jnp.zeros(shape, jnp.float32),
                "v": jnp.zeros(shape, jnp.float32)}

    def prefill(self, cache: decoding.Cache, x_BxLxD: jax.Array,
                padding_mask: jax.Array | None) -> tuple[jax.Array, decoding.Cache]:
        decoding.require_causal(self, "moba")
        b, length = x_BxLxD.shape[:2]
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask, deterministic=True)
        _, k, v = self.project_qkv(x_BxLxD)
        real = layers.valid_mask(padding_mask, b, length)[:, None, :, None]
        put = lambda buf, t: jax.lax.dynamic_update_slice(  # noqa: E731
            buf, jnp.where(real, t, 0.0).astype(jnp.float32), (0, 0, 0, 0))
        return y_BxLxD, {"pos": decoding.lengths_of(padding_mask, b, length),
                         "k": put(cache["k"], k), "v": put(cache["v"], v)}

    def step(self, cache: decoding.Cache, x_BxD: jax.Array) -> tuple[jax.Array, decoding.Cache]:
        decoding.require_causal(self, "moba")
        pos_B = cache["pos"]
        x_Bx1xD = x_BxD[:, None]
        q, k, v = (self.split_heads(p(x_Bx1xD)) for p in (self.query, self.key, self.value))
        q = self.rotate(q, pos_B[:, None, None])
        k = self.rotate(k, pos_B[:, None, None])
        write = lambda buf, t: decoding.write_row(  # noqa: E731
            buf.swapaxes(1, 2), pos_B, t[:, :, 0]).swapaxes(1, 2)
        k_BxHxMxK, v_BxHxMxK = write(cache["k"], k), write(cache["v"], v)
        seen_BxM = jnp.arange(k_BxHxMxK.shape[2])[None] <= pos_B[:, None]
        o = self.attend(q, k_BxHxMxK.astype(q.dtype), v_BxHxMxK.astype(q.dtype), seen_BxM,
                        pos_B[:, None], None)
        y_BxD = self.out(self.merge_heads(o))[:, 0]
        return y_BxD, {"pos": pos_B + 1, "k": k_BxHxMxK, "v": v_BxHxMxK}


@registry.register("moba", capabilities=registry.Capabilities(
    description="MoBA: each query block reads its own and its top-k key blocks by q . "
                "mean-pooled keys (Lu et al. 2025); causal=False chooses among all blocks",
    causal=True, decode="kv_cache", padding=True, variable_length=True,
    dense_equivalent={"top_k": 1 << 20}, test_hparams={"block_size": 4, "top_k": 2},
    rotary=True, receptive_field="limited"))
def build_moba(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
               rotary: bool = False, qkv_dim: int | None = None,
               attention_dropout: float = 0.1, use_bias: bool = True, block_size: int = 64,
               top_k: int = 3, attention_impl: str = "dense") -> MixtureOfBlockAttention:
    """block_size and top_k: MoBA's two knobs (its LLaMA example: 4096 and 12 at 32K+;
    here 64 and 3, about 10% of the keys at LRA's 2K). attention_impl: 'dense' or
    'flash' (module docstring)."""
    del max_len  # any length
    if attention_impl not in IMPLS:
        raise registry.RegistryError(
            f"moba: attention_impl={attention_impl!r} is not available; use 'dense' or "
            "'flash' (the chunked O(L)-memory form with the chosen blocks; its blocks are "
            "chosen by content, so the static block-sparse forms do not apply)")
    return MixtureOfBlockAttention(block_size=int(block_size), top_k=int(top_k),
                                   attention_impl=attention_impl, dim=dim,
                                   num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                                   attention_dropout=attention_dropout, use_bias=use_bias,
                                   rotary=rotary, rngs=rngs)
