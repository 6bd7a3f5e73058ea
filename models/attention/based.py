"""Based's linear attention (`based`; Arora et al. 2024, "Simple linear attention language
models balance the recall-throughput tradeoff"): linear attention whose feature map is the
2nd-order Taylor expansion of exp, on small projected queries and keys,

    phi(x) = [1, x / d^(1/4), vec(x x^T) / (sqrt(2) sqrt(d))]      (1 + d + d^2 features)
    phi(q) . phi(k) = 1 + q.k / sqrt(d) + (q.k)^2 / (2 d),          d = feature_dim
    o_i = sum_{j<=i} phi(q_i).phi(k_j) v_j / (sum_{j<=i} phi(q_i).phi(k_j) + eps)

As Zoology's `Based` mixer (zoology/mixers/based.py and feature_maps/taylor.py at d88d6f5,
the row its MQAR table names "based"): bias-free q and k projections to feature_dim per head
(16), v to the head width, no positions of its own, eps 1e-12 (the Taylor kernel is at
least 1/2, so the denominator never vanishes), bias-free output projection. The Based
*architecture* interleaves these layers with sliding-window softmax layers and short
convolutions: here that is a hybrid stack (`hybrid=local`, docs/hybrids.md) and the
scaffold's `block.short_conv`; Zoology's MQAR runs put the scaffold's convolution before
this mixer too (models_repo.py `add_based`).

Forms as `linear`'s (models/attention/linear.py): the chunked causal sums of linear_scan,
the bidirectional sums, the recurrent decoding of S (F x K) and z (F), F = 1 + d + d^2;
and, causal, the quadratic form Zoology trains with (its `parallel_forward`), through the
kernel's closed form: A_ij = 1 + s_ij + s_ij^2 / 2, s_ij = q_i.k_j / sqrt(d), masked to
j <= i and to real keys, o = A V / (A 1 + eps). It costs L^2 (d + K) a head against the
chunked form's L F K with F = 273 at d = 16: four times faster forward and backward at L
256 on a CPU core (B 64, 4 heads, K 16: 0.21 s against 0.88 s), so `impl="auto"` (the
default) takes it for causal layers up to QUADRATIC_UP_TO positions, where its L x L scores
stay small, and the chunked sums beyond. `impl="chunked"` / `"quadratic"` force one; the
forms agree to float32 rounding (tests/models/test_based.py, through configs/mqar.py).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention import recurrent
from models.attention.linear import DEFAULT_CHUNK, _KernelAttention
from models.attention.linear_scan import linear_attention

EPS = 1e-12  # Zoology's Based
IMPLS = ("auto", "chunked", "quadratic")
QUADRATIC_UP_TO = 512  # auto: the quadratic form up to this length (B x H x L x L scores)


def taylor_features(x_BxHxLxF: jax.Array) -> jax.Array:
    """Zoology's TaylorExp.forward: [1, x / d^(1/4), (x x^T).flatten / (sqrt(2) sqrt(d))]
    over the last axis (d of it), float32."""
    x = x_BxHxLxF.astype(jnp.float32)
    d = x.shape[-1]
    x2 = (x[..., :, None] * x[..., None, :]).reshape(x.shape[:-1] + (d * d,)) / math.sqrt(2)
    return jnp.concatenate([jnp.ones(x.shape[:-1] + (1,), jnp.float32),
                            x / math.sqrt(math.sqrt(d)), x2 / math.sqrt(d)], axis=-1)


def quadratic(q_BxHxLxF: jax.Array, k_BxHxLxF: jax.Array, v_BxHxLxK: jax.Array,
              padding_mask: jax.Array | None, eps: float) -> jax.Array:
    """The causal layer's outputs from the Taylor kernel's closed form (module docstring),
    float32: padded keys (padding_mask False) add nothing, as their zeroed features do in
    the chunked form (the closed form's constant 1 would count them otherwise)."""
    q, k = q_BxHxLxF.astype(jnp.float32), k_BxHxLxF.astype(jnp.float32)
    length = q.shape[2]
    s_BxHxLxL = jnp.einsum("bhld,bhmd->bhlm", q, k) / math.sqrt(q.shape[-1])
    keep = jnp.tril(jnp.ones((length, length), jnp.bool_))[None, None]
    v = v_BxHxLxK.astype(jnp.float32)
    if padding_mask is not None:  # as the chunked form's drop_padded: keys and values
        real_Bx1x1xL = padding_mask.astype(jnp.bool_)[:, None, None, :]
        keep = keep & real_Bx1x1xL
        v = jnp.where(jnp.swapaxes(real_Bx1x1xL, -1, -2), v, 0.0)
    a_BxHxLxL = jnp.where(keep, 1.0 + s_BxHxLxL + 0.5 * s_BxHxLxL * s_BxHxLxL, 0.0)
    num_BxHxLxK = jnp.einsum("bhlm,bhmk->bhlk", a_BxHxLxL, v)
    return num_BxHxLxK / (jnp.sum(a_BxHxLxL, axis=-1, keepdims=True) + eps)


class BasedLinearAttention(_KernelAttention):
    """Zoology's Based (module docstring); `query`, `key` project to feature_dim per head."""

    def __init__(self, *, feature_dim: int, eps: float, dim: int, num_heads: int, rngs,
                 impl: str = "auto", **kwargs):
        if feature_dim < 1:
            raise ValueError(f"feature_dim must be positive, got {feature_dim}")
        if impl not in IMPLS:
            raise ValueError(f"impl={impl!r}; choose one of {', '.join(IMPLS)}")
        super().__init__(dim=dim, num_heads=num_heads, rngs=rngs, **kwargs)
        self.feature_dim, self.eps, self.impl = feature_dim, eps, impl
        width = num_heads * feature_dim
        self.query = layers.dense(dim, width, ("embed", "qkv"), use_bias=False, rngs=rngs)
        self.key = layers.dense(dim, width, ("embed", "qkv"), use_bias=False, rngs=rngs)

    def qkv(self, x_BxLxD: jax.Array, positions: jax.Array | None = None):
        del positions  # no positions of its own
        b, l, _ = x_BxLxD.shape
        heads = lambda t: t.reshape(b, l, self.num_heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
        return heads(self.query(x_BxLxD)), heads(self.key(x_BxLxD)), heads(self.value(x_BxLxD))

    def quadratic_form(self, length: int) -> bool:
        """Whether a layer of this length runs the quadratic form (module docstring)."""
        return self.causal and (self.impl == "quadratic" or (
            self.impl == "auto" and length <= QUADRATIC_UP_TO))

    def attend(self, q_BxHxLxF, k_BxHxLxF, v_BxHxLxK, x_BxLxD, padding_mask, deterministic):
        if self.quadratic_form(q_BxHxLxF.shape[2]):
            return quadratic(q_BxHxLxF, k_BxHxLxF, v_BxHxLxK, padding_mask, self.eps)
        phi_k, v = self.drop_padded(taylor_features(k_BxHxLxF), v_BxHxLxK, padding_mask)
        return linear_attention(taylor_features(q_BxHxLxF), phi_k, v, causal=self.causal,
                                chunk_size=self.chunk_size, eps=self.eps)

    def empty_state(self, batch: int) -> recurrent.State:
        d = self.feature_dim
        return recurrent.zero_sums(batch, self.num_heads, 1 + d + d * d, self.head_dim)

    def prompt(self, q_BxHxLxF, k_BxHxLxF, v_BxHxLxK, x_BxLxD, padding_mask):
        o = self.attend(q_BxHxLxF, k_BxHxLxF, v_BxHxLxK, x_BxLxD, padding_mask, True)
        phi_k, v = self.drop_padded(taylor_features(k_BxHxLxF), v_BxHxLxK, padding_mask)
        return o, recurrent.prompt_sums(phi_k, phi_k, v)

    def recur(self, state, q_BxHx1xF, k_BxHx1xF, v_BxHx1xK, x_BxD, pos_B):
        del pos_B
        phi_q, phi_k = taylor_features(q_BxHx1xF)[:, :, 0], taylor_features(k_BxHx1xF)[:, :, 0]
        state = recurrent.add_token(state, phi_k, phi_k, v_BxHx1xK[:, :, 0])
        num_BxHxK, den_BxH = recurrent.read(state, phi_q, phi_q)
        return num_BxHxK / (den_BxH[..., None] + self.eps), state


@registry.register("based", capabilities=registry.Capabilities(
    description="Based: linear attention with 2nd-order Taylor features of small projected "
                "q, k (Arora et al. 2024; Zoology's mixer); quadratic or chunked causal form",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5, "feature_dim": 4},
    rotary_refusal="its Taylor features of q and k do not commute with a rotation, and "
                   "Zoology's Based adds none (apply_rotary=False)"))
def build_based(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                qkv_dim: int | None = None, feature_dim: int = 16, eps: float = EPS,
                chunk_size: int = DEFAULT_CHUNK, impl: str = "auto") -> BasedLinearAttention:
    """Zoology's Based defaults: feature_dim 16, Taylor features, eps 1e-12, no biases;
    impl: the causal form (module docstring)."""
    del max_len  # any length
    return BasedLinearAttention(feature_dim=feature_dim, eps=eps, dim=dim,
                                num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                                use_bias=False, chunk_size=chunk_size, impl=impl, rngs=rngs)
