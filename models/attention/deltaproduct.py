"""Gated DeltaProduct (`gated_deltaproduct`; Siems et al. 2025, "DeltaProduct: Improving
State-Tracking in Linear RNNs via Householder Products"): n_h delta-rule steps per token,
each with its own key, value and beta, after one decay,

    S_t = alpha_t S_{t-1} prod_{j=1..n_h} (I - beta_{t,j} k_{t,j} k_{t,j}^T) + ...,
    o_t = S_t q_t / sqrt(d_k)                       (read after the last step)

so the state transition is a product of n_h generalised Householder reflections. With
allow_neg_eigval (fla's layer default) beta = 2 sigmoid(.), in (0, 2): a step can reflect,
its eigenvalue 1 - beta reaching -1, which is what state tracking (parity, permutations)
needs. As fla's `GatedDeltaProduct` (fla/layers/gated_deltaproduct.py at bc3b101) with its
layer defaults: num_householder 2, allow_neg_eigval, the Mamba-2 forget gate (A ~ U(0, 16),
dt log-uniform), expand_v 2, the output gate (RMSNorm times SiLU(W_g x)), 4-tap short
convolutions; the k and v projections (and their convolutions) are n_h times wider, beta
one per head and step. Our channel order within a projection is (head, step, feature)
where fla's is (step, head, feature): a permutation of the weights' rows, the same family
of layers (the comparison maps one onto the other).

The computation is fla's fused_recurrent path: the token sequence unrolled into L n_h
micro-steps, the decay on each token's first, the query on its last (zero elsewhere, the
outputs there dropped), through delta.py's gated delta rule (`chunk_delta_rule`, so the
chunked WY form and its tests carry over). num_householder=1 without negative eigenvalues
is `gated_deltanet`'s layer. Padding, the bidirectional form (a backward scan over the
reversed tokens, each token's steps in their order) and the recurrent decoding are
delta.py's `DeltaNet`'s; a decoding step runs the n_h steps of `delta_rule_step`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention import delta


class DeltaProductDirection(delta.ScanDirection):
    """A scan direction whose k and v convolutions are n_h times wider and whose beta has
    one value per head and step."""

    def __init__(self, *, dim: int, num_heads: int, key_dim: int, value_dim: int,
                 conv_size: int, gated: bool, num_householder: int, neg_eigval: bool,
                 rngs: nnx.Rngs):
        n = num_householder
        super().__init__(dim=dim, num_heads=num_heads, key_dim=key_dim, value_dim=value_dim,
                         conv_size=conv_size, gated=gated, rngs=rngs)
        self.num_householder, self.neg_eigval = n, neg_eigval
        self.widths = (key_dim // num_heads, n * key_dim // num_heads,
                       n * value_dim // num_heads)
        if conv_size:
            conv = delta.conv_init(conv_size)
            self.conv_k = layers.param(conv, (None, "qkv"), (conv_size, n * key_dim),
                                       rngs=rngs)
            self.conv_v = layers.param(conv, (None, "qkv"), (conv_size, n * value_dim),
                                       rngs=rngs)
        self.beta = layers.dense(dim, n * num_heads, ("embed", "heads"), use_bias=False,
                                 rngs=rngs)

    def gates(self, x_xD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """beta ...xHxN in (0, 1), or (0, 2) with negative eigenvalues; g ...xH <= 0."""
        beta_xHN, g_xH = super().gates(x_xD)  # doubled there with neg_eigval
        return beta_xHN.reshape(beta_xHN.shape[:-1] + (self.num_heads, -1)), g_xH

    def features(self, q_BxHxLxK, k_BxHxLxNK, v_BxHxLxNV, x_BxLxD, real_BxL):
        """conv and SiLU on the wide inputs, then each step's key L2-normalised: q
        BxHxLxK, k BxHxLxNxK, v BxHxLxNxV, beta BxHxLxN, g BxHxL (0 where padded)."""
        n = self.num_householder
        w_q, w_k, w_v = self.conv_weights()
        conv = lambda t, w: jax.nn.silu(delta.causal_conv(t.astype(jnp.float32), w))  # noqa: E731
        q = delta.l2_normalise(conv(q_BxHxLxK, w_q))
        k_wide, v_wide = conv(k_BxHxLxNK, w_k), conv(v_BxHxLxNV, w_v)
        k = delta.l2_normalise(k_wide.reshape(k_wide.shape[:-1] + (n, -1)))
        v = v_wide.reshape(v_wide.shape[:-1] + (n, -1))
        beta_BxLxHxN, g_BxLxH = self.gates(x_BxLxD)
        beta = jnp.where(real_BxL[..., None, None], beta_BxLxHxN, 0.0).transpose(0, 2, 1, 3)
        g = jnp.where(real_BxL[..., None], g_BxLxH, 0.0).transpose(0, 2, 1)
        return q, k, v, beta, g


def unroll(q_BxHxLxK, k_BxHxLxNxK, v_BxHxLxNxV, beta_BxHxLxN, g_BxHxL):
    """The L n_h micro-steps: keys, values, betas in order, the decay on each token's first
    step, the query on its last (zeros elsewhere)."""
    b, h, length, n, _ = k_BxHxLxNxK.shape
    flat = lambda t: t.reshape((b, h, length * n) + t.shape[4:])  # noqa: E731
    first_N = jnp.arange(n) == 0
    last_N = jnp.arange(n) == n - 1
    q = jnp.where(last_N[:, None], q_BxHxLxK[:, :, :, None], 0.0)
    g = jnp.where(first_N, g_BxHxL[..., None], 0.0)
    return flat(q), flat(k_BxHxLxNxK), flat(v_BxHxLxNxV), flat(beta_BxHxLxN), flat(g)


class GatedDeltaProduct(delta.DeltaNet):
    """fla's GatedDeltaProduct (module docstring) on delta.py's DeltaNet: wider k and v
    projections, its own scan directions, the unrolled scan and an n_h-step decoding."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, qkv_dim: int | None,
                 expand_v: float, chunk_size: int | None, conv_size: int, use_gate: bool,
                 norm_eps: float, num_householder: int, neg_eigval: bool, rngs: nnx.Rngs):
        if num_householder < 1:
            raise ValueError(f"num_householder must be at least 1, got {num_householder}")
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         expand_v=expand_v, chunk_size=chunk_size, conv_size=conv_size,
                         gated=True, use_gate=use_gate, norm_eps=norm_eps, rngs=rngs)
        n = self.num_householder = num_householder
        key_dim, value_dim = num_heads * self.head_dim, num_heads * self.head_v_dim
        proj = dict(use_bias=False, rngs=rngs)
        self.key = layers.dense(dim, n * key_dim, ("embed", "qkv"), **proj)
        self.value = layers.dense(dim, n * value_dim, ("embed", "qkv"), **proj)
        direction = dict(dim=dim, num_heads=num_heads, key_dim=key_dim, value_dim=value_dim,
                         conv_size=conv_size, gated=True, num_householder=n,
                         neg_eigval=neg_eigval, rngs=rngs)
        self.forward_scan = DeltaProductDirection(**direction)
        self.backward_scan = None if causal else DeltaProductDirection(**direction)

    def scan(self, direction, q, k, v, x_BxLxD, real_BxL):
        n = self.num_householder
        micro = unroll(*direction.features(q, k, v, x_BxLxD, real_BxL))
        o_BxHxLNxV, s = delta.chunk_delta_rule(*micro, chunk_size=self.chunk_size)
        return o_BxHxLNxV[:, :, n - 1::n], s

    def empty_state(self, batch: int):
        n, h, w = self.num_householder, self.num_heads, self.window
        zeros = lambda *shape: jnp.zeros((batch, h) + shape, jnp.float32)  # noqa: E731
        return {"s": zeros(self.head_v_dim, self.head_dim), "conv_q": zeros(w, self.head_dim),
                "conv_k": zeros(w, n * self.head_dim), "conv_v": zeros(w, n * self.head_v_dim)}

    def recur(self, state, q_BxHx1xK, k_BxHx1xNK, v_BxHx1xNV, x_BxD, pos_B):
        del pos_B  # the state is the same size at every position
        direction = self.forward_scan
        windows = [jnp.concatenate([state[name], t.astype(jnp.float32)], axis=2)
                   for name, t in (("conv_q", q_BxHx1xK), ("conv_k", k_BxHx1xNK),
                                   ("conv_v", v_BxHx1xNV))]
        q, k, v = (jax.nn.silu(jnp.einsum("bhwf,whf->bhf", win, w_WxHxF))
                   for win, w_WxHxF in zip(windows, direction.conv_weights()))
        n = self.num_householder
        q = delta.l2_normalise(q)
        k_BxHxNxK = delta.l2_normalise(k.reshape(k.shape[:-1] + (n, -1)))
        v_BxHxNxV = v.reshape(v.shape[:-1] + (n, -1))
        beta_BxHxN, g_BxH = direction.gates(x_BxD)
        s = state["s"]
        for j in range(n):  # the decay before the first step, the read after the last
            o_BxHxV, s = delta.delta_rule_step(
                s, q, k_BxHxNxK[:, :, j], v_BxHxNxV[:, :, j], beta_BxHxN[..., j],
                g_BxH if j == 0 else jnp.zeros_like(g_BxH), self.head_dim ** -0.5)
        o_BxHxV = self.finish(o_BxHxV[:, :, None], x_BxD[:, None])[:, :, 0]
        return o_BxHxV, {"s": s, "conv_q": windows[0][:, :, 1:],
                         "conv_k": windows[1][:, :, 1:], "conv_v": windows[2][:, :, 1:]}


