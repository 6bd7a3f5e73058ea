"""The Forgetting Transformer (`fox`; Lin et al. 2025, "Forgetting Transformer: Softmax
Attention with a Forget Gate", ICLR 2025): softmax attention whose logits are biased by a
data-dependent forget gate,

    o_i = sum_j softmax_j(q_i . k_j / sqrt(d) + D_ij) v_j,
    D_ij = sum_{j < s <= i} log f_s = c_i - c_j,   c_i = sum_{s <= i} log f_s,
    f_s = sigmoid(w_f . x_s + b_f)   (one scalar per head and position)

so a key fades with the gates between it and the query; f = 1 everywhere is softmax
attention (`forget_gate=False` builds that: `transformer` without biases). The layer is
fla's `ForgettingAttention` (fla/layers/forgetting_attn.py at bc3b101) at its defaults:
bias-free q/k/v/o projections, f_proj with a bias (zero at initialisation here; fla's
layer leaves torch's default and its model re-initialises Linears with normal(0.02)), no
qk norm, no window, no output gate; `output_gate=True` adds fla's `use_output_gate`
(o * sigmoid(W_g x) before the output projection, one of the paper's "Pro" parts). No
position embedding (pos_emb 'none', the paper's default: the gate orders the keys);
rotary is accepted (the paper also trains FoX with RoPE).

Padded positions forget nothing (log f = 0) and are masked as keys, so they reach no
real position. causal=False (LRA's classifiers; FoX itself is causal) decays in both
directions by the gates between the two positions: D_ij = -|c_i - c_j| (the causal bias
for j <= i, its mirror for j > i); ours, not the paper's.

attention_impl='flash' (the config argument every task config takes): the O(L)-memory
chunked softmax of models/kernels/chunked_attention.py with the forget bias computed per
tile (FlashAttention-2's backward, the bias's gradient in the same pass), on every
platform: cuDNN's and splash's fused kernels take no data-dependent bias (FoX's own Triton
kernel is the GPU analogue, not ported). 'dense' (the default) materialises the L x L
logits; the two are tested equal (tests/models/test_fox.py).

Decoding: a kv cache that also holds each cached key's c_j and the running c of the
newest position, so a step costs O(position), as softmax attention's.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, masks, registry
from models.attention import dense
from models.kernels.chunked_attention import chunked_attention

IMPLS = ("dense", "flash")


def forget_bias(c_BxHxQ: jax.Array, c_BxHxKv: jax.Array, *, causal: bool) -> jax.Array:
    """D (BxHxQxKv, float32): c_i - c_j (causal: the entries j > i are masked anyway), or
    -|c_i - c_j| in both directions."""
    diff = c_BxHxQ[..., :, None] - c_BxHxKv[..., None, :]
    return diff if causal else -jnp.abs(diff)


class ForgettingAttention(dense.MultiHeadAttention):
    """fla's ForgettingAttention (module docstring); `query`, `key`, `value`, `out` as in
    `transformer` (bias-free by default), `forget` the gate's projection (D -> heads)."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, qkv_dim: int | None,
                 attention_dropout: float, use_bias: bool, rotary: bool, forget_gate: bool,
                 output_gate: bool, attention_impl: str, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        qkv_dim = self.num_heads * self.head_dim
        self.attention_impl = attention_impl
        self.forget = (layers.dense(dim, num_heads, ("embed", "heads"), rngs=rngs)
                       if forget_gate else None)
        self.gate = (layers.dense(dim, qkv_dim, ("embed", "qkv"), use_bias=False, rngs=rngs)
                     if output_gate else None)

    def log_forget(self, x_BxLxD: jax.Array, real_BxL: jax.Array) -> jax.Array:
        """log f (BxHxL, float32, <= 0): 0 at padded positions and without the gate."""
        b, length = x_BxLxD.shape[:2]
        if self.forget is None:
            return jnp.zeros((b, self.num_heads, length), jnp.float32)
        log_f_BxLxH = jax.nn.log_sigmoid(self.forget(x_BxLxD).astype(jnp.float32))
        return jnp.where(real_BxL[..., None], log_f_BxLxH, 0.0).transpose(0, 2, 1)

    def finish(self, o_BxHxLxK: jax.Array, x_BxLxD: jax.Array) -> jax.Array:
        """The output projection's input, after the output gate where there is one."""
        o_BxLxF = self.merge_heads(o_BxHxLxK)
        if self.gate is not None:
            o_BxLxF = o_BxLxF * jax.nn.sigmoid(self.gate(x_BxLxD).astype(jnp.float32)
                                               ).astype(o_BxLxF.dtype)
        return self.out(o_BxLxF)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        b, length = x_BxLxD.shape[:2]
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        real_BxL = layers.valid_mask(padding_mask, b, length)
        c_BxHxL = jnp.cumsum(self.log_forget(x_BxLxD, real_BxL), axis=-1)
        if self.attention_impl == "flash":
            rate = 0.0 if deterministic else self.attention_dropout.rate
            o_BxHxLxK = chunked_attention(
                q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, masks.causal() if self.causal else None,
                valid_BxKv=real_BxL, dropout_rate=rate,
                dropout_seed=self.dropout_seed() if rate > 0 else None,
                forget=(c_BxHxL, c_BxHxL), forget_both_ways=not self.causal)
            return self.finish(o_BxHxLxK, x_BxLxD)
        logits = jnp.einsum("bhqk,bhsk->bhqs", q_BxHxLxK, k_BxHxLxK,
                            preferred_element_type=jnp.float32) / math.sqrt(self.head_dim)
        logits = logits + forget_bias(c_BxHxL, c_BxHxL, causal=self.causal)
        mask = dense.make_attention_mask(padding_mask, causal=self.causal, q_len=length,
                                         kv_len=length)
        o_BxHxLxK = dense.attend_logits(logits, v_BxHxLxK, mask=mask,
                                        dropout_fn=self.dropout_fn(deterministic))
        return self.finish(o_BxHxLxK, x_BxLxD)

    # ------------------------------------------------------------------ decoding

    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        """k, v (BxHxMxK) and c (BxHxM) of every position, and c of the newest ("c_now")."""
        decoding.require_causal(self, "fox")
        shape = (batch, self.num_heads, max_len, self.head_dim)
        return {"pos": jnp.zeros((batch,), jnp.int32), "k": jnp.zeros(shape, jnp.float32),
                "v": jnp.zeros(shape, jnp.float32),
                "c": jnp.zeros(shape[:3], jnp.float32),
                "c_now": jnp.zeros(shape[:2], jnp.float32)}

    def prefill(self, cache: decoding.Cache, x_BxLxD: jax.Array,
                padding_mask: jax.Array | None) -> tuple[jax.Array, decoding.Cache]:
        """A right-padded prompt: the parallel causal outputs and its keys, values and c
        (padded positions forget nothing, so c_now is c at the last position)."""
        decoding.require_causal(self, "fox")
        b, length = x_BxLxD.shape[:2]
        y_BxLxD = self(x_BxLxD, padding_mask=padding_mask, deterministic=True)
        _, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        c_BxHxL = jnp.cumsum(self.log_forget(x_BxLxD, layers.valid_mask(padding_mask, b,
                                                                       length)), axis=-1)
        put = lambda buf, t: jax.lax.dynamic_update_slice(  # noqa: E731
            buf, t.astype(jnp.float32), (0,) * buf.ndim)
        return y_BxLxD, {"pos": decoding.lengths_of(padding_mask, b, length),
                         "k": put(cache["k"], k_BxHxLxK), "v": put(cache["v"], v_BxHxLxK),
                         "c": put(cache["c"], c_BxHxL), "c_now": c_BxHxL[..., -1]}

    def step(self, cache: decoding.Cache, x_BxD: jax.Array) -> tuple[jax.Array, decoding.Cache]:
        """One token per row at its own position cache["pos"]."""
        decoding.require_causal(self, "fox")
        pos_B = cache["pos"]
        x_Bx1xD = x_BxD[:, None]
        q_BxHx1xK, k_BxHx1xK, v_BxHx1xK = (self.split_heads(p(x_Bx1xD)) for p in
                                           (self.query, self.key, self.value))
        q_BxHx1xK = self.rotate(q_BxHx1xK, pos_B[:, None, None])
        k_BxHx1xK = self.rotate(k_BxHx1xK, pos_B[:, None, None])
        c_now_BxH = cache["c_now"] + self.log_forget(
            x_Bx1xD, jnp.ones(x_Bx1xD.shape[:2], jnp.bool_))[..., 0]
        # Written as BxMx... rows, so that write_row's slot axis is axis 1.
        write = lambda buf, t: decoding.write_row(  # noqa: E731
            jnp.moveaxis(buf, 2, 1), pos_B, t).swapaxes(1, 2)
        k_BxHxMxK = write(cache["k"], k_BxHx1xK[:, :, 0])
        v_BxHxMxK = write(cache["v"], v_BxHx1xK[:, :, 0])
        c_BxHxM = write(cache["c"], c_now_BxH)
        logits_BxHxM = (jnp.einsum("bhk,bhmk->bhm", q_BxHx1xK[:, :, 0].astype(jnp.float32),
                                   k_BxHxMxK) / math.sqrt(self.head_dim)
                        + c_now_BxH[..., None] - c_BxHxM)
        seen_Bx1x1xM = (jnp.arange(c_BxHxM.shape[-1])[None] <= pos_B[:, None])[:, None, None]
        o_BxHx1xK = dense.attend_logits(logits_BxHxM[:, :, None], v_BxHxMxK,
                                        mask=seen_Bx1x1xM)
        y_BxD = self.finish(o_BxHx1xK.astype(x_BxD.dtype), x_Bx1xD)[:, 0]
        return y_BxD, {"pos": pos_B + 1, "k": k_BxHxMxK, "v": v_BxHxMxK, "c": c_BxHxM,
                       "c_now": c_now_BxH}


