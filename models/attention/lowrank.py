"""Low-rank and synthesized attention: `linformer`, `compressed`, `synthesizer`.

- `linformer` (Wang et al. 2020): keys and values are projected along the
  sequence, K' = E K and V' = F V with E, F in R^{k x max_len}, so attention costs
  O(L k). Shorter inputs use the first L columns of E and F.
- `compressed` (memory-compressed attention, Liu et al. 2018): a strided
  convolution (kernel = stride = c) shrinks the keys and values by c.
- `synthesizer` (Tay et al. 2021): attention logits synthesized without q.k
  (`dense`: an MLP of x_i -> max_len logits, `random`: learned max_len x max_len
  logits, `factorized_random`: a rank-k product), optionally mixed with `dot`.

Parameters with a max_len axis (E, F, synthesizer logits) are sliced to the input
length L; L > max_len is refused with a ValueError.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention.dense import (MultiHeadAttention, attend_logits, dot_product_attention,
                                    make_attention_mask)


def check_length(name: str, length: int, max_len: int) -> None:
    """Refuses inputs longer than the length-dependent parameters."""
    if length > max_len:
        raise ValueError(f"{name}: input length {length} exceeds max_len {max_len}, the size "
                         "of its length-dependent parameters; build it with a larger max_len")


def _identity_init(key, shape, dtype=jnp.float32):
    del key
    return jnp.eye(shape[0], shape[1], dtype=dtype)


# Linformer -------------------------------------------------------------------------

PROJECTION_INITS = ("uniform", "identity")


class Linformer(MultiHeadAttention):
    """Softmax attention over k sequence-projected keys/values (E, F shared by heads).

    rotary: queries and keys are rotated by their positions before E projects the keys
    along the sequence, the only point at which a key still has one position. A slot's
    score is then sum_l E_pl q_i . R_(l-i) k_l: relative term by term, mixed by E's
    learned (absolute) weights, as Linformer mixes positions anyway; with E = I it is
    rotary attention exactly.
    """

    def __init__(self, *, dim: int, num_heads: int, max_len: int, k: int, share_kv: bool,
                 projection_init: str, qkv_dim: int | None, attention_dropout: float,
                 use_bias: bool, rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=False, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if k <= 0:
            raise ValueError(f"linformer: k must be positive, got {k}")
        if projection_init == "identity":
            if k != max_len:
                raise ValueError(f"linformer: projection_init='identity' needs k == max_len, "
                                 f"got k={k}, max_len={max_len}")
            init = _identity_init
        elif projection_init == "uniform":
            # torch.nn.Linear(max_len, k)'s default, as in the reference code: U(+-1/sqrt(L)).
            init = jax.nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform",
                                                        in_axis=-1, out_axis=-2)
        else:
            raise ValueError(f"linformer: unknown projection_init {projection_init!r}; "
                             f"valid: {', '.join(PROJECTION_INITS)}")
        self.max_len = max_len
        self.proj_k = layers.param(init, (None, None), (k, max_len), rngs=rngs)
        self.proj_v = None if share_kv else layers.param(init, (None, None), (k, max_len),
                                                         rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        seq_len = x_BxLxD.shape[1]
        check_length("linformer", seq_len, self.max_len)
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        e_PxL = self.proj_k[:, :seq_len]
        f_PxL = e_PxL if self.proj_v is None else self.proj_v[:, :seq_len]
        mask = None
        if padding_mask is not None:
            real_BxL = padding_mask.astype(jnp.bool_)
            # Zeroing padded keys/values before the projection keeps them out of K', V'.
            keep_Bx1xLx1 = real_BxL[:, None, :, None]
            k_BxHxLxK = jnp.where(keep_Bx1xLx1, k_BxHxLxK, 0.0)
            v_BxHxLxK = jnp.where(keep_Bx1xLx1, v_BxHxLxK, 0.0)
            # A projected slot that touches no real position carries nothing: mask it
            # (with E = F = I this is exactly dense attention's key mask).
            support_PxL = (e_PxL != 0) | (f_PxL != 0)
            slot_real_BxP = jnp.any(support_PxL[None] & real_BxL[:, None, :], axis=-1)
            mask = slot_real_BxP[:, None, None, :]
        kp_BxHxPxK = jnp.einsum("pl,bhlk->bhpk", e_PxL, k_BxHxLxK)
        vp_BxHxPxK = jnp.einsum("pl,bhlk->bhpk", f_PxL, v_BxHxLxK)
        o_BxHxLxK = dot_product_attention(q_BxHxLxK, kp_BxHxPxK, vp_BxHxPxK, mask=mask,
                                          dropout_fn=self.dropout_fn(deterministic))
        return self.out(self.merge_heads(o_BxHxLxK))


@registry.register("linformer", capabilities=registry.Capabilities(
    description="Linformer: keys and values projected along the sequence to k slots",
    causal=False, padding=True, variable_length=True,
    dense_equivalent={"k": 16, "projection_init": "identity"},
    test_hparams={"k": 8}, rotary=True))
def build_linformer(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                    rotary: bool = False, k: int = 256, share_kv: bool = False,
                    projection_init: str = "uniform", qkv_dim: int | None = None,
                    attention_dropout: float = 0.1, use_bias: bool = True) -> Linformer:
    del causal  # the registry refuses causal=True (capabilities)
    return Linformer(dim=dim, num_heads=num_heads, max_len=max_len, k=k, share_kv=share_kv,
                     projection_init=projection_init, qkv_dim=qkv_dim,
                     attention_dropout=attention_dropout, use_bias=use_bias, rotary=rotary,
                     rngs=rngs)


# Memory-compressed attention ---------------------------------------------------------

CONV_INITS = ("lecun", "identity")


def _mean_pool_init(key, shape, dtype=jnp.float32):
    """Conv kernel (c, F, F) that averages each block of c positions; identity at c = 1."""
    del key
    width, features, out_features = shape
    return jnp.broadcast_to(jnp.eye(features, out_features, dtype=dtype) / width, shape)


class MemoryCompressedAttention(MultiHeadAttention):
    """Attention over keys/values shrunk by a strided convolution (kernel = stride = c).

    The sequence is split into blocks of c positions (the last one right-padded);
    block m gives one compressed key and value, conv(K[mc:(m+1)c]), from its real
    positions only (padded ones are zeroed first); a block without a real position
    is masked.

    Causal form (block-causal): a query at position i, in block n = i // c, sees
    the compressed blocks m < n (all of their positions are <= i, and all
    are in the past) plus the uncompressed keys j of its own block with
    nc <= j <= i, in one softmax. Own-block keys are kept exact because the
    compressed key of block n would mix in positions after i; without them the
    first c - 1 positions would see nothing at all. With c = 1 and the identity
    convolution, both forms equal dense attention.

    rotary: queries and the raw own-block keys are rotated by their positions, and the
    compressed key of block m by the block's centre m c + (c - 1) / 2, after the
    convolution (which mixes features across the block's positions, so it cannot take
    keys that are already rotated by different angles). With c = 1 this is rotary
    attention exactly.
    """

    def __init__(self, *, dim: int, num_heads: int, causal: bool, compression: int,
                 conv_init: str, qkv_dim: int | None, attention_dropout: float,
                 use_bias: bool, rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if compression < 1:
            raise ValueError(f"compressed: compression must be >= 1, got {compression}")
        if conv_init not in CONV_INITS:
            raise ValueError(f"compressed: unknown conv_init {conv_init!r}; "
                             f"valid: {', '.join(CONV_INITS)}")
        self.compression = compression
        features = self.num_heads * self.head_dim
        kernel_init = (_mean_pool_init if conv_init == "identity"
                       else jax.nn.initializers.lecun_normal())
        conv = dict(kernel_size=(compression,), strides=(compression,), padding="VALID",
                    kernel_init=layers.named(kernel_init, (None, None, "qkv")),
                    bias_init=layers.named(layers.zeros, ("qkv",)), rngs=rngs)
        self.key_conv = nnx.Conv(features, features, **conv)
        self.value_conv = nnx.Conv(features, features, **conv)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        batch, seq_len, _ = x_BxLxD.shape
        c = self.compression
        num_blocks = -(-seq_len // c)
        extra = num_blocks * c - seq_len
        if padding_mask is None:
            padding_mask = jnp.ones((batch, seq_len), jnp.bool_)
        real_BxP = jnp.pad(padding_mask.astype(jnp.bool_), ((0, 0), (0, extra)))
        block_real_BxN = real_BxP.reshape(batch, num_blocks, c).any(-1)

        def compress(proj: nnx.Linear, conv: nnx.Conv) -> tuple[jax.Array, jax.Array]:
            full_BxPxF = jnp.pad(proj(x_BxLxD), ((0, 0), (0, extra), (0, 0)))
            full_BxPxF = jnp.where(real_BxP[..., None], full_BxPxF, 0.0)
            return self.split_heads(full_BxPxF), self.split_heads(conv(full_BxPxF))

        k_BxHxPxK, kc_BxHxNxK = compress(self.key, self.key_conv)
        v_BxHxPxK, vc_BxHxNxK = compress(self.value, self.value_conv)
        q_BxHxLxK = self.rotate(self.split_heads(self.query(x_BxLxD)))
        k_BxHxPxK = self.rotate(k_BxHxPxK)
        kc_BxHxNxK = self.rotate(kc_BxHxNxK, jnp.arange(num_blocks) * c + (c - 1) / 2)
        dropout_fn = self.dropout_fn(deterministic)
        if not self.causal:
            o_BxHxLxK = dot_product_attention(q_BxHxLxK, kc_BxHxNxK, vc_BxHxNxK,
                                              mask=block_real_BxN[:, None, None, :],
                                              dropout_fn=dropout_fn)
            return self.out(self.merge_heads(o_BxHxLxK))

        # Per query block n: keys = [N compressed blocks ; the c raw keys of block n].
        h, n, kd = self.num_heads, num_blocks, self.head_dim
        q_BxHxPxK = jnp.pad(q_BxHxLxK, ((0, 0), (0, 0), (0, extra), (0, 0)))

        def per_block(compressed_BxHxNxK, raw_BxHxPxK):
            shared_BxHxNxNxK = jnp.broadcast_to(compressed_BxHxNxK[:, :, None],
                                                (batch, h, n, n, kd))
            own_BxHxNxCxK = raw_BxHxPxK.reshape(batch, h, n, c, kd)
            both = jnp.concatenate([shared_BxHxNxNxK, own_BxHxNxCxK], axis=3)
            return both.reshape(batch, h * n, n + c, kd)

        past_NxN = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]
        own_CxC = jnp.arange(c)[None, :] <= jnp.arange(c)[:, None]
        shared_BxNx1xN = (past_NxN[None] & block_real_BxN[:, None, :])[:, :, None, :]
        own_BxNxCxC = own_CxC[None, None] & real_BxP.reshape(batch, n, 1, c)
        mask_BxNxCx_ = jnp.concatenate(
            [jnp.broadcast_to(shared_BxNx1xN, (batch, n, c, n)), own_BxNxCxC], axis=-1)
        mask = jnp.broadcast_to(mask_BxNxCx_[:, None], (batch, h, n, c, n + c))
        o = dot_product_attention(q_BxHxPxK.reshape(batch, h * n, c, kd),
                                  per_block(kc_BxHxNxK, k_BxHxPxK),
                                  per_block(vc_BxHxNxK, v_BxHxPxK),
                                  mask=mask.reshape(batch, h * n, c, n + c),
                                  dropout_fn=dropout_fn)
        o_BxHxLxK = o.reshape(batch, h, n * c, kd)[:, :, :seq_len]
        return self.out(self.merge_heads(o_BxHxLxK))


@registry.register("compressed", capabilities=registry.Capabilities(
    description="memory-compressed attention: strided convolution shrinks keys/values by c",
    causal=True, decode="recompute", padding=True, variable_length=True,
    dense_equivalent={"compression": 1, "conv_init": "identity"},
    test_hparams={"compression": 3}, rotary=True))
def build_compressed(*, dim: int, num_heads: int, max_len: int, causal: bool,
                     rngs: nnx.Rngs, rotary: bool = False, compression: int = 3,
                     conv_init: str = "lecun", qkv_dim: int | None = None,
                     attention_dropout: float = 0.1,
                     use_bias: bool = True) -> MemoryCompressedAttention:
    del max_len  # any length works
    return MemoryCompressedAttention(dim=dim, num_heads=num_heads, causal=causal,
                                     compression=compression, conv_init=conv_init,
                                     qkv_dim=qkv_dim, attention_dropout=attention_dropout,
                                     use_bias=use_bias, rotary=rotary, rngs=rngs)


# Synthesizer -----------------------------------------------------------------------

SYNTHESIZER_MODES = ("dense", "random", "factorized_random", "dot")


class _Fixed(nnx.Variable):
    """A non-trainable tensor (the fixed random synthesizer's logits)."""


class Synthesizer(nnx.Module):
    """Synthesized attention logits, optionally mixed: softmax(sum_i a_i S_i) (x W_v).

    Modes (joined with "+" for a mixture, e.g. "random+dot"), per head, for
    queries i and keys j < L:
      dense:             S[i, j] = (W2 relu(W1 x_i + b1) + b2)[j], W2: head_dim -> max_len
      random:            S[i, j] = R[i, j], R learned (or fixed) max_len x max_len
      factorized_random: S = R1 R2, R1: max_len x k, R2: k x max_len
      dot:               S[i, j] = q_i . k_j / sqrt(head_dim) (plain attention)
    The mixture weights a are softmax(w) with w learned (init equal), or fixed by
    `mix`. Causal and padding masks apply to S before the softmax.
    """

    def __init__(self, *, dim: int, num_heads: int, max_len: int, causal: bool, mode: str,
                 k: int, mix: Sequence[float] | None, fixed_random: bool,
                 qkv_dim: int | None, attention_dropout: float, use_bias: bool,
                 rngs: nnx.Rngs):
        modes = tuple(mode.split("+"))
        unknown = [m for m in modes if m not in SYNTHESIZER_MODES]
        if unknown or len(set(modes)) != len(modes):
            raise ValueError(f"synthesizer: bad mode {mode!r}; use distinct modes from "
                             f"{', '.join(SYNTHESIZER_MODES)} joined with '+'")
        qkv_dim = dim if qkv_dim is None else qkv_dim
        if num_heads <= 0 or qkv_dim % num_heads:
            raise ValueError(f"qkv_dim ({qkv_dim}) must be a multiple of num_heads ({num_heads})")
        self.modes = modes
        self.max_len = max_len
        self.causal = causal
        self.num_heads = num_heads
        self.head_dim = qkv_dim // num_heads
        h, kd = num_heads, self.head_dim
        proj = dict(use_bias=use_bias, rngs=rngs)
        if "dot" in modes:
            self.query = layers.dense(dim, qkv_dim, ("embed", "qkv"), **proj)
            self.key = layers.dense(dim, qkv_dim, ("embed", "qkv"), **proj)
        self.value = layers.dense(dim, qkv_dim, ("embed", "qkv"), **proj)
        self.out = layers.dense(qkv_dim, dim, ("qkv", "embed"), **proj)
        xavier = layers.xavier_uniform
        if "dense" in modes:
            self.dense_hidden = layers.dense(dim, qkv_dim, ("embed", "qkv"), **proj)
            self.dense_logits = layers.param(
                jax.nn.initializers.xavier_uniform(in_axis=1, out_axis=2),
                ("heads", None, None), (h, kd, max_len), rngs=rngs)
            self.dense_bias = layers.param(layers.zeros, ("heads", None), (h, max_len),
                                           rngs=rngs)
        if "random" in modes:
            random_logits = layers.param(xavier, ("heads", None, None), (h, max_len, max_len),
                                         rngs=rngs)
            self.random_logits = _Fixed(random_logits[...]) if fixed_random else random_logits
        if "factorized_random" in modes:
            if k <= 0:
                raise ValueError(f"synthesizer: k must be positive, got {k}")
            self.factor_a = layers.param(xavier, ("heads", None, None), (h, max_len, k),
                                         rngs=rngs)
            self.factor_b = layers.param(xavier, ("heads", None, None), (h, k, max_len),
                                         rngs=rngs)
        self.mix = None if mix is None else tuple(float(a) for a in mix)
        if self.mix is not None and len(self.mix) != len(modes):
            raise ValueError(f"synthesizer: mix {self.mix} needs one weight per mode {modes}")
        self.mix_logits = (layers.param(layers.zeros, (None,), (len(modes),), rngs=rngs)
                           if self.mix is None and len(modes) > 1 else None)
        self.attention_dropout = nnx.Dropout(attention_dropout, rngs=rngs)

    def split_heads(self, x_BxLxF: jax.Array) -> jax.Array:
        b, l, _ = x_BxLxF.shape
        return x_BxLxF.reshape(b, l, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

    def mode_logits(self, mode: str, x_BxLxD: jax.Array) -> jax.Array:
        """Logits of one mode, broadcastable to BxHxLxL."""
        seq_len = x_BxLxD.shape[1]
        if mode == "dense":
            hidden_BxHxLxK = self.split_heads(jax.nn.relu(self.dense_hidden(x_BxLxD)))
            logits = jnp.einsum("bhlk,hkm->bhlm", hidden_BxHxLxK,
                                self.dense_logits[:, :, :seq_len])
            return logits + self.dense_bias[:, None, :seq_len]
        if mode == "random":
            return self.random_logits[None, :, :seq_len, :seq_len]
        if mode == "factorized_random":
            return jnp.einsum("hlk,hkm->hlm", self.factor_a[:, :seq_len],
                              self.factor_b[:, :, :seq_len])[None]
        q_BxHxLxK = self.split_heads(self.query(x_BxLxD))
        k_BxHxLxK = self.split_heads(self.key(x_BxLxD))
        return jnp.einsum("bhqk,bhsk->bhqs", q_BxHxLxK, k_BxHxLxK) / math.sqrt(self.head_dim)

    def mixture_weights(self) -> jax.Array:
        if self.mix is not None:
            return jnp.asarray(self.mix, jnp.float32)
        if self.mix_logits is None:
            return jnp.ones((1,), jnp.float32)
        return jax.nn.softmax(self.mix_logits[...])

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        batch, seq_len, _ = x_BxLxD.shape
        check_length("synthesizer", seq_len, self.max_len)
        weights = self.mixture_weights()
        logits_BxHxLxL = sum(weights[i] * self.mode_logits(m, x_BxLxD)
                             for i, m in enumerate(self.modes))
        logits_BxHxLxL = jnp.broadcast_to(logits_BxHxLxL,
                                          (batch, self.num_heads, seq_len, seq_len))
        mask = make_attention_mask(padding_mask, causal=self.causal, q_len=seq_len,
                                   kv_len=seq_len)
        dropout_fn = (None if deterministic
                      else lambda w: self.attention_dropout(w, deterministic=False))
        o_BxHxLxK = attend_logits(logits_BxHxLxL, self.split_heads(self.value(x_BxLxD)),
                                  mask=mask, dropout_fn=dropout_fn)
        b, h, l, kd = o_BxHxLxK.shape
        return self.out(o_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, l, h * kd))

    # Decoding, form kv_cache (models.decoding): the values of every earlier position (and
    # the keys in dot mode); a token synthesizes its own row of logits over them: O(M).
    def init_cache(self, batch: int, max_len: int) -> dict:
        shape = (batch, self.num_heads, self.max_len, self.head_dim)
        cache = {"pos": jnp.zeros((batch,), jnp.int32), "v": jnp.zeros(shape, jnp.float32)}
        if "dot" in self.modes:
            cache["k"] = jnp.zeros(shape, jnp.float32)
        return cache

    def prefill(self, cache: dict, x_BxLxD: jax.Array, padding_mask: jax.Array | None):
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask)
        batch, length, _ = x_BxLxD.shape
        new = {"pos": decoding.lengths_of(padding_mask, batch, length)}
        for name in ("v", "k") if "dot" in self.modes else ("v",):
            proj = self.value if name == "v" else self.key
            new[name] = jax.lax.dynamic_update_slice(
                cache[name], self.split_heads(proj(x_BxLxD)).astype(jnp.float32), (0, 0, 0, 0))
        return y_BxLxD, new

    def _row_logits(self, mode: str, x_BxD: jax.Array, pos_B: jax.Array,
                    k_BxHxMxK: jax.Array | None) -> jax.Array:
        """Row pos of one mode's logits, BxHxM."""
        if mode == "dense":
            hidden_BxHxK = self.split_heads(jax.nn.relu(self.dense_hidden(x_BxD[:, None])))
            return (jnp.einsum("bhk,hkm->bhm", hidden_BxHxK[:, :, 0], self.dense_logits[...])
                    + self.dense_bias[...][None])
        if mode == "random":
            return self.random_logits[...][:, pos_B].transpose(1, 0, 2)
        if mode == "factorized_random":
            a_BxHxK = self.factor_a[...][:, pos_B].transpose(1, 0, 2)
            return jnp.einsum("bhk,hkm->bhm", a_BxHxK, self.factor_b[...])
        q_BxHxK = self.split_heads(self.query(x_BxD[:, None]))[:, :, 0]
        return jnp.einsum("bhk,bhmk->bhm", q_BxHxK, k_BxHxMxK) / math.sqrt(self.head_dim)

    def step(self, cache: dict, x_BxD: jax.Array) -> tuple[jax.Array, dict]:
        pos_B = cache["pos"]
        new = {"pos": pos_B + 1}
        for name in ("v", "k") if "dot" in self.modes else ("v",):
            proj = self.value if name == "v" else self.key
            row_BxHxK = self.split_heads(proj(x_BxD[:, None]))[:, :, 0]
            new[name] = decoding.write_row(cache[name].transpose(0, 2, 1, 3), pos_B,
                                           row_BxHxK).transpose(0, 2, 1, 3)
        weights = self.mixture_weights()
        logits_BxHxM = sum(weights[i] * self._row_logits(m, x_BxD, pos_B, new.get("k"))
                           for i, m in enumerate(self.modes))
        seen_Bx1x1xM = (jnp.arange(self.max_len)[None] <= pos_B[:, None])[:, None, None]
        o_BxHx1xK = attend_logits(logits_BxHxM[:, :, None], new["v"].astype(x_BxD.dtype),
                                  mask=seen_Bx1x1xM)
        b, h, _, kd = o_BxHx1xK.shape
        return self.out(o_BxHx1xK.reshape(b, h * kd)), new


@registry.register("synthesizer", capabilities=registry.Capabilities(
    description="Synthesizer: attention logits from an MLP of x_i or learned tables (+ mixes)",
    causal=True, decode="kv_cache",
    padding=True, variable_length=True, dense_equivalent={"mode": "dot"},
    test_hparams={"mode": "dense+random+factorized_random", "k": 4},
    rotary_refusal="its attention logits are synthesized from each token alone or learned "
    "as position-to-position tables, not formed from queries and keys (mode='dot' alone is "
    "transformer, which takes rotary)"))
def build_synthesizer(*, dim: int, num_heads: int, max_len: int, causal: bool,
                      rngs: nnx.Rngs, mode: str = "dense", k: int = 8,
                      mix: Sequence[float] | None = None, fixed_random: bool = False,
                      qkv_dim: int | None = None, attention_dropout: float = 0.1,
                      use_bias: bool = True) -> Synthesizer:
    return Synthesizer(dim=dim, num_heads=num_heads, max_len=max_len, causal=causal,
                       mode=mode, k=k, mix=mix, fixed_random=fixed_random, qkv_dim=qkv_dim,
                       attention_dropout=attention_dropout, use_bias=use_bias, rngs=rngs)
