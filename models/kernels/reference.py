"""Plain O(L^2) references for the Pallas kernels in `models/kernels/`.

Written for clarity, not speed: tests compare the kernels (and their custom VJPs) against
these functions and `jax.grad` of them.
"""
import jax.numpy as jnp
from jax import lax

# Full f32 products: GPUs would otherwise use TF32 (10-bit mantissa) for f32 einsums.
_HIGHEST = lax.Precision.HIGHEST


def linear_attention_quadratic(q_BxHxLxK: jnp.ndarray, k_BxHxLxK: jnp.ndarray,
                               v_BxHxLxV: jnp.ndarray, *, causal: bool,
                               eps: float = 1e-6) -> jnp.ndarray:
    """Normalised linear attention on feature-mapped inputs, via the L x L score matrix.

    out_i = sum_{j in A(i)} (q_i . k_j) v_j / (sum_{j in A(i)} q_i . k_j + eps), where
    A(i) is every j (non-causal) or j <= i (causal). Computed in float32.
    """
    q, k, v = (x.astype(jnp.float32) for x in (q_BxHxLxK, k_BxHxLxK, v_BxHxLxV))
    scores_BxHxLxL = jnp.einsum("bhik,bhjk->bhij", q, k, precision=_HIGHEST)
    if causal:
        length = q.shape[2]
        scores_BxHxLxL = jnp.where(jnp.tril(jnp.ones((length, length), bool)),
                                   scores_BxHxLxL, 0.0)
    num_BxHxLxV = jnp.einsum("bhij,bhjv->bhiv", scores_BxHxLxL, v, precision=_HIGHEST)
    den_BxHxLx1 = scores_BxHxLxL.sum(-1, keepdims=True) + eps
    return num_BxHxLxV / den_BxHxLx1


def linear_attention_cumsum(q_BxHxLxK: jnp.ndarray, k_BxHxLxK: jnp.ndarray,
                            v_BxHxLxV: jnp.ndarray, *, causal: bool,
                            eps: float = 1e-6) -> jnp.ndarray:
    """The same function through prefix sums of the K x V states (the RNN view).

    Memory O(L K V); a second, independent reference for small shapes.
    """
    q, k, v = (x.astype(jnp.float32) for x in (q_BxHxLxK, k_BxHxLxK, v_BxHxLxV))
    kv_BxHxLxKxV = jnp.einsum("bhlk,bhlv->bhlkv", k, v, precision=_HIGHEST)
    if causal:
        state_BxHxLxKxV = jnp.cumsum(kv_BxHxLxKxV, axis=2)
        norm_BxHxLxK = jnp.cumsum(k, axis=2)
    else:
        state_BxHxLxKxV = jnp.broadcast_to(kv_BxHxLxKxV.sum(2, keepdims=True),
                                           kv_BxHxLxKxV.shape)
        norm_BxHxLxK = jnp.broadcast_to(k.sum(2, keepdims=True), k.shape)
    num_BxHxLxV = jnp.einsum("bhlk,bhlkv->bhlv", q, state_BxHxLxKxV, precision=_HIGHEST)
    den_BxHxL = jnp.einsum("bhlk,bhlk->bhl", q, norm_BxHxLxK, precision=_HIGHEST)
    den_BxHxLx1 = den_BxHxL[..., None] + eps
    return num_BxHxLxV / den_BxHxLx1


def masked_softmax_attention(q_BxHxQxK: jnp.ndarray, k_BxHxKvxK: jnp.ndarray,
                             v_BxHxKvxD: jnp.ndarray, allowed_BxHxQxKv: jnp.ndarray,
                             multiplier_BxHxQxKv: jnp.ndarray | None = None
                             ) -> jnp.ndarray:
    """softmax(q k^T / sqrt(K)) v over the allowed keys, in float32, via the full L x L
    score matrix; a query with no allowed key gets 0 (and zero gradients). The weights
    are multiplied by `multiplier_BxHxQxKv` (dropout: 0 or 1/(1-rate)) after the softmax."""
    q, k, v = (x.astype(jnp.float32) for x in (q_BxHxQxK, k_BxHxKvxK, v_BxHxKvxD))
    scores = jnp.einsum("bhqk,bhsk->bhqs", q, k, precision=_HIGHEST) / jnp.sqrt(q.shape[-1])
    scores = jnp.where(allowed_BxHxQxKv, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    weights = jnp.where(allowed_BxHxQxKv, jnp.exp(scores - row_max), 0.0)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    weights = weights / jnp.where(total > 0, total, 1.0)
    if multiplier_BxHxQxKv is not None:
        weights = weights * multiplier_BxHxQxKv
    return jnp.einsum("bhqs,bhsd->bhqd", weights, v, precision=_HIGHEST)