@registry.register("fox", capabilities=registry.Capabilities(
    description="Forgetting Transformer: softmax attention with a data-dependent forget gate "
                "on the logits (Lin et al. 2025); causal=False decays both ways",
    causal=True, decode="kv_cache", padding=True, variable_length=True,
    dense_equivalent={"forget_gate": False}, rotary=True, pos_emb="none",
    # Global in exact arithmetic, but the gates choose the reach: a key whose decay
    # sum_s log f_s is below ~-17 weighs under 2^-24 of a near one and leaves a float32
    # output bitwise unchanged (at initialisation f ~ 1/2, about 20 positions).
    receptive_field="limited"))
def build_fox(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
              rotary: bool = False, qkv_dim: int | None = None, attention_dropout: float = 0.1,
              use_bias: bool = False, forget_gate: bool = True, output_gate: bool = False,
              attention_impl: str = "dense") -> ForgettingAttention:
    """fla's ForgettingAttention defaults: no biases in q/k/v/o, the forget gate on, no
    output gate. attention_impl: 'dense' or 'flash' (module docstring)."""
    del max_len  # any length
    if attention_impl not in IMPLS:
        raise registry.RegistryError(
            f"fox: attention_impl={attention_impl!r} is not available; use 'dense' or 'flash' "
            "(the chunked O(L)-memory form with the forget bias; its logits are not a mask, "
            "so the block-sparse forms do not apply)")
    return ForgettingAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                               attention_dropout=attention_dropout, use_bias=use_bias,
                               rotary=rotary, forget_gate=forget_gate,
                               output_gate=output_gate, attention_impl=attention_impl,
                               rngs=rngs)
