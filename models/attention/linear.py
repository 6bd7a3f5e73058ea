"""Kernelised (linear-cost) attention: `linear`, `performer`, `rfa`, `fast_weight`.

All four replace softmax(q k^T) by a feature map phi applied to queries and keys,
so attention becomes phi(Q) (phi(K)^T V): O(L) time, and causal attention is an RNN
whose state is the d x dv matrix S = sum_j phi(k_j) v_j^T (plus a normaliser z).

- `linear` (Katharopoulos et al., 2020): phi(x) = elu(x) + 1.
- `performer` (Choromanski et al., 2021): FAVOR+ positive orthogonal random features
  (unbiased for softmax), or the generalised ReLU kernel; features redrawn in training.
- `rfa` (Peng et al., 2021): sin/cos random features of L2-normalised q, k with a learned
  per-head temperature, and an optional recency gate on the causal state.
- `fast_weight` (Schlag et al., 2021): the delta-rule update of the fast-weight memory.

The core math is in pure functions (`linear_attention`, `gated_linear_attention`,
`delta_rule_attention`: models/attention/linear_scan.py; the feature maps and random
projections in models/attention/features.py) so that kernels can be tested against them.
Causal forms are chunked: exact (masked) attention inside a chunk of C positions, and a
d x dv state carried across chunks by `jax.lax.scan`, so no per-position state is stored
(the delta rule is a scan over time, rematerialised per chunk for the same reason).

Decoding (models.decoding's "recurrent_state"; the driver is models/attention/recurrent.py):
each causal form runs as an RNN, one token per step at O(state) cost whatever the
position: `linear` carries S (rotated phi(k) under rotary) and z (plain phi(k));
`performer` S and z over its m features, plus under kernel='softmax' the running key max
that stabilises them (the causal form's decaying gate); `rfa` S and z over its sin/cos
features, decayed by g_t under gate; `fast_weight` its memory S. `prefill` gives the
parallel outputs of a prompt and its state in one call (closed-form sums over the masked
keys; the delta rule's own scan).

attention_impl="pallas" (linear, performer, rfa) runs `linear_attention` through the Pallas
kernels of `models.kernels.linear_attention` (interpreted on CPU, with their own chunk
size); the gated forms (causal FAVOR+, rfa with gate) have no kernel and refuse it, and
rfa's kernel form normalises by den + 1e-6 instead of pushing den away from zero.

Choices beyond the papers (reasons at the code):
- causal FAVOR+ stabilises keys with a running max instead of the paper code's global
  max (which lets future keys reach past outputs), carried as an exact decay;
- FAVOR+ drops each query's exp(-|q'|^2/2) (a factor that cancels), puts -|k'|^2/2 into
  the key stabiliser, and makes eps relative to the denominator (which is divided by
  itself first): with the paper code's stabilisers and eps = 1e-6, the output collapsed
  towards 0 at LRA's head size (d = 64) once the q, k weights grew;
- random features (performer, rfa) are one m x d projection per layer shared by the
  heads, as in the Performer code; rfa redraws on the same schedule as performer;
- rfa's gate exists only for causal=True; fast_weight with causal=False runs the same
  recurrence and lets every query read the final memory.

Rotary (pos_emb='rotary'), two forms:
- performer and rfa rotate q and k BEFORE their random features. Their kernels
  (FAVOR+'s exp(q.k), ReLU features' arc-cosine kernel, RFA's Gaussian on unit vectors)
  are functions of q.k and the norms, with features drawn isotropically, so the features
  estimate the kernel of the rotated products, a function of the offset only: Performer
  estimates rotary softmax attention, and the features stay positive.
- linear and fast_weight rotate the feature-mapped phi(q), phi(k) (RoFormer's linear
  form, Su et al. 2021 eq. 19): elu + 1 and DPFP do not commute with rotations, so
  rotating before them would not make products relative. linear rotates the
  numerator's features only and keeps the denominator sum_j phi(q_i).phi(k_j)
  unrotated (rotated features can make it vanish or turn negative); the delta rule has
  no denominator. Its Pallas form (one kernel for both) is refused under rotary.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers, registry
from models.attention import recurrent
from models.attention.dense import MultiHeadAttention
from models.attention.features import (FeatureProjection, dpfp_feature_map,
                                      favor_causal_key_features, favor_key_logits,
                                      favor_softmax_features, relu_features, sum_normalise,
                                      trig_features)
from models.attention.linear_scan import (DEFAULT_CHUNK, _away_from_zero, _causal_num_den,
                                          _num_den, _relative_eps_ratio, _unit_den_queries,
                                          delta_rule_attention, delta_write, elu_feature_map,
                                          gated_linear_attention, linear_attention)
from models.kernels.linear_attention import linear_attention as pallas_linear_attention

IMPLS = ("dense", "pallas", "pallas_mosaic")  # XLA (lax.scan) forms, or the Pallas kernels
KERNEL_IMPLS = ("pallas", "pallas_mosaic")  # pallas_mosaic: the Mosaic GPU kernels
FEATURE_KERNELS = ("softmax", "relu")
FAST_WEIGHT_MAPS = ("dpfp", "elu")
EPS = 1e-6  # the normalisers' eps (performer, rfa; linear's default)


# ----------------------------------------------------------------------------- modules


class _KernelAttention(MultiHeadAttention, recurrent.RecurrentDecoding):
    """query/key/value/out projections (named as in `transformer`) around a feature map."""

    # Under rotary: False rotates q, k before the feature map (in __call__); True leaves
    # them to `attend`, which rotates the features (RoFormer's linear form).
    rotary_on_features = False

    def __init__(self, *, dim: int, num_heads: int, causal: bool, qkv_dim: int | None,
                 use_bias: bool, chunk_size: int, rngs: nnx.Rngs,
                 attention_impl: str = "dense", rotary: bool = False):
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=0.0, use_bias=use_bias, rotary=rotary, rngs=rngs)
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if attention_impl not in IMPLS:
            raise registry.RegistryError(
                f"attention_impl={attention_impl!r} is not available for kernelised "
                f"attention; valid: {', '.join(IMPLS)}")
        self.chunk_size = chunk_size
        self.attention_impl = attention_impl

    def linear(self, phi_q_BxHxLxK: jax.Array, phi_k_BxHxLxK: jax.Array, v_BxHxLxD: jax.Array,
               eps: float = 1e-6) -> jax.Array:
        """`linear_attention` in this module's implementation (the kernel: its own chunk)."""
        if self.attention_impl in KERNEL_IMPLS:
            return pallas_linear_attention(
                phi_q_BxHxLxK, phi_k_BxHxLxK, v_BxHxLxD, causal=self.causal,
                backend="pallas", eps=eps,
                gpu_form="mosaic" if self.attention_impl == "pallas_mosaic" else "triton",
            ).astype(v_BxHxLxD.dtype)
        return linear_attention(phi_q_BxHxLxK, phi_k_BxHxLxK, v_BxHxLxD, causal=self.causal,
                                chunk_size=self.chunk_size, eps=eps)

    def attend(self, q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxK: jax.Array,
               x_BxLxD: jax.Array, padding_mask: jax.Array | None,
               deterministic: bool) -> jax.Array:
        """Per-head outputs BxHxLxK from the projected q, k, v."""
        raise NotImplementedError

    @staticmethod
    def drop_padded(phi_k_BxHxLxF: jax.Array, v_BxHxLxK: jax.Array,
                    padding_mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        """Zeroes padded keys and values: a zero key writes nothing to the state."""
        if padding_mask is None:
            return phi_k_BxHxLxF, v_BxHxLxK
        real_Bx1xLx1 = padding_mask.astype(jnp.bool_)[:, None, :, None]
        return jnp.where(real_Bx1xLx1, phi_k_BxHxLxF, 0.0), jnp.where(real_Bx1xLx1, v_BxHxLxK, 0.0)

    def qkv(self, x_BxLxD: jax.Array, positions: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """q, k, v (BxHxLxK) as `attend` takes them: q and k rotated by `positions` (default
        0..L-1) under rotary unless the variant rotates its features instead."""
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = (self.split_heads(proj(x_BxLxD)) for proj in
                                           (self.query, self.key, self.value))
        if not self.rotary_on_features:
            q_BxHxLxK = self.rotate(q_BxHxLxK, positions)
            k_BxHxLxK = self.rotate(k_BxHxLxK, positions)
        return q_BxHxLxK, k_BxHxLxK, v_BxHxLxK

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.qkv(x_BxLxD)
        o_BxHxLxK = self.attend(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask,
                                deterministic)
        return self.out(self.merge_heads(o_BxHxLxK.astype(x_BxLxD.dtype)))


class LinearAttention(_KernelAttention):
    """Katharopoulos et al.: phi = elu + 1; parallel, chunked-causal and recurrent forms.

    rotary: RoFormer's linear form, sum_j (R_i phi(q_i)).(R_j phi(k_j)) v_j over
    sum_j phi(q_i).phi(k_j) (see the module docstring).
    """

    rotary_on_features = True

    def __init__(self, *, eps: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.eps = eps

    def attend(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask, deterministic):
        phi_q = elu_feature_map(q_BxHxLxK)
        phi_k, v_BxHxLxK = self.drop_padded(elu_feature_map(k_BxHxLxK), v_BxHxLxK,
                                            padding_mask)
        if not self.rotary:
            return self.linear(phi_q, phi_k, v_BxHxLxK, eps=self.eps)
        common = dict(causal=self.causal, chunk_size=self.chunk_size)
        num_BxHxLxK, _ = _num_den(self.rotate(phi_q), self.rotate(phi_k), v_BxHxLxK,
                                  **common)
        # The denominator only: one value column is enough to get it.
        _, den_BxHxL = _num_den(phi_q, phi_k, v_BxHxLxK[..., :1], **common)
        return (num_BxHxLxK / (den_BxHxL[..., None] + self.eps)).astype(v_BxHxLxK.dtype)

    def empty_state(self, batch: int) -> dict[str, jax.Array]:
        """S (BxHxKxK, rotated phi(k) under rotary) and z (BxHxK, plain phi(k))."""
        return recurrent.zero_sums(batch, self.num_heads, self.head_dim, self.head_dim)

    def prompt(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask):
        o_BxHxLxK = self.attend(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask,
                                deterministic=True)
        phi_k, v_BxHxLxK = self.drop_padded(elu_feature_map(k_BxHxLxK), v_BxHxLxK,
                                            padding_mask)
        return o_BxHxLxK, recurrent.prompt_sums(self.rotate(phi_k), phi_k, v_BxHxLxK)

    def recur(self, state, q_BxHx1xK, k_BxHx1xK, v_BxHx1xK, x_BxD, pos_B):
        phi_q_BxHx1xK, phi_k_BxHx1xK = elu_feature_map(q_BxHx1xK), elu_feature_map(k_BxHx1xK)
        # S and the numerator take the features rotated by the token's position; z and the
        # denominator the plain ones (as in `attend`).
        at_Bx1x1 = pos_B[:, None, None]
        turned_q_BxHx1xK = self.rotate(phi_q_BxHx1xK, at_Bx1x1)
        turned_k_BxHx1xK = self.rotate(phi_k_BxHx1xK, at_Bx1x1)
        state = recurrent.add_token(state, turned_k_BxHx1xK[:, :, 0], phi_k_BxHx1xK[:, :, 0],
                                    v_BxHx1xK[:, :, 0])
        num_BxHxK, den_BxH = recurrent.read(state, turned_q_BxHx1xK[:, :, 0],
                                            phi_q_BxHx1xK[:, :, 0])
        return num_BxHxK / (den_BxH[..., None] + self.eps), state


@registry.register("linear", capabilities=registry.Capabilities(
    description="linear attention, phi = elu + 1 (Katharopoulos et al.); chunked causal form",
    causal=True, decode="recurrent_state",
    padding=True, variable_length=True, test_hparams={"chunk_size": 5},
    rotary=True))
def build_linear(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
                 rotary: bool = False, qkv_dim: int | None = None, use_bias: bool = True,
                 eps: float = 1e-6, chunk_size: int = DEFAULT_CHUNK,
                 attention_impl: str = "dense") -> LinearAttention:
    del max_len  # any length
    if rotary and attention_impl in KERNEL_IMPLS:
        raise registry.RegistryError(
            "linear: pos_emb='rotary' needs rotated features in the numerator and plain ones "
            "in the denominator, which the Pallas kernel computes from one set; use "
            "attention_impl='dense'")
    return LinearAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                           use_bias=use_bias, chunk_size=chunk_size, eps=eps, rngs=rngs,
                           attention_impl=attention_impl, rotary=rotary)


class Performer(_KernelAttention):
    """FAVOR+ (Choromanski et al.): random features from a redrawn orthogonal projection."""

    def __init__(self, *, num_features: int, kernel: str, redraw_interval: int,
                 rngs: nnx.Rngs, **kwargs):
        super().__init__(rngs=rngs, **kwargs)
        if kernel not in FEATURE_KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; valid: {', '.join(FEATURE_KERNELS)}")
        self.kernel = kernel
        self.projection = FeatureProjection(num_features, self.head_dim,
                                            redraw_interval=redraw_interval, rngs=rngs)

    def attend(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask, deterministic):
        w_MxK = self.projection(deterministic=deterministic)
        mask = None if padding_mask is None else padding_mask.astype(jnp.bool_)
        if self.kernel == "relu":
            phi_q, phi_k = relu_features(q_BxHxLxK, w_MxK), relu_features(k_BxHxLxK, w_MxK)
        elif self.causal:
            # The causal den of query i needs keys j <= i only: normalised after the scan
            # (`_relative_eps_ratio`), so neither eps nor a scale reaches back in time.
            phi_q = favor_softmax_features(q_BxHxLxK, w_MxK, is_query=True)
            phi_k, log_g = favor_causal_key_features(k_BxHxLxK, w_MxK, mask_BxL=mask)
            phi_k, v_BxHxLxK = self.drop_padded(phi_k, v_BxHxLxK, mask)
            num, den = _causal_num_den(phi_q, phi_k, v_BxHxLxK, log_g, self.chunk_size)
            return _relative_eps_ratio(num, den, EPS).astype(v_BxHxLxK.dtype)
        else:
            phi_q = favor_softmax_features(q_BxHxLxK, w_MxK, is_query=True)
            phi_k = favor_softmax_features(k_BxHxLxK, w_MxK, is_query=False, mask_BxL=mask)
            phi_k, v_BxHxLxK = self.drop_padded(phi_k, v_BxHxLxK, mask)
            # den = 1 before the (dense or Pallas) attention adds its eps: see
            # `_unit_den_queries`. Padded keys are zero already, so they do not count.
            return self.linear(_unit_den_queries(phi_q, phi_k), phi_k, v_BxHxLxK)
        phi_k, v_BxHxLxK = self.drop_padded(phi_k, v_BxHxLxK, mask)
        return self.linear(phi_q, phi_k, v_BxHxLxK)

    def empty_state(self, batch: int) -> dict[str, jax.Array]:
        """S (BxHxMxK) and z (BxHxM) over the m features; kernel='softmax' adds key_max
        (BxH, -inf before the first key), the running max P of the keys' logits
        (`favor_key_logits`): every key in S and z is stabilised by exp(-P)."""
        state = recurrent.zero_sums(batch, self.num_heads, self.projection.num_features,
                                    self.head_dim)
        if self.kernel == "softmax":
            state["key_max"] = jnp.full((batch, self.num_heads), -jnp.inf, jnp.float32)
        return state

    def prompt(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask):
        o_BxHxLxK = self.attend(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask,
                                deterministic=True)
        w_MxK = self.projection(deterministic=True)
        if self.kernel == "relu":
            phi_k, v_BxHxLxK = self.drop_padded(relu_features(k_BxHxLxK, w_MxK), v_BxHxLxK,
                                                padding_mask)
            return o_BxHxLxK, recurrent.prompt_sums(phi_k, phi_k, v_BxHxLxK)
        # The causal form scales key j by exp(-P_j) and decays it by exp(P_j - P) by the end
        # of the prompt, P the max over all its real keys: key j ends as exp(logits_j - P).
        log_phi_BxHxLxM = favor_key_logits(k_BxHxLxK, w_MxK)
        if padding_mask is not None:
            real_Bx1xLx1 = padding_mask.astype(jnp.bool_)[:, None, :, None]
            log_phi_BxHxLxM = jnp.where(real_Bx1xLx1, log_phi_BxHxLxM, -jnp.inf)
        key_max_BxH = jnp.max(log_phi_BxHxLxM, axis=(-2, -1))
        # A row without a real key: S = z = 0 whatever the scale, and key_max stays -inf.
        scale_BxH = jnp.where(jnp.isfinite(key_max_BxH), key_max_BxH, 0.0)
        phi_k = (jnp.exp(log_phi_BxHxLxM - scale_BxH[..., None, None])
                 / math.sqrt(w_MxK.shape[0]))
        phi_k, v_BxHxLxK = self.drop_padded(phi_k, v_BxHxLxK, padding_mask)
        state = recurrent.prompt_sums(phi_k, phi_k, v_BxHxLxK)
        return o_BxHxLxK, {**state, "key_max": key_max_BxH}

    def recur(self, state, q_BxHx1xK, k_BxHx1xK, v_BxHx1xK, x_BxD, pos_B):
        w_MxK = self.projection(deterministic=True)
        v_BxHxK = v_BxHx1xK[:, :, 0]
        if self.kernel == "relu":
            phi_q, phi_k = (relu_features(t, w_MxK)[:, :, 0] for t in (q_BxHx1xK, k_BxHx1xK))
            state = recurrent.add_token(state, phi_k, phi_k, v_BxHxK)
            num_BxHxK, den_BxH = recurrent.read(state, phi_q, phi_q)
            return num_BxHxK / (den_BxH[..., None] + EPS), state
        phi_q = favor_softmax_features(q_BxHx1xK, w_MxK, is_query=True)[:, :, 0]
        log_phi_BxHxM = favor_key_logits(k_BxHx1xK, w_MxK)[:, :, 0]
        key_max_BxH = jnp.maximum(state["key_max"], jnp.max(log_phi_BxHxM, axis=-1))
        # The parallel form's gate g_t = exp(P_{t-1} - P_t) <= 1 rescales the past to the
        # new max (exp(-inf) = 0 on an empty state, which holds nothing to rescale).
        decay_BxH = jnp.exp(state["key_max"] - key_max_BxH)
        phi_k = jnp.exp(log_phi_BxHxM - key_max_BxH[..., None]) / math.sqrt(w_MxK.shape[0])
        state = recurrent.add_token(state, phi_k, phi_k, v_BxHxK, decay_BxH)
        num_BxHxK, den_BxH = recurrent.read(state, phi_q, phi_q)
        return _relative_eps_ratio(num_BxHxK, den_BxH, EPS), {**state, "key_max": key_max_BxH}


@registry.register("performer", capabilities=registry.Capabilities(
    description="Performer FAVOR+: positive orthogonal random features, redrawn in training",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"num_features": 32, "chunk_size": 5}, rotary=True))
def build_performer(*, dim: int, num_heads: int, max_len: int, causal: bool,
                    rngs: nnx.Rngs, rotary: bool = False, qkv_dim: int | None = None,
                    use_bias: bool = True,
                    num_features: int = 256, kernel: str = "softmax",
                    redraw_interval: int = 1000, chunk_size: int = DEFAULT_CHUNK,
                    attention_impl: str = "dense") -> Performer:
    """kernel='softmax' is FAVOR+ (the paper); 'relu' is LRA's Performer default.

    redraw_interval: training calls between feature redraws (0 = never redraw).
    """
    del max_len  # any length
    if attention_impl in KERNEL_IMPLS and causal and kernel == "softmax":
        raise registry.RegistryError("performer: causal FAVOR+ carries a decaying state "
                                     "that the Pallas kernel lacks; use attention_impl="
                                     "'dense' or kernel='relu'")
    return Performer(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                     use_bias=use_bias, chunk_size=chunk_size, num_features=num_features,
                     kernel=kernel, redraw_interval=redraw_interval, rngs=rngs,
                     attention_impl=attention_impl, rotary=rotary)


class RandomFeatureAttention(_KernelAttention):
    """RFA (Peng et al.): sin/cos random features of unit q, k; optional recency gate."""

    def __init__(self, *, num_features: int, gate: bool, redraw_interval: int,
                 rngs: nnx.Rngs, **kwargs):
        super().__init__(rngs=rngs, **kwargs)
        if gate and not self.causal:
            # The gate decays the past relative to "now"; without an order of reading
            # there is no "now", so a non-causal gated form is not defined.
            raise ValueError("rfa: gate=True needs causal=True (the gate is a recency "
                             "decay of the causal state)")
        self.projection = FeatureProjection(num_features, self.head_dim,
                                            redraw_interval=redraw_interval, rngs=rngs)
        # tau = exp(log_temperature) per head; tau = 1 at init.
        self.log_temperature = layers.param(layers.zeros, ("heads",), (self.num_heads,),
                                            rngs=rngs)
        self.gate = (layers.dense(kwargs["dim"], self.num_heads, ("embed", "heads"),
                                  rngs=rngs) if gate else None)

    def attend(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask, deterministic):
        w_MxK = self.projection(deterministic=deterministic)
        inv_tau_H = jnp.exp(-self.log_temperature[...])
        phi_q = trig_features(q_BxHxLxK, w_MxK, inv_tau_H)
        phi_k, v = self.drop_padded(trig_features(k_BxHxLxK, w_MxK, inv_tau_H), v_BxHxLxK,
                                    padding_mask)
        if self.gate is None and self.attention_impl in KERNEL_IMPLS:
            return self.linear(phi_q, phi_k, v)
        if self.gate is None:
            num, den = _num_den(phi_q, phi_k, v, causal=self.causal,
                                chunk_size=self.chunk_size)
            return num / _away_from_zero(den, EPS)[..., None]
        log_g_BxHxL, write_BxHxL = self.gates(x_BxLxD, padding_mask)
        return gated_linear_attention(phi_q, phi_k * write_BxHxL[..., None], v, log_g_BxHxL,
                                      chunk_size=self.chunk_size)

    def gates(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None
              ) -> tuple[jax.Array, jax.Array]:
        """log g and the write factor 1 - g (BxHxL); a padded position keeps the state
        (log g = 0; its key is zeroed by the caller)."""
        gate_logit_BxHxL = self.gate(x_BxLxD).astype(jnp.float32).transpose(0, 2, 1)
        log_g_BxHxL = jax.nn.log_sigmoid(gate_logit_BxHxL)
        write_BxHxL = jax.nn.sigmoid(-gate_logit_BxHxL)  # 1 - g
        if padding_mask is not None:
            log_g_BxHxL = jnp.where(padding_mask[:, None, :], log_g_BxHxL, 0.0)
        return log_g_BxHxL, write_BxHxL

    def trig(self, x_BxHxLxK: jax.Array) -> jax.Array:
        """The deterministic features (decoding: no redraw)."""
        return trig_features(x_BxHxLxK, self.projection(deterministic=True),
                             jnp.exp(-self.log_temperature[...]))

    def empty_state(self, batch: int) -> dict[str, jax.Array]:
        """S (BxHxFxK) and z (BxHxF) over the F = 2m sin/cos features (decayed under gate)."""
        return recurrent.zero_sums(batch, self.num_heads, 2 * self.projection.num_features,
                                   self.head_dim)

    def prompt(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask):
        o_BxHxLxK = self.attend(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask,
                                deterministic=True)
        phi_k, v_BxHxLxK = self.drop_padded(self.trig(k_BxHxLxK), v_BxHxLxK, padding_mask)
        if self.gate is not None:
            log_g_BxHxL, write_BxHxL = self.gates(x_BxLxD, padding_mask)
            # Key j reaches the prompt's end through prod_{s>j} g_s: a suffix sum of log g
            # (the difference of two long prefix sums would lose digits in float32).
            through_BxHxL = jnp.flip(jnp.cumsum(jnp.flip(log_g_BxHxL, -1), axis=-1), -1)
            after_BxHxL = jnp.concatenate(
                [through_BxHxL[..., 1:], jnp.zeros_like(through_BxHxL[..., :1])], axis=-1)
            phi_k = phi_k * (write_BxHxL * jnp.exp(after_BxHxL))[..., None]
        return o_BxHxLxK, recurrent.prompt_sums(phi_k, phi_k, v_BxHxLxK)

    def recur(self, state, q_BxHx1xK, k_BxHx1xK, v_BxHx1xK, x_BxD, pos_B):
        phi_q, phi_k = (self.trig(t)[:, :, 0] for t in (q_BxHx1xK, k_BxHx1xK))
        decay_BxH = None
        if self.gate is not None:
            log_g_BxHx1, write_BxHx1 = self.gates(x_BxD[:, None], None)
            decay_BxH, phi_k = jnp.exp(log_g_BxHx1[..., 0]), phi_k * write_BxHx1
        state = recurrent.add_token(state, phi_k, phi_k, v_BxHx1xK[:, :, 0], decay_BxH)
        num_BxHxK, den_BxH = recurrent.read(state, phi_q, phi_q)
        if self.gate is None and self.attention_impl in KERNEL_IMPLS:
            return num_BxHxK / (den_BxH[..., None] + EPS), state  # the kernel's normaliser
        return num_BxHxK / _away_from_zero(den_BxH, EPS)[..., None], state


@registry.register("rfa", capabilities=registry.Capabilities(
    description="Random Feature Attention: sin/cos features, learned temperature, causal gate",
    causal=True, decode="recurrent_state", padding=True, variable_length=True,
    test_hparams={"num_features": 32, "chunk_size": 5}, rotary=True))
def build_rfa(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
              rotary: bool = False, qkv_dim: int | None = None, use_bias: bool = True,
              num_features: int = 128,
              gate: bool = False, redraw_interval: int = 1000,
              chunk_size: int = DEFAULT_CHUNK,
              attention_impl: str = "dense") -> RandomFeatureAttention:
    """gate=True (causal only): S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T."""
    del max_len  # any length
    if attention_impl in KERNEL_IMPLS and gate:
        raise registry.RegistryError("rfa: the gated state has no Pallas kernel; use "
                                     "attention_impl='dense'")
    return RandomFeatureAttention(dim=dim, num_heads=num_heads, causal=causal,
                                  qkv_dim=qkv_dim, use_bias=use_bias, chunk_size=chunk_size,
                                  num_features=num_features, gate=gate,
                                  redraw_interval=redraw_interval, rngs=rngs,
                                  attention_impl=attention_impl, rotary=rotary)


class FastWeightAttention(_KernelAttention):
    """Schlag et al.: a fast-weight memory written with the delta rule.

    rotary: phi(q_t), phi(k_t) rotated by t (RoFormer's linear form). Every product the
    memory forms (a query reading a key, a write retrieving an earlier key) is then one
    of rotated features, so it depends on the offset only.
    """

    rotary_on_features = True

    def __init__(self, *, feature_map: str, dpfp_nu: int, rngs: nnx.Rngs, **kwargs):
        super().__init__(rngs=rngs, **kwargs)
        if feature_map not in FAST_WEIGHT_MAPS:
            raise ValueError(f"unknown feature_map {feature_map!r}; "
                             f"valid: {', '.join(FAST_WEIGHT_MAPS)}")
        if dpfp_nu < 1:
            raise ValueError(f"dpfp_nu must be >= 1, got {dpfp_nu}")
        self.feature_map, self.dpfp_nu = feature_map, dpfp_nu
        # beta_t = sigmoid(W_beta x_t), one write strength per head.
        self.beta = layers.dense(kwargs["dim"], self.num_heads, ("embed", "heads"),
                                 use_bias=False, rngs=rngs)

    def phi(self, x_BxHxLxK: jax.Array) -> jax.Array:
        x = x_BxHxLxK.astype(jnp.float32)
        if self.feature_map == "dpfp":
            return sum_normalise(dpfp_feature_map(x, self.dpfp_nu))
        return sum_normalise(elu_feature_map(x))

    def memory(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask, *,
               return_state: bool):
        """`delta_rule_attention` on the (rotated) features; beta = 0 at padded positions."""
        beta_BxHxL = jax.nn.sigmoid(self.beta(x_BxLxD).astype(jnp.float32)).transpose(0, 2, 1)
        if padding_mask is not None:
            beta_BxHxL = jnp.where(padding_mask[:, None, :], beta_BxHxL, 0.0)
        return delta_rule_attention(self.rotate(self.phi(q_BxHxLxK)),
                                    self.rotate(self.phi(k_BxHxLxK)), v_BxHxLxK,
                                    beta_BxHxL, causal=self.causal,
                                    chunk_size=self.chunk_size, return_state=return_state)

    def attend(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask, deterministic):
        return self.memory(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask,
                           return_state=False)

    def empty_state(self, batch: int) -> dict[str, jax.Array]:
        """S (BxHxKxF): the fast-weight memory, values by features (F = 2 K dpfp_nu for
        dpfp, K for elu)."""
        k = self.head_dim
        features = 2 * k * self.dpfp_nu if self.feature_map == "dpfp" else k
        return {"s": jnp.zeros((batch, self.num_heads, k, features), jnp.float32)}

    def prompt(self, q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD, padding_mask):
        # The scan that gives the outputs ends on the memory after the real tokens (padded
        # positions write nothing).
        o_BxHxLxK, s_BxHxKxF = self.memory(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD,
                                           padding_mask, return_state=True)
        return o_BxHxLxK, {"s": s_BxHxKxF}

    def recur(self, state, q_BxHx1xK, k_BxHx1xK, v_BxHx1xK, x_BxD, pos_B):
        phi_q, phi_k = (self.rotate(self.phi(t), pos_B[:, None, None])[:, :, 0]
                        for t in (q_BxHx1xK, k_BxHx1xK))
        beta_BxH = jax.nn.sigmoid(self.beta(x_BxD).astype(jnp.float32))
        s_BxHxKxF = delta_write(state["s"], phi_k, v_BxHx1xK[:, :, 0].astype(jnp.float32),
                                beta_BxH)
        return jnp.einsum("bhkf,bhf->bhk", s_BxHxKxF, phi_q), {"s": s_BxHxKxF}


@registry.register("fast_weight", capabilities=registry.Capabilities(
    description="fast-weight programmer: delta-rule memory, DPFP features (Schlag et al.)",
    causal=True, decode="recurrent_state",
    padding=True, variable_length=True, test_hparams={"chunk_size": 5},
    receptive_field="limited",  # DPFP features are ReLU products: some pairs are 0
    rotary=True))
def build_fast_weight(*, dim: int, num_heads: int, max_len: int, causal: bool,
                      rngs: nnx.Rngs, rotary: bool = False, qkv_dim: int | None = None,
                      use_bias: bool = True, feature_map: str = "dpfp", dpfp_nu: int = 1,
                      chunk_size: int = DEFAULT_CHUNK) -> FastWeightAttention:
    """causal=False runs the same recurrence, then every query reads the final memory."""
    del max_len  # any length
    return FastWeightAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                               use_bias=use_bias, chunk_size=chunk_size,
                               feature_map=feature_map, dpfp_nu=dpfp_nu, rngs=rngs,
                               rotary=rotary)
