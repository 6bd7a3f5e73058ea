"""Self-pretraining models: the classifier's encoder with a per-position prediction head.

Amos, Berant and Gupta ("Never Train from Scratch", ICLR 2024) pretrain on the task's own
training inputs, then fine-tune. `TokenPredictor` is that pretraining model. Its `encoder`
is built by `Classifier` itself (same module names, shapes and checks: causal with CLS
pooling is refused the same way), so `config.init_from` can copy `encoder/...` into a
classifier unchanged. What pretraining adds is outside `encoder`: the learned [MASK]
vector and the prediction head, which a fine-tuned classifier leaves behind.

Objectives (lra/train.py computes the losses):
  mlm        masked-token prediction: the masked positions' token embeddings are replaced
             by the [MASK] vector; the head predicts the original tokens there.
  causal_lm  next-token prediction: the encoder is causal; the output at position t
             predicts token t+1.
  sequence_labels  the task's label of each position (MQAR, MAD; lra/training/objectives.py).
Heads (`lm_loss`):
  xent       logits over the vocabulary (cross-entropy)
  l1         one value per position, the pixel intensity scaled to [0, 1] (the paper's L1
             loss for pixel tasks)
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models import layers
from models.decoding import Cache, DecodingError
from models.encoder import Classifier

OBJECTIVES = ("classify", "mlm", "causal_lm", "sequence_labels")
PRETRAIN_OBJECTIVES = ("mlm", "causal_lm")
# Objectives with a per-position head: pretraining, and a task's own labels per position
# (sequence_labels: MQAR, MAD; causal or not as the config says).
TOKEN_OBJECTIVES = PRETRAIN_OBJECTIVES + ("sequence_labels",)
LM_LOSSES = ("xent", "l1")


class TokenPredictor(Classifier):
    """Encoder -> per-position head (vocabulary logits, or one pixel value for `l1`).

    Takes the Classifier's arguments (num_classes is not one) plus `objective` and
    `lm_loss`. Returns float32 predictions for the content positions (the CLS slot, if
    pooling='CLS' put one there, is dropped): BxLxV logits, or BxL values for `l1`."""

    def __init__(self, *, vocab_size: int, objective: str, lm_loss: str = "xent",
                 emb_dim: int = 512, causal: bool = False, tie_head: bool = False,
                 rngs: nnx.Rngs, **kwargs: Any):
        if objective not in TOKEN_OBJECTIVES:
            raise ValueError(f"objective {objective!r} is not a per-position objective; "
                             f"valid: {', '.join(TOKEN_OBJECTIVES)}")
        if lm_loss not in LM_LOSSES:
            raise ValueError(f"unknown lm_loss {lm_loss!r}; valid: {', '.join(LM_LOSSES)}")
        if objective == "causal_lm" and not causal:
            raise ValueError("objective='causal_lm' predicts the next token and needs "
                             "causal=True (else every position sees its target)")
        if objective == "mlm" and causal:
            raise ValueError("objective='mlm' is bidirectional masked-token prediction; with "
                             "causal=True use objective='causal_lm'")
        if tie_head and lm_loss != "xent":
            raise ValueError(f"tie_head=True reads the logits off the token embedding; "
                             f"lm_loss={lm_loss!r} predicts one value per position")
        super().__init__(vocab_size=vocab_size, num_classes=1, emb_dim=emb_dim, causal=causal,
                         rngs=rngs, **kwargs)
        del self.head  # the classifier head is not part of a pretraining model
        self.objective = objective
        self.lm_loss = lm_loss
        self.mask_vector = (layers.param(layers.normal(1.0), ("embed",), (emb_dim,), rngs=rngs)
                            if objective == "mlm" else None)
        # tie_head: the logits are the token embedding's transpose times the output, no
        # bias (Zoology's LanguageModel ties lm_head to word_embeddings; scaffold field).
        lecun = jax.nn.initializers.lecun_normal()
        self.lm_head = None if tie_head else layers.dense(
            emb_dim, vocab_size if lm_loss == "xent" else 1, ("embed", "vocab"),
            kernel_init=lecun, rngs=rngs)

    def __call__(self, inputs_BxL: jax.Array, mask_BxL: jax.Array | None = None,
                 masked_BxL: jax.Array | None = None, *,
                 deterministic: bool) -> jax.Array:
        if (masked_BxL is None) != (self.mask_vector is None):
            raise ValueError("objective='mlm' needs masked_BxL (the positions to hide); "
                             "causal_lm takes none")
        encoded_BxLxD, _ = self.encoder(
            inputs_BxL, mask_BxL, deterministic=deterministic, masked_BxL=masked_BxL,
            mask_vector_D=None if self.mask_vector is None else self.mask_vector[...])
        if self.encoder.cls_token:
            encoded_BxLxD = encoded_BxLxD[:, 1:]
        return self._head(encoded_BxLxD)

    def _head(self, encoded_BxLxD: jax.Array) -> jax.Array:
        if self.lm_head is None:
            out_BxLxV = self.encoder.embeddings.token.attend(encoded_BxLxD).astype(jnp.float32)
        else:
            out_BxLxV = self.lm_head(encoded_BxLxD).astype(jnp.float32)
        return out_BxLxV[..., 0] if self.lm_loss == "l1" else out_BxLxV

    # ---------------------------------------------------------------- decoding
    # (DESIGN.md 10; lra/generate.py samples with these.) The output at position t is the
    # prediction of token t + 1, as in training.

    def check_decodes(self) -> None:
        """Raises models.decoding.DecodingError, in one line, if this model cannot decode."""
        if self.objective != "causal_lm":
            raise DecodingError(f"objective {self.objective!r} does not predict the next "
                                "token; only a causal_lm model generates")
        self.encoder.check_decodes()

    def init_cache(self, batch: int) -> Cache:
        """The empty cache for `batch` rows of up to max_len tokens."""
        self.check_decodes()
        return self.encoder.init_cache(batch)

    def prefill(self, cache: Cache, tokens_BxL: jax.Array,
                mask_BxL: jax.Array | None = None) -> tuple[jax.Array, Cache]:
        """Predictions for a right-padded prompt (BxLxV, or BxL for l1), and the cache."""
        encoded_BxLxD, cache = self.encoder.prefill(cache, tokens_BxL, mask_BxL)
        return self._head(encoded_BxLxD), cache

    def step(self, cache: Cache, tokens_B: jax.Array) -> tuple[jax.Array, Cache]:
        """The prediction after one more token per row (BxV, or B for l1), and the cache."""
        encoded_BxD, cache = self.encoder.step(cache, tokens_B)
        return self._head(encoded_BxD[:, None])[:, 0], cache
