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