@registry.register("gated_deltaproduct", capabilities=registry.Capabilities(
    description="Gated DeltaProduct: num_householder delta-rule (Householder) steps per token "
                "after a decay, negative eigenvalues allowed (Siems et al. 2025); "
                f"{delta._BIDIRECTIONAL}",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"chunk_size": 5}, rotary_refusal=delta._NO_ROTARY,
    pos_emb="none", short_conv_hparam="conv_size"))
def build_gated_deltaproduct(*, dim: int, num_heads: int, max_len: int, causal: bool,
                             rngs: nnx.Rngs, qkv_dim: int | None = None,
                             expand_v: float = 2.0, chunk_size: int | None = None,
                             conv_size: int = delta.CONV_SIZE, use_gate: bool = True,
                             norm_eps: float = delta.NORM_EPS, num_householder: int = 2,
                             allow_neg_eigval: bool = True) -> GatedDeltaProduct:
    """fla's GatedDeltaProduct layer defaults (num_householder 2, allow_neg_eigval, expand_v
    2, output gate); qkv_dim is the key width (fla's head_dim x num_heads); chunk_size as
    gated_deltanet's (delta.DEFAULT_CHUNK, or delta.CPU_CHUNK where the CPU builds it)."""
    del max_len  # any length
    return GatedDeltaProduct(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                             expand_v=expand_v, chunk_size=chunk_size, conv_size=conv_size,
                             use_gate=use_gate, norm_eps=norm_eps,
                             num_householder=num_householder, neg_eigval=allow_neg_eigval,
                             rngs=rngs)
