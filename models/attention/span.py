"""Adaptive attention span (Sukhbaatar et al. 2019): `adaptive_span`.

Each head h learns a span z_h in [0, S] (S = `max_span`); the attention weight of
a key at distance x from the query is multiplied by the soft mask

    m_z(x) = clamp((R + z - x) / R, 0, 1)    (R = `ramp`)

and the weights are renormalised, a_ij = m(x_ij) exp(s_ij) / sum_k m(x_ik) exp(s_ik).
The L1 penalty `l1_weight * mean_h(z_h)` is sown as `aux_loss`, so training shrinks
spans a head does not need.

The paper is a causal language model, where x = i - j >= 0 is the distance to a
past key. The LRA classifier is bidirectional, so here x = |i - j| (the same span
on both sides); with causal=True the future is masked as well and x = i - j.

z_h = S * p_h with p_h the parameter `span_fraction`. As in the paper's code
(facebookresearch/adaptive-span, `clamp_param`), p_h is clamped to [0, 1] after each
optimiser step and is not weight-decayed: the Param carries the metadata
`bounds=(0.0, 1.0)` and `no_weight_decay=True`, which `lra.training.optim.make_optimizer` obeys
for any parameter. The forward pass also uses clip(p_h, 0, 1) with a straight-through
gradient, so a value set from outside the range acts clamped, and a span at 0 or S
still gets the gradient that can move it back (the optimiser's clamp keeps it from
drifting past).

Deviation, with the reason:
- The mask is applied to the full L x L weights: the paper also crops keys beyond
  the current span to save compute; at LRA lengths this is a dense computation.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention.dense import MultiHeadAttention, make_attention_mask


def span_mask(distance_QxKv: jax.Array, span_H: jax.Array, ramp: float) -> jax.Array:
    """m_z(x) = clamp((R + z - x) / R, 0, 1), per head: HxQxKv."""
    return jnp.clip((ramp + span_H[:, None, None] - distance_QxKv[None]) / ramp, 0.0, 1.0)


class AdaptiveSpanAttention(MultiHeadAttention):
    """Softmax attention whose weights are shaped by a learned per-head soft span."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, max_span: int,
                 ramp: float, span_init: float, l1_weight: float, qkv_dim: int | None,
                 attention_dropout: float, use_bias: bool, rotary: bool, rngs: nnx.Rngs):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=use_bias,
                         rotary=rotary, rngs=rngs)
        if max_span <= 0 or ramp <= 0:
            raise ValueError(f"adaptive_span: max_span ({max_span}) and ramp ({ramp}) must "
                             "be positive")
        if not 0.0 <= span_init <= 1.0:
            raise ValueError(f"adaptive_span: span_init is a fraction of max_span in [0, 1], "
                             f"got {span_init}")
        self.max_span = float(max_span)
        self.ramp = float(ramp)
        self.l1_weight = l1_weight
        # The span as a fraction of max_span, one per head. Param metadata that the
        # optimiser obeys (lra.training.optim.make_optimizer): clamped to [0, 1] after each step
        # (the paper's `clamp_param`) and never weight-decayed.
        self.span_fraction = layers.param(jax.nn.initializers.constant(span_init), ("heads",),
                                          (num_heads,), rngs=rngs, bounds=(0.0, 1.0),
                                          no_weight_decay=True)

    def spans(self) -> jax.Array:
        """z_h = S * clip(p_h, 0, 1), straight-through so spans at 0 or S keep a gradient
        (the optimiser clamps p_h itself after each step)."""
        p_H = self.span_fraction[...]
        clipped_H = p_H + jax.lax.stop_gradient(jnp.clip(p_H, 0.0, 1.0) - p_H)
        return self.max_span * clipped_H

    # Decoding (models.decoding, form kv_cache): the cache holds only the keys any span can
    # reach, ramp + max_span (the paper's point: memory and time O(span), not O(L)), and
    # weighs them by the soft mask.
    def decode_reach(self, max_len: int) -> int:
        return min(math.ceil(self.ramp + self.max_span), max_len - 1)

    def key_weights(self, distance_BxHxQxS: jax.Array) -> jax.Array:
        """m_z(x) per head for distances x = i - j (BxHxQxS)."""
        span_1xHx1x1 = jax.lax.stop_gradient(self.spans())[None, :, None, None]
        return jnp.clip((self.ramp + span_1xHx1x1 - distance_BxHxQxS) / self.ramp, 0.0, 1.0)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.project_qkv(x_BxLxD)
        seq_len = x_BxLxD.shape[1]
        span_H = self.spans()
        self.sow(nnx.Intermediate, "aux_loss", self.l1_weight * jnp.mean(span_H))

        pos_L = jnp.arange(seq_len)
        distance_LxL = jnp.abs(pos_L[:, None] - pos_L[None, :]).astype(jnp.float32)
        soft_1xHxLxL = span_mask(distance_LxL, span_H, self.ramp)[None]

        logits_BxHxLxL = jnp.einsum("bhqk,bhsk->bhqs", q_BxHxLxK, k_BxHxLxK,
                                    preferred_element_type=jnp.float32)
        logits_BxHxLxL = logits_BxHxLxL / math.sqrt(self.head_dim)
        mask = make_attention_mask(padding_mask, causal=self.causal, q_len=seq_len,
                                   kv_len=seq_len)
        if mask is not None:
            logits_BxHxLxL = jnp.where(mask, logits_BxHxLxL, jnp.finfo(jnp.float32).min)
            soft_1xHxLxL = jnp.where(mask, soft_1xHxLxL, 0.0)
        # softmax, then the span mask, then renormalise: m exp(s) / sum m exp(s).
        weights_BxHxLxL = jax.nn.softmax(logits_BxHxLxL, axis=-1) * soft_1xHxLxL
        total_BxHxLx1 = jnp.sum(weights_BxHxLxL, axis=-1, keepdims=True)
        # A padded query may see no key inside its span: it gets 0, not NaN.
        safe_BxHxLx1 = jnp.where(total_BxHxLx1 > 0, total_BxHxLx1, 1.0)
        weights_BxHxLxL = weights_BxHxLxL / safe_BxHxLx1
        dropout_fn = self.dropout_fn(deterministic)
        if dropout_fn is not None:
            weights_BxHxLxL = dropout_fn(weights_BxHxLxL)
        o_BxHxLxK = jnp.einsum("bhqs,bhsd->bhqd", weights_BxHxLxL.astype(v_BxHxLxK.dtype),
                               v_BxHxLxK)
        return self.out(self.merge_heads(o_BxHxLxK))


@registry.register("adaptive_span", capabilities=registry.Capabilities(
    description="softmax attention with a learned soft span per head (L1 aux loss)",
    causal=True, decode="kv_cache", padding=True, variable_length=True,
    receptive_field="limited",
    dense_equivalent={"span_init": 1.0}, test_hparams={"ramp": 4.0}, rotary=True))
def build_adaptive_span(*, dim: int, num_heads: int, max_len: int, causal: bool,
                        rngs: nnx.Rngs, rotary: bool = False, max_span: int | None = None,
                        ramp: float = 32.0,
                        span_init: float = 0.0, l1_weight: float = 2e-6,
                        qkv_dim: int | None = None, attention_dropout: float = 0.1,
                        use_bias: bool = True) -> AdaptiveSpanAttention:
    """max_span None = max_len, so span_init 1.0 covers every distance (dense limit)."""
    return AdaptiveSpanAttention(dim=dim, num_heads=num_heads, causal=causal,
                                 max_span=max_len if max_span is None else max_span,
                                 ramp=ramp, span_init=span_init, l1_weight=l1_weight,
                                 qkv_dim=qkv_dim, attention_dropout=attention_dropout,
                                 use_bias=use_bias, rotary=rotary, rngs=rngs)
