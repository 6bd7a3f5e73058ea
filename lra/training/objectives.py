"""What a run optimises: the jitted step functions of each objective (`config.objective`).

  classify   cross-entropy of the pooled logits against the task's labels (LRA).
  mlm        self-pretraining: config.mask_ratio of the real tokens are hidden (their
             embeddings replaced by a learned [MASK] vector, models/pretrain.py) and
             predicted; fresh masks every training step, one fixed mask per evaluation
             split.
  causal_lm  next-token prediction with a causal encoder: the output at t predicts token
             t + 1, so the first token is no target. With config.start_token (the pixel
             tasks' `generation` argument) the model reads the tokens shifted right by one
             behind a start token, id vocab_size (one more embedding row): the output at t
             predicts token t, every real token is a target, and the xent softmax is over
             the task's vocab_size values only (the head's logit of the start id is
             dropped). Bits per token are then bits per dim over the whole sequence.
  sequence_labels
             a label per position from the task (targets_NxL: MQAR, MAD; -100 where
             ignored, DESIGN.md 14): cross-entropy over the vocabulary at the labelled
             positions only, averaged over them. Accuracy is per labelled position;
             evaluation also reports per-example accuracy (every labelled position of
             the example right). Labels are aligned with the inputs (the task shifted
             them already: MQAR's value sits on its query key's position).
Pretraining losses are per token (cross-entropy over the vocabulary, or L1 on pixel
intensities scaled to [0, 1] with config.lm_loss='l1'), averaged over the predicted tokens;
retrieval's two documents are both predicted. `lra.train.train_and_evaluate` runs every
objective through the same loop (resume, preemption, divergence, multi-process), and
`evaluate` turns an eval step's sums over a split into its metrics.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from lra.training import input_pipeline
from models import precision
from models.encoder import Classifier
from models.pretrain import TokenPredictor


def aux_loss(model: nnx.Module) -> jax.Array:
    """Sum of every `aux_loss` a mixer sowed (adaptive span L1, commitment, ponder cost)."""
    sown = nnx.pop(model, nnx.Intermediate)
    total = jnp.float32(0.0)
    for path, value in jax.tree_util.tree_leaves_with_path(sown):
        if any(getattr(k, "key", None) == "aux_loss" for k in path):
            total += jnp.sum(value)
    return total


def _cross_entropy(logits_BxC, targets_B, num_classes):
    logp_BxC = jax.nn.log_softmax(logits_BxC.astype(jnp.float32))
    return -jnp.sum(jax.nn.one_hot(targets_B, num_classes) * logp_BxC, axis=-1)


def _apply(model: Classifier, batch: dict, deterministic: bool) -> jax.Array:
    """Logits of a batch; dual-input tasks (retrieval) also pass `inputs2`/`mask2`."""
    if "inputs2" in batch:
        return model(batch["inputs"], batch["mask"], batch["inputs2"], batch["mask2"],
                     deterministic=deterministic)
    return model(batch["inputs"], batch["mask"], deterministic=deterministic)


# Added to config.random_seed for the stream that chooses the masked tokens of training
# batches (one key per step, so a resumed run masks as an uninterrupted one).
MASK_SEED_OFFSET = 7919


def shift_right(tokens_BxL, mask_BxL, start_id: int):
    """(inputs, mask) of a start-token model: the start token, then tokens[:, :-1]."""
    start_Bx1 = jnp.full_like(tokens_BxL[:, :1], start_id)
    return (jnp.concatenate([start_Bx1, tokens_BxL[:, :-1]], axis=1),
            jnp.concatenate([jnp.ones_like(mask_BxL[:, :1]), mask_BxL[:, :-1]], axis=1))


def _token_losses(model: TokenPredictor, tokens_BxL, mask_BxL, masked_BxL, *,
                  objective: str, lm_loss: str, vocab_size: int, deterministic: bool,
                  start_token: bool = False):
    """Per-position (loss, correct, weight) of a pretraining objective on one document.
    Weight 1 where a prediction counts: masked real tokens (mlm), real next tokens
    (causal_lm: the output at t predicts token t+1; with start_token, every real token:
    the output at t, after the start token and tokens < t, predicts token t)."""
    if start_token:
        inputs, mask = shift_right(tokens_BxL, mask_BxL, vocab_size)
        out = model(inputs, mask, deterministic=deterministic)
        targets, weight = tokens_BxL, mask_BxL
        if lm_loss == "xent":
            out = out[..., :vocab_size]  # a softmax over the task's values, not the start id
    elif objective == "mlm":
        out = model(tokens_BxL, mask_BxL, masked_BxL, deterministic=deterministic)
        targets, weight = tokens_BxL, masked_BxL & mask_BxL
    else:
        out = model(tokens_BxL, mask_BxL, deterministic=deterministic)
        out, targets, weight = out[:, :-1], tokens_BxL[:, 1:], mask_BxL[:, 1:]
    if lm_loss == "l1":
        # The pixel intensity scaled to [0, 1]; "correct" = rounds to the right intensity.
        scale = vocab_size - 1
        out = out.astype(jnp.float32)  # losses in float32 whatever the compute dtype
        loss = jnp.abs(out - targets.astype(jnp.float32) / scale)
        correct = jnp.round(jnp.clip(out, 0.0, 1.0) * scale).astype(targets.dtype) == targets
    else:
        logp = jax.nn.log_softmax(out.astype(jnp.float32))
        loss = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), -1)[..., 0]
        correct = jnp.argmax(out, -1) == targets
    return loss, correct, weight.astype(jnp.float32)


def _documents(batch: dict, masked: tuple | None = None):
    """(tokens, padding mask, masked positions) of each document of a batch: one, or two
    for retrieval, whose documents are both pretrained on."""
    docs = [("inputs", "mask", "masked")]
    if "inputs2" in batch:
        docs.append(("inputs2", "mask2", "masked2"))
    return [(batch[i], batch[m].astype(jnp.bool_),
             (masked[n] if masked is not None else batch.get(k)))
            for n, (i, m, k) in enumerate(docs)]


def make_steps(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
               schedule: optax.Schedule, num_classes: int,
               config: ml_collections.ConfigDict | None = None, vocab_size: int = 0,
               label_slots: int | None = None):
    """The pure train and eval step functions (jitted by the caller). The objective
    (config.objective) chooses the loss: classification cross-entropy, or per-token loss
    averaged over the positions that are predicted (pretraining, sequence_labels;
    `label_slots`: see _label_losses)."""
    objective = config.objective if config is not None else "classify"
    # The compute dtype (config.dtype, models/precision.py): the forward pass runs on a
    # view of the model with its parameters cast; gradients reach the parameters in
    # their own dtype through the cast.
    dtype = precision.dtype_of(config.get("dtype", "float32") if config is not None
                               else "float32")
    if objective == "classify":
        return _classify_steps(graphdef, tx, schedule, num_classes, dtype)
    if objective == "sequence_labels":
        return _sequence_label_steps(graphdef, tx, schedule, dtype, label_slots)
    lm = dict(objective=objective, lm_loss=config.lm_loss, vocab_size=vocab_size,
              start_token=bool(config.get("start_token", False)))
    mask_key = jax.random.key(config.random_seed + MASK_SEED_OFFSET)
    mask_ratio = config.mask_ratio

    def train_step(state, batch):
        model = nnx.merge(graphdef, state["params"], state["rest"])
        docs = _documents(batch)
        masked = None
        if objective == "mlm":
            # Fresh masks every step (dynamic masking), from the step number.
            keys = jax.random.split(jax.random.fold_in(mask_key, state["step"]), len(docs))
            masked = tuple(jax.random.bernoulli(k, mask_ratio, m.shape) & m
                           for k, (_, m, _) in zip(keys, docs))
            docs = _documents(batch, masked)

        def loss_fn(model):
            view = precision.compute_view(model, dtype)
            parts = [_token_losses(view, t, m, k, deterministic=False, **lm)
                     for t, m, k in docs]
            loss = sum(jnp.sum(l * w) for l, _, w in parts)
            correct = sum(jnp.sum(c * w) for _, c, w in parts)
            count = jnp.maximum(sum(jnp.sum(w) for _, _, w in parts), 1.0)
            aux = aux_loss(view)
            precision.sync_rngs(model, view)
            return loss / count + aux, (loss / count, aux, correct / count)

        grad_fn = nnx.grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param), has_aux=True)
        grads, (loss, aux, accuracy) = grad_fn(model)
        new_rest = nnx.state(model, nnx.Not(nnx.Param))
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "aux_loss": aux, "accuracy": accuracy,
                   "grad_norm": optax.global_norm(grads),
                   "learning_rate": schedule(state["step"])}
        new_state = {"step": state["step"] + 1, "params": params, "rest": new_rest,
                     "opt_state": opt_state}
        return new_state, metrics

    def eval_step(weights, batch):
        model = precision.compute_view(
            nnx.merge(graphdef, weights["params"], weights["rest"]), dtype)
        row_B = batch["weights"]
        sums = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
        for t, m, k in _documents(batch):
            loss, correct, w = _token_losses(model, t, m, k, deterministic=True, **lm)
            w = w * row_B[:, None]
            sums = {"loss_sum": sums["loss_sum"] + jnp.sum(w * loss),
                    "correct": sums["correct"] + jnp.sum(w * correct),
                    "count": sums["count"] + jnp.sum(w)}
        return sums

    return train_step, eval_step


def _classify_steps(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, num_classes: int, dtype=jnp.float32):
    """Classification: cross-entropy of the pooled logits against the labels."""

    def train_step(state, batch):
        model = nnx.merge(graphdef, state["params"], state["rest"])

        def loss_fn(model):
            view = precision.compute_view(model, dtype)
            logits = _apply(view, batch, deterministic=False)
            aux = aux_loss(view)
            precision.sync_rngs(model, view)
            ce = jnp.mean(_cross_entropy(logits, batch["targets"], num_classes))
            return ce + aux, (ce, aux, logits)

        # nnx.grad (not jax.grad): it carries the model's non-Param updates (dropout RNG
        # counters) out of the differentiated function.
        grad_fn = nnx.grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param), has_aux=True)
        grads, (ce, aux, logits) = grad_fn(model)
        new_rest = nnx.state(model, nnx.Not(nnx.Param))
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {
            "loss": ce,
            "aux_loss": aux,
            "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["targets"]),
            "grad_norm": optax.global_norm(grads),
            "learning_rate": schedule(state["step"]),  # the rate this step used
        }
        new_state = {"step": state["step"] + 1, "params": params, "rest": new_rest,
                     "opt_state": opt_state}
        return new_state, metrics

    def eval_step(weights, batch):
        model = precision.compute_view(
            nnx.merge(graphdef, weights["params"], weights["rest"]), dtype)
        logits = _apply(model, batch, deterministic=True)
        w = batch["weights"]
        return {
            "loss_sum": jnp.sum(w * _cross_entropy(logits, batch["targets"], num_classes)),
            "correct": jnp.sum(w * (jnp.argmax(logits, -1) == batch["targets"])),
            "count": jnp.sum(w),
        }

    return train_step, eval_step



# The label of a position that is not predicted (Zoology's and torch's ignore_index).
IGNORE_LABEL = -100


def _label_losses(model: TokenPredictor, batch: dict, deterministic: bool,
                  label_slots: int | None = None, with_predictions: bool = False):
    """Per-position (loss, correct, weight) of a sequence_labels batch: weight 1 on real
    positions whose label is not IGNORE_LABEL; loss and correct are 0 elsewhere.

    With `label_slots` = K (at least the most labelled positions of any row), the head
    runs on each row's labelled positions only, gathered into K slots (BxK instead of
    BxL): MQAR labels 4 of 64 positions, and its head is 8,192 wide. Same numbers."""
    labels = batch["targets"]
    weight = (labels != IGNORE_LABEL) & batch["mask"].astype(jnp.bool_)
    if label_slots is None:
        logits = model(batch["inputs"], batch["mask"], deterministic=deterministic)
    else:
        encoded_BxLxD, _ = model.encoder(batch["inputs"], batch["mask"],
                                         deterministic=deterministic)
        if model.encoder.cls_token:
            encoded_BxLxD = encoded_BxLxD[:, 1:]
        # The labelled positions first, in order (a stable sort of "not labelled").
        slots_BxK = jnp.argsort(~weight, axis=1, stable=True)[:, :label_slots]
        encoded_BxKxD = jnp.take_along_axis(encoded_BxLxD, slots_BxK[..., None], axis=1)
        logits = model._head(encoded_BxKxD)
        labels = jnp.take_along_axis(labels, slots_BxK, axis=1)
        weight = jnp.take_along_axis(weight, slots_BxK, axis=1)
    safe = jnp.where(weight, labels, 0).astype(jnp.int32)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    loss = -jnp.take_along_axis(logp, safe[..., None], -1)[..., 0]
    predicted = jnp.argmax(logits, -1)
    correct = (predicted == safe) & weight
    if with_predictions:
        return jnp.where(weight, loss, 0.0), correct, weight, predicted, safe
    return jnp.where(weight, loss, 0.0), correct, weight


def class_sums(predicted, labels, weight, num_classes: int, rows_B=None) -> dict:
    """Per-class counts behind macro accuracy (MAD's metric, torchmetrics'
    MulticlassAccuracy with its default average='macro'): class_tp (right predictions
    of the class), class_target (labels of the class), class_predicted (predictions of
    it), over the labelled positions."""
    w = weight.astype(jnp.float32)
    if rows_B is not None:
        w = w * rows_B[:, None]
    seg = lambda v, ids: jax.ops.segment_sum(v.ravel(), ids.ravel(),  # noqa: E731
                                             num_segments=num_classes)
    return {"class_tp": seg(w * (predicted == labels), labels),
            "class_target": seg(w, labels),
            "class_predicted": seg(w, jnp.clip(predicted, 0, num_classes - 1))}


def macro_accuracy(class_tp, class_target, class_predicted) -> float:
    """torchmetrics' macro accuracy: the mean over classes of tp / (tp + fn) (0 for a
    class with no labels), over the classes with tp + fp + fn > 0 (a class only ever
    predicted, wrongly, counts as 0)."""
    tp, target, predicted = (np.asarray(v, np.float64) for v in
                             (class_tp, class_target, class_predicted))
    seen = (target + predicted - tp) > 0
    recall = np.where(target > 0, tp / np.maximum(target, 1.0), 0.0)
    return float(recall[seen].mean()) if seen.any() else 0.0


def label_sums(correct_BxL, weight_BxL, rows_B=None) -> dict:
    """Counts behind the two accuracies of sequence_labels: per position (correct /
    count) and per example (example_correct / example_count: the examples with at least
    one labelled position, right at all of them). `rows_B` weighs the examples (0 on an
    evaluation batch's padding rows)."""
    w = weight_BxL.astype(jnp.float32)
    rows = jnp.ones(w.shape[:1], jnp.float32) if rows_B is None else rows_B
    has_label = (jnp.sum(w, -1) > 0).astype(jnp.float32) * rows
    all_right = jnp.all(correct_BxL | (w == 0), -1).astype(jnp.float32)
    return {"correct": jnp.sum(correct_BxL * w * rows[:, None]),
            "count": jnp.sum(w * rows[:, None]),
            "example_correct": jnp.sum(all_right * has_label),
            "example_count": jnp.sum(has_label)}


def _sequence_label_steps(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                          schedule: optax.Schedule, dtype=jnp.float32,
                          label_slots: int | None = None):
    """sequence_labels: cross-entropy at the labelled positions (module docstring).
    Evaluation also sums the per-class counts of macro accuracy (class_sums)."""

    def train_step(state, batch):
        model = nnx.merge(graphdef, state["params"], state["rest"])

        def loss_fn(model):
            view = precision.compute_view(model, dtype)
            loss, correct, weight = _label_losses(view, batch, deterministic=False,
                                                  label_slots=label_slots)
            aux = aux_loss(view)
            precision.sync_rngs(model, view)
            count = jnp.maximum(jnp.sum(weight), 1.0)
            ce = jnp.sum(loss) / count
            return ce + aux, (ce, aux, label_sums(correct, weight))

        grad_fn = nnx.grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param), has_aux=True)
        grads, (ce, aux, sums) = grad_fn(model)
        new_rest = nnx.state(model, nnx.Not(nnx.Param))
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": ce, "aux_loss": aux,
                   "accuracy": sums["correct"] / jnp.maximum(sums["count"], 1.0),
                   "example_accuracy": (sums["example_correct"]
                                        / jnp.maximum(sums["example_count"], 1.0)),
                   "grad_norm": optax.global_norm(grads),
                   "learning_rate": schedule(state["step"])}
        new_state = {"step": state["step"] + 1, "params": params, "rest": new_rest,
                     "opt_state": opt_state}
        return new_state, metrics

    def eval_step(weights, batch):
        model = precision.compute_view(
            nnx.merge(graphdef, weights["params"], weights["rest"]), dtype)
        loss, correct, weight, predicted, labels = _label_losses(
            model, batch, deterministic=True, label_slots=label_slots, with_predictions=True)
        rows = batch["weights"]
        num_classes = (model.lm_head.out_features if model.lm_head is not None  # tied:
                       else model.encoder.embeddings.token.num_embeddings)  # the table's
        return {"loss_sum": jnp.sum(loss * rows[:, None]),
                **label_sums(correct, weight, rows),
                **class_sums(predicted, labels, weight, num_classes, rows)}

    return train_step, eval_step


