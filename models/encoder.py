"""Embeddings + a stack of blocks + classifier head (LRA's TransformerEncoder).

The pieces are separate so that a dual encoder (retrieval) can reuse `Encoder`,
`pool` and `ClassifierHead` on its two towers.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry, stacks
from models.layers import layer_norm, sinusoidal_positions
from models.stacks import resolve_block

POOLINGS = ("CLS", "MEAN", "MAX", "SUM")
# "rotary": no absolute positions here; the mixers rotate queries and keys by position
# (RoFormer), for variants with models.registry.Capabilities.rotary.
POS_EMBS = ("learned", "sinusoidal", "rotary", "none")


class Embeddings(nnx.Module):
    """Token embedding, optional prepended CLS vector, position embedding, dropout.

    The CLS vector goes in before positions are added (as in LRA), so it takes
    position 0 and the learned table has max_len + 1 rows. pos_emb='rotary' adds no
    positions: the mixers rotate queries and keys instead. pos_emb='none' adds none
    either: for mixers with relative positions of their own (Transformer-XL's R_(i-j)
    terms; `Capabilities.pos_emb`).
    """

    def __init__(self, *, vocab_size: int, emb_dim: int, max_len: int,
                 pos_emb: str = "learned", cls_token: bool = False,
                 dropout_rate: float = 0.1, rngs: nnx.Rngs):
        if pos_emb not in POS_EMBS:
            raise ValueError(f"unknown pos_emb {pos_emb!r}; valid: {', '.join(POS_EMBS)}")
        self.pos_emb = pos_emb
        self.token = layers.embed(vocab_size, emb_dim, ("vocab", "embed"),
                                  init=layers.normal(1.0), rngs=rngs)
        # LRA's CLS slot starts at zero and is told apart by its position embedding. With
        # no absolute positions (pos_emb none or rotary) a zero slot gives a zero query,
        # and a linear-attention CLS summary (retnet, gla, mamba2, ...) then reads nothing
        # at initialisation: it starts N(0, 0.02), as the learned position table does.
        cls_init = layers.zeros if pos_emb in ("learned", "sinusoidal") else layers.normal(0.02)
        self.cls = (layers.param(cls_init, (None, None, "embed"), (1, 1, emb_dim),
                                 rngs=rngs) if cls_token else None)
        table_len = max_len + int(cls_token)
        self.position = (layers.param(layers.normal(0.02), ("length", "embed"),
                                      (table_len, emb_dim), rngs=rngs)
                         if pos_emb == "learned" else None)
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)

    def __call__(self, inputs_BxL: jax.Array, *, deterministic: bool,
                 masked_BxL: jax.Array | None = None,
                 mask_vector_D: jax.Array | None = None) -> jax.Array:
        x_BxLxD = self.token(inputs_BxL)
        if masked_BxL is not None:
            # Masked-token pretraining: the token's embedding is replaced by one learned
            # [MASK] vector (positions are still added), as BERT's [MASK] id would be. A
            # vector, not an extra vocabulary id, so that the token table has the same
            # shape in pretraining and fine-tuning (models/pretrain.py).
            x_BxLxD = jnp.where(masked_BxL[..., None], mask_vector_D.astype(x_BxLxD.dtype),
                                x_BxLxD)
        if self.cls is not None:
            cls_Bx1xD = jnp.broadcast_to(self.cls[...], (x_BxLxD.shape[0], 1, x_BxLxD.shape[2]))
            x_BxLxD = jnp.concatenate([cls_Bx1xD, x_BxLxD], axis=1)
        seq_len, dim = x_BxLxD.shape[1:]
        if self.pos_emb in ("rotary", "none"):  # positions, if any, are the mixers'
            return self.dropout(x_BxLxD, deterministic=deterministic)
        if self.position is not None:
            pos_LxD = self.position[:seq_len]
        else:
            pos_LxD = sinusoidal_positions(seq_len, dim)
        # The table in the activations' dtype (bfloat16 under mixed precision; a float32
        # sinusoid would promote the whole encoder back to float32).
        return self.dropout(x_BxLxD + pos_LxD[None].astype(x_BxLxD.dtype),
                            deterministic=deterministic)

    def at(self, tokens_B: jax.Array, pos_B: jax.Array) -> jax.Array:
        """One token per row at its own position (decoding; no CLS, no dropout): BxD."""
        x_BxD = self.token(tokens_B)
        if self.pos_emb in ("rotary", "none"):
            return x_BxD
        if self.position is not None:
            return x_BxD + self.position[...][pos_B].astype(x_BxD.dtype)
        return x_BxD + layers.sinusoidal_at(pos_B, x_BxD.shape[-1]).astype(x_BxD.dtype)


class Encoder(nnx.Module):
    """Embeddings -> a stack of num_layers blocks -> LayerNorm.

    `block` overrides the block settings (`models.blocks.BLOCK_DEFAULTS`) the variant
    implies, e.g. {"kind": "reversible"}. Returns (encoded_BxLxD, mask_BxL); with cls_token both include the CLS
    position first, and the mask is True there.

    `layers` (a hybrid stack, issue 45): one dict per layer, `{"model": name,
    "model_hparams": {...}, "block": {per-layer overrides}}`, `model` being the stack's
    base mixer (its `block` resolved as above; each layer's by
    `models.stacks.resolve_layer_block`). None: `model` in every layer (the single-mixer
    model, built as before).
    """

    def __init__(self, *, vocab_size: int, max_len: int, model: str = "transformer",
                 model_hparams: Mapping[str, Any] | None = None, emb_dim: int = 512,
                 num_heads: int = 8, num_layers: int = 4, mlp_dim: int = 1024,
                 dropout_rate: float = 0.1, pos_emb: str = "learned",
                 cls_token: bool = False, causal: bool = False,
                 block: Mapping[str, Any] | None = None,
                 layers: Sequence[Mapping[str, Any]] | None = None, rngs: nnx.Rngs):
        self.max_len = max_len
        self.cls_token = cls_token
        self.causal = causal
        self.embeddings = Embeddings(vocab_size=vocab_size, emb_dim=emb_dim, max_len=max_len,
                                     pos_emb=pos_emb, cls_token=cls_token,
                                     dropout_rate=dropout_rate, rngs=rngs)
        # Mixers see the CLS position too, so fixed-length ones need max_len + 1; it is
        # a prefix before the content, so that geometry stated for the content (windows,
        # 2-D rasters) is not shifted by it.
        seq_len = max_len + int(cls_token)
        self.block = resolve_block(model, block)
        segment_len = int(self.block["segment_len"])
        if (cls_token and self.block["stack"] == "segment_recurrent"
                and 0 < segment_len < seq_len):
            # CLS is position 0, in the first segment, and memory flows forward only: the
            # pooled summary would see the first segment_len - 1 tokens and nothing else.
            raise ValueError(
                f"pooling='CLS' with the segment_recurrent stack ({model!r}): the CLS token "
                f"sits in the first segment and would see only its first {segment_len - 1} "
                f"tokens; use pooling='MEAN' (the task configs do for this model)")
        resolved = None
        if layers is not None:
            resolved = [{"model": spec["model"],
                         "model_hparams": dict(spec.get("model_hparams") or {}),
                         **{k: spec[k] for k in ("rotary", "num_heads") if spec.get(k)},
                         "block": stacks.resolve_layer_block(self.block, model, spec["model"],
                                                             spec.get("block"))}
                        for spec in layers]
        self.stack = stacks.STACKS[self.block["stack"]](
            num_layers=num_layers, dim=emb_dim, num_heads=num_heads, mlp_dim=mlp_dim,
            max_len=seq_len, model=model, model_hparams=model_hparams, causal=causal,
            dropout_rate=dropout_rate, prefix_len=int(cls_token),
            rotary=pos_emb == "rotary", block=self.block, rngs=rngs,
            **({} if resolved is None else {"layers": resolved}))
        self.norm = layer_norm(emb_dim, rngs=rngs)  # `layers` is the argument here

    def __call__(self, inputs_BxL: jax.Array, mask_BxL: jax.Array | None = None, *,
                 deterministic: bool, masked_BxL: jax.Array | None = None,
                 mask_vector_D: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """`masked_BxL` (content positions, True = hidden) replaces those tokens by
        `mask_vector_D` before the stack: masked-token pretraining."""
        if inputs_BxL.ndim != 2:
            raise ValueError(f"inputs must be [batch, length], got shape {inputs_BxL.shape}")
        batch, length = inputs_BxL.shape
        if length > self.max_len:
            raise ValueError(f"input length {length} exceeds max_len {self.max_len}; "
                             "build the model with a larger max_len or truncate the inputs")
        if mask_BxL is None:
            mask_BxL = jnp.ones((batch, length), jnp.bool_)
        mask_BxL = mask_BxL.astype(jnp.bool_)
        if self.cls_token:
            mask_BxL = jnp.concatenate([jnp.ones((batch, 1), jnp.bool_), mask_BxL], axis=1)
        x_BxLxD = self.embeddings(inputs_BxL, deterministic=deterministic,
                                  masked_BxL=masked_BxL, mask_vector_D=mask_vector_D)
        x_BxLxD = self.stack(x_BxLxD, mask_BxL, deterministic=deterministic)
        return self.norm(x_BxLxD), mask_BxL

    # ---------------------------------------------------------------- decoding
    # DESIGN.md 10: the same embeddings, stack and norm, one token at a time. The cache is
    # {"pos": int32[B] (tokens each row holds), "stack": the stack's cache}.

    def check_decodes(self) -> None:
        """Raises DecodingError, in one line, if this encoder cannot decode."""
        if not self.causal:
            raise decoding.DecodingError(
                "the model was built with causal=False: its positions see later tokens, so "
                "it cannot generate one token at a time (train with causal=True)")
        if self.cls_token:
            raise decoding.DecodingError("a decoding encoder has no CLS slot (pooling CLS)")
        if not hasattr(self.stack, "step"):
            raise decoding.DecodingError(
                f"the {self.block['stack']!r} stack has no decoding form")

    def init_cache(self, batch: int) -> decoding.Cache:
        self.check_decodes()
        return {"pos": jnp.zeros((batch,), jnp.int32),
                "stack": self.stack.init_cache(batch, self.max_len)}

    def prefill(self, cache: decoding.Cache, inputs_BxL: jax.Array,
                mask_BxL: jax.Array | None = None) -> tuple[jax.Array, decoding.Cache]:
        """Encodes a right-padded prompt (row b: its first mask[b].sum() tokens) in one
        parallel call: (encoded_BxLxD, the cache after each row's prompt)."""
        batch, length = inputs_BxL.shape
        if length > self.max_len:
            raise decoding.DecodingError(f"a prompt of {length} tokens is longer than the "
                                         f"model's max_len {self.max_len}")
        x_BxLxD = self.embeddings(inputs_BxL, deterministic=True)
        x_BxLxD, stack_cache = self.stack.prefill(cache["stack"], x_BxLxD, mask_BxL)
        pos_B = decoding.lengths_of(mask_BxL, batch, length)
        return self.norm(x_BxLxD), {"pos": pos_B, "stack": stack_cache}

    def step(self, cache: decoding.Cache, tokens_B: jax.Array
             ) -> tuple[jax.Array, decoding.Cache]:
        """Encodes one more token per row, at position cache["pos"][b]: (encoded_BxD,
        cache). Positions past max_len are the caller's to avoid (lra.generate checks)."""
        x_BxD = self.embeddings.at(tokens_B, cache["pos"])
        x_BxD, stack_cache = self.stack.step(cache["stack"], x_BxD)
        return self.norm(x_BxD), {"pos": cache["pos"] + 1, "stack": stack_cache}


def pool(encoded_BxLxD: jax.Array, mask_BxL: jax.Array, pooling: str) -> jax.Array:
    """BxD summary of a sequence; 'CLS' takes position 0 (the prepended token)."""
    if pooling == "CLS":
        return encoded_BxLxD[:, 0]
    # LRA averages over padding too; we pool real tokens only, so that logits do
    # not depend on how much padding a batch happens to carry (padding invariance).
    mask_BxLx1 = mask_BxL[..., None]
    if pooling == "SUM":
        return jnp.sum(jnp.where(mask_BxLx1, encoded_BxLxD, 0.0), axis=1)
    if pooling == "MEAN":
        count_Bx1 = jnp.maximum(jnp.sum(mask_BxLx1, axis=1), 1)
        return jnp.sum(jnp.where(mask_BxLx1, encoded_BxLxD, 0.0), axis=1) / count_Bx1
    if pooling == "MAX":
        low = jnp.finfo(encoded_BxLxD.dtype).min
        max_BxD = jnp.max(jnp.where(mask_BxLx1, encoded_BxLxD, low), axis=1)
        return jnp.where(jnp.any(mask_BxL, axis=1, keepdims=True), max_BxD, 0.0)
    raise ValueError(f"unknown pooling {pooling!r}; valid: {', '.join(POOLINGS)}")


class ClassifierHead(nnx.Module):
    """LRA's classifier_head: Dense(in -> mlp_dim) -> ReLU -> Dense(mlp_dim -> classes)."""

    def __init__(self, *, in_dim: int, mlp_dim: int, num_classes: int, rngs: nnx.Rngs):
        lecun = jax.nn.initializers.lecun_normal()  # flax Dense default, as in LRA
        self.hidden = layers.dense(in_dim, mlp_dim, ("embed", "mlp"), kernel_init=lecun,
                                   rngs=rngs)
        self.logits = layers.dense(mlp_dim, num_classes, ("mlp", "classes"), kernel_init=lecun,
                                   rngs=rngs)

    def __call__(self, x_BxD: jax.Array) -> jax.Array:
        return self.logits(jax.nn.relu(self.hidden(x_BxD))).astype(jnp.float32)


def mixer_hparams(model: str, model_hparams: Mapping[str, Any] | None,
                  **shared: Any) -> dict[str, Any]:
    """model_hparams plus the shared settings (qkv_dim, ...) that `model` accepts.

    A shared setting that model_hparams also sets to another value is an error:
    silently preferring one would hide a config mistake.
    """
    merged = dict(model_hparams or {})
    accepted = registry.accepted_hparams(model)
    for key, value in shared.items():
        if key not in accepted:
            continue  # e.g. attention-free mixers have no qkv_dim
        if key in merged and merged[key] != value:
            raise ValueError(
                f"model_hparams sets {key}={merged[key]!r} but the model argument gives "
                f"{value!r}; set it in one place")
        merged[key] = value
    return merged


def layer_hparams(layers: Sequence[Mapping[str, Any]], *, attention_impl: str,
                  **shared: Any) -> list[dict[str, Any]]:
    """A hybrid's layer list with the shared settings (qkv_dim, ...) merged into each
    layer's hparams as `mixer_hparams` does. `attention_impl` goes to every layer whose
    mixer has the choice, unless the layer's own hparams name one (a kernel per layer);
    one other than dense that no layer takes is a ValueError."""
    out = []
    for i, spec in enumerate(layers):
        own = dict(spec.get("model_hparams") or {})
        accepted = registry.accepted_hparams(spec["model"])
        impl = {} if "attention_impl" in own or "attention_impl" not in accepted else {
            "attention_impl": attention_impl}
        out.append({**spec, "model_hparams": mixer_hparams(spec["model"], own, **shared,
                                                           **impl)})
    if attention_impl != "dense" and not any(
            "attention_impl" in registry.accepted_hparams(s["model"]) for s in layers):
        names = ", ".join(sorted({s["model"] for s in layers}))
        raise ValueError(f"no layer's mixer ({names}) has a choice of implementation; "
                         f"attention_impl={attention_impl!r} applies to attention-pattern "
                         "variants only")
    return out


class Classifier(nnx.Module):
    """Sequence classifier: Encoder -> pool -> ClassifierHead. Returns float32 logits.

    `layers`: a hybrid stack's layer list (see Encoder); each layer gets the shared
    settings its mixer takes (`layer_hparams`)."""

    def __init__(self, *, vocab_size: int, num_classes: int, max_len: int,
                 model: str = "transformer", model_hparams: Mapping[str, Any] | None = None,
                 emb_dim: int = 512, num_heads: int = 8, num_layers: int = 4,
                 qkv_dim: int = 512, mlp_dim: int = 1024, dropout_rate: float = 0.1,
                 attention_dropout_rate: float = 0.1, attention_impl: str = "dense",
                 pooling: str = "CLS", pos_emb: str = "learned", causal: bool = False,
                 block: Mapping[str, Any] | None = None,
                 layers: Sequence[Mapping[str, Any]] | None = None, rngs: nnx.Rngs):
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; valid: {', '.join(POOLINGS)}")
        if causal and pooling == "CLS":
            raise ValueError("pooling='CLS' with causal=True: the CLS token comes first and "
                             "would see only itself; use MEAN, MAX or SUM pooling")
        self.pooling = pooling
        if layers is not None:
            layers = layer_hparams(layers, qkv_dim=qkv_dim,
                                   attention_dropout=attention_dropout_rate,
                                   attention_impl=attention_impl)
        elif (attention_impl != "dense"
                and "attention_impl" not in registry.accepted_hparams(model)):
            raise ValueError(f"model {model!r} has one implementation; attention_impl="
                             f"{attention_impl!r} applies to attention-pattern variants only")
        # With a layer list the stack builds every layer from its own entry.
        hparams = (dict(model_hparams or {}) if layers is not None else
                   mixer_hparams(model, model_hparams, qkv_dim=qkv_dim,
                                 attention_dropout=attention_dropout_rate,
                                 attention_impl=attention_impl))
        self.encoder = Encoder(vocab_size=vocab_size, max_len=max_len, model=model,
                               model_hparams=hparams, emb_dim=emb_dim, num_heads=num_heads,
                               num_layers=num_layers, mlp_dim=mlp_dim,
                               dropout_rate=dropout_rate, pos_emb=pos_emb,
                               cls_token=pooling == "CLS", causal=causal, block=block,
                               layers=layers, rngs=rngs)
        self.head = ClassifierHead(in_dim=emb_dim, mlp_dim=mlp_dim, num_classes=num_classes,
                                   rngs=rngs)

    def __call__(self, inputs_BxL: jax.Array, mask_BxL: jax.Array | None = None, *,
                 deterministic: bool) -> jax.Array:
        encoded_BxLxD, mask_BxL = self.encoder(inputs_BxL, mask_BxL,
                                               deterministic=deterministic)
        return self.head(pool(encoded_BxLxD, mask_BxL, self.pooling))


class DualClassifier(Classifier):
    """LRA's dual encoder (retrieval): one shared Encoder for both documents, pooled, and
    a ClassifierHead on [x1, x2, x1 * x2, x1 - x2]."""

    def __init__(self, *, num_classes: int, emb_dim: int = 512, mlp_dim: int = 1024,
                 rngs: nnx.Rngs, **kwargs: Any):
        super().__init__(num_classes=num_classes, emb_dim=emb_dim, mlp_dim=mlp_dim,
                         rngs=rngs, **kwargs)
        # Replaces the single-input head: this one sees the four pooled features.
        self.head = ClassifierHead(in_dim=4 * emb_dim, mlp_dim=mlp_dim,
                                   num_classes=num_classes, rngs=rngs)

    def __call__(self, inputs_BxL: jax.Array, mask_BxL: jax.Array | None = None,
                 inputs2_BxL: jax.Array | None = None, mask2_BxL: jax.Array | None = None, *,
                 deterministic: bool) -> jax.Array:
        if inputs2_BxL is None:
            raise ValueError("DualClassifier needs two inputs (inputs2_BxL is missing)")
        pooled = []
        for inputs, mask in ((inputs_BxL, mask_BxL), (inputs2_BxL, mask2_BxL)):
            encoded_BxLxD, mask = self.encoder(inputs, mask, deterministic=deterministic)
            pooled.append(pool(encoded_BxLxD, mask, self.pooling))
        x1_BxD, x2_BxD = pooled
        return self.head(jnp.concatenate([x1_BxD, x2_BxD, x1_BxD * x2_BxD, x1_BxD - x2_BxD],
                                         axis=-1))
