"""cosFormer (`cosformer`; Qin et al., ICLR 2022, "cosFormer: Rethinking Softmax in
Attention"): linear attention with ReLU features and a cos-based re-weighting of every
query-key pair by its distance,

    s_ij = relu(q_i) . relu(k_j) cos(pi/2 (i - j) / M)
    o_i  = sum_j s_ij v_j / max(sum_j s_ij, eps)

computed in linear time through cos(a - b) = cos a cos b + sin a sin b: each ReLU feature
vector is doubled into [relu(x) sin(pi/2 i/M), relu(x) cos(pi/2 i/M)] (2K features per
head), and the pairs' products are then exactly s_ij.

As the authors' code: OpenNLPLab/cosFormer, `cosformer.py` at
8e12da111e2a683ea875711e0bf5810c6b4e8f9f (`CosformerAttention.forward`, act_fun="relu"):
q, k, v and output projections with biases, ReLU on the projected q and k, positions
counted from 1 (i = 1..L), the sin half of the features first, eps 1e-6 as a lower clamp
of the denominator (`clamp_min`), no scaling; its causal form is the same sums over
j <= i. Compared with it in results/cpu/cosformer_vs_original.md
(scripts/cosformer_comparison/).

One difference, on purpose: the original takes M = the length of the call's input; here M
is fixed when the mixer is built (`reweight_len`, default the builder's max_len), so that
a padded batch, a shorter input and token-by-token decoding all weigh a pair (i, j) the
same. With L = max_len the two agree. M must be at least max_len: then |i - j| < M and
every weight cos(pi/2 (i - j)/M) is positive, as the paper requires.

Forms as `linear`'s (models/attention/linear.py, on linear_scan's sums): the chunked
causal sums, the bidirectional sums, and the recurrent decoding of S (2K x K) and z (2K):
a token's features carry its own position's sin and cos, so the state needs nothing else.
A query whose ReLU features share no support with the keys' sees nothing (output 0): its
receptive field is declared `limited`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import registry
from models.attention import recurrent
from models.attention.linear import _KernelAttention
from models.attention.linear_scan import DEFAULT_CHUNK, _num_den

EPS = 1e-6  # the original's clamp_min of the denominator


def cos_features(x_BxHxLxK: jax.Array, positions: jax.Array, reweight_len: int) -> jax.Array:
    """[relu(x) sin(pi/2 p/M), relu(x) cos(pi/2 p/M)] over the last axis, p = position + 1
    (the original counts from 1), float32; `positions` broadcasts against BxHxL."""
    phi = jax.nn.relu(x_BxHxLxK.astype(jnp.float32))
    angle = (math.pi / 2) * (jnp.asarray(positions, jnp.float32) + 1.0) / reweight_len
    return jnp.concatenate([phi * jnp.sin(angle)[..., None], phi * jnp.cos(angle)[..., None]],
                           axis=-1)


class CosformerAttention(_KernelAttention):
    """cosFormer (module docstring): ReLU features re-weighted by cos(pi/2 (i - j)/M)."""

    def __init__(self, *, reweight_len: int, eps: float, **kwargs):
        super().__init__(**kwargs)
        self.reweight_len, self.eps = reweight_len, eps

    def features(self, x_BxHxLxK: jax.Array) -> jax.Array:
        return cos_features(x_BxHxLxK, jnp.arange(x_BxHxLxK.shape[2]), self.reweight_len)

    def attend(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask, deterministic):
        phi_k, v = self.drop_padded(self.features(k_BxHxLxK), v_BxHxLxK, padding_mask)
        num_BxHxLxK, den_BxHxL = _num_den(self.features(q_BxHxLxK), phi_k, v,
                                          causal=self.causal, chunk_size=self.chunk_size)
        return (num_BxHxLxK / jnp.maximum(den_BxHxL, self.eps)[..., None]).astype(v.dtype)

    def empty_state(self, batch: int) -> recurrent.State:
        return recurrent.zero_sums(batch, self.num_heads, 2 * self.head_dim, self.head_dim)

    def prompt(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask):
        o_BxHxLxK = self.attend(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask, True)
        phi_k, v = self.drop_padded(self.features(k_BxHxLxK), v_BxHxLxK, padding_mask)
        return o_BxHxLxK, recurrent.prompt_sums(phi_k, phi_k, v)

    def recur(self, state, q_BxHx1xK, k_BxHx1xK, v_BxHx1xK, x_BxD, pos_B):
        at_Bx1x1 = pos_B[:, None, None]
        phi_q = cos_features(q_BxHx1xK, at_Bx1x1, self.reweight_len)[:, :, 0]
        phi_k = cos_features(k_BxHx1xK, at_Bx1x1, self.reweight_len)[:, :, 0]
        state = recurrent.add_token(state, phi_k, phi_k, v_BxHx1xK[:, :, 0])
        num_BxHxK, den_BxH = recurrent.read(state, phi_q, phi_q)
        return num_BxHxK / jnp.maximum(den_BxH, self.eps)[..., None], state


@registry.register("cosformer", capabilities=registry.Capabilities(
    description="cosFormer: ReLU linear attention re-weighted by cos(pi/2 (i-j)/M) "
                "(Qin et al. 2022); chunked causal form",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5},
    receptive_field="limited",  # ReLU features: a pair with disjoint supports weighs 0
    rotary_refusal="its cos re-weighting is its position signal, and the original adds "
                   "no rotation"))
def build_cosformer(*, dim: int, num_heads: int, max_len: int, causal: bool,
                    rngs: nnx.Rngs, qkv_dim: int | None = None, use_bias: bool = True,
                    reweight_len: int = 0, eps: float = EPS,
                    chunk_size: int = DEFAULT_CHUNK) -> CosformerAttention:
    """reweight_len: M of cos(pi/2 (i - j)/M), at least max_len; 0 (default) is max_len."""
    reweight_len = reweight_len or max_len
    if reweight_len < max_len:
        raise registry.RegistryError(
            f"cosformer: reweight_len={reweight_len} is below max_len={max_len}; pairs "
            "further apart than M would get a negative weight (give 0 for max_len)")
    return CosformerAttention(reweight_len=reweight_len, eps=eps, dim=dim,
                              num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                              use_bias=use_bias, chunk_size=chunk_size, rngs=rngs)