# Added to config.random_seed for the masks of the validation and test splits (drawn once:
# every evaluation of a run scores the same masked tokens).
EVAL_MASK_SEED_OFFSET = 104729


def add_eval_masks(data: dict, config) -> None:
    """`masked` (and `masked2`) of the validation and test splits: config.mask_ratio of
    the real tokens, fixed for the run."""
    rng = np.random.default_rng(config.random_seed + EVAL_MASK_SEED_OFFSET)
    for split in [s for s in ("val", "test") if s in data]:
        for tokens, mask, key in (("inputs", "mask", "masked"), ("inputs2", "mask2", "masked2")):
            if tokens in data[split]:
                real = data[split][mask].astype(bool)
                data[split][key] = (rng.random(real.shape) < config.mask_ratio) & real


def label_slots(data: dict, config) -> int | None:
    """sequence_labels: the most labelled positions of any row of any split, when under
    half the length (the head then runs on those only: see make_steps); else None."""
    if config.objective != "sequence_labels":
        return None
    most = max(int(((d["targets"] != -100) & d["mask"].astype(bool)).sum(1).max())
               for d in data.values())
    return max(most, 1) if 2 * most <= config.max_length else None


def evaluate(eval_step, weights, rows: dict, config: ml_collections.ConfigDict,
             batch_sharding, num_batches: int = -1) -> dict[str, float]:
    """An eval step's sums over `rows` (a split), as metrics: accuracy and loss, bits per
    token (causal_lm, xent), per-example and macro accuracy (sequence_labels; by
    config.macro_accuracy's rule, with the pooled one beside a batch_mean)."""
    eval_bs = config.eval_batch_size or config.batch_size
    sums = None
    batch_macros = []  # (macro, examples) per batch: config.macro_accuracy batch_mean
    per_batch = config.get("macro_accuracy", "pooled") == "batch_mean"
    mine = input_pipeline.process_rows(batch_sharding, eval_bs)
    for batch in input_pipeline.eval_batches(rows, global_batch_size=eval_bs,
                                             num_batches=num_batches, rows=mine):
        out = eval_step(weights, input_pipeline.to_global(batch, batch_sharding))
        sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
        if per_batch and "class_tp" in out:
            b = jax.device_get(out)
            batch_macros.append((macro_accuracy(b["class_tp"], b["class_target"],
                                                b["class_predicted"]),
                                 float(b["example_count"])))
    sums = jax.device_get(sums)
    count = max(float(sums["count"]), 1.0)
    out = {"accuracy": float(sums["correct"]) / count,
           "loss": float(sums["loss_sum"]) / count}
    if config.objective == "causal_lm" and config.lm_loss == "xent":
        out["bits_per_token"] = out["loss"] / math.log(2)
    if "example_count" in sums:  # sequence_labels: all labelled positions right
        out["example_accuracy"] = (float(sums["example_correct"])
                                   / max(float(sums["example_count"]), 1.0))
    if "class_tp" in sums:  # sequence_labels: MAD's (torchmetrics') macro accuracy
        out["macro_accuracy"] = macro_accuracy(sums["class_tp"], sums["class_target"],
                                               sums["class_predicted"])
        if batch_macros:  # mad-lab's: each batch's macro, weighted by its examples
            out["pooled_macro_accuracy"] = out["macro_accuracy"]
            total = max(sum(n for _, n in batch_macros), 1.0)
            out["macro_accuracy"] = sum(m * n for m, n in batch_macros) / total
    return out
