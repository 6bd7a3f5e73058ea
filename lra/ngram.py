r"""A count-based n-gram baseline for the causal_lm objective: what next-token prediction
scores without a network, on the same tokens, targets and metric as a `pretrain,causal` run.

  python -m lra.ngram --config=configs/listops.py:mini,pretrain,causal [--order=3]

reads the config's data (its task, data_dir, max_length and task_options, as lra.train
does), counts (n-1 previous tokens -> next token) over the training split and scores the
test split as lra.training.objectives scores a causal_lm run: the targets are every real token but
the first of each row (the output at t predicts token t + 1; with config.start_token, every
real token), and it prints test bits per token (mean -log2 p of the target) and next-token
accuracy (argmax of the counts). A context reaching before a row's first token uses a
boundary id (vocab_size), so the first targets see fewer real tokens, as a causal model's do.

Smoothing: add-k over the task's vocab_size ids (padding id 0 included, as the model's
softmax; k = 1 by default). ListOps minis have 16 ids and ~700k training targets, so every
trigram context is seen thousands of times and the smoothing changes the bits in the third
decimal at most. Ties in the argmax go to the lower id.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from lra.runs import cli


@dataclasses.dataclass(frozen=True)
class NGramScore:
    order: int
    bits_per_token: float
    accuracy: float
    num_targets: int
    num_contexts_seen: int  # distinct training contexts


def _contexts_and_targets(tokens_BxL: np.ndarray, mask_BxL: np.ndarray, *, order: int,
                          vocab_size: int, start_token: bool = False
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(context ids, target ids) of every counted target, flattened. A context is the n-1
    previous tokens of the row encoded base vocab_size + 1 (boundary id vocab_size before
    the row's start)."""
    tokens = np.asarray(tokens_BxL, np.int64)
    mask = np.asarray(mask_BxL, bool)
    if tokens.shape != mask.shape or tokens.ndim != 2:
        raise ValueError(f"tokens and mask must both be BxL, got {tokens.shape} and "
                         f"{mask.shape}")
    if order < 1:
        raise ValueError(f"order must be >= 1, got {order}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size})")
    b, _ = tokens.shape
    pad = np.full((b, order - 1), vocab_size, np.int64)
    padded = np.concatenate([pad, tokens], axis=1)  # BxL+n-1
    base = vocab_size + 1
    context = np.zeros(tokens.shape, np.int64)
    for back in range(order - 1, 0, -1):  # token t - back (oldest first); boundary before
        context = context * base + padded[:, order - 1 - back:padded.shape[1] - back]
    weight = mask.copy()
    if not start_token:
        weight[:, 0] = False  # the first token is no target (the output at t predicts t + 1)
    return context[weight], tokens[weight]


def fit_counts(tokens_BxL: np.ndarray, mask_BxL: np.ndarray, *, order: int, vocab_size: int,
               start_token: bool = False) -> dict[int, np.ndarray]:
    """context id -> counts of the next token (vocab_size wide), over the counted targets."""
    contexts, targets = _contexts_and_targets(tokens_BxL, mask_BxL, order=order,
                                              vocab_size=vocab_size, start_token=start_token)
    counts: dict[int, np.ndarray] = {}
    keys, inverse = np.unique(contexts, return_inverse=True)
    table = np.zeros((len(keys), vocab_size), np.int64)
    np.add.at(table, (inverse, targets), 1)
    for key, row in zip(keys.tolist(), table):
        counts[key] = row
    return counts


def score(counts: dict[int, np.ndarray], tokens_BxL: np.ndarray, mask_BxL: np.ndarray, *,
          order: int, vocab_size: int, add_k: float = 1.0, start_token: bool = False
          ) -> NGramScore:
    """Bits per token and accuracy of the add-k smoothed counts on (tokens, mask)."""
    if add_k <= 0:
        raise ValueError(f"add_k must be positive (an unseen token would cost infinite "
                         f"bits), got {add_k}")
    contexts, targets = _contexts_and_targets(tokens_BxL, mask_BxL, order=order,
                                              vocab_size=vocab_size, start_token=start_token)
    if not len(targets):
        raise ValueError("no targets to score (every row has at most one real token)")
    empty = np.zeros(vocab_size, np.int64)
    rows = np.stack([counts.get(c, empty) for c in contexts.tolist()]).astype(np.float64)
    probs = (rows + add_k) / (rows.sum(axis=1, keepdims=True) + add_k * vocab_size)
    p_target = probs[np.arange(len(targets)), targets]
    return NGramScore(order=order, bits_per_token=float(np.mean(-np.log2(p_target))),
                      accuracy=float(np.mean(np.argmax(rows, axis=1) == targets)),
                      num_targets=int(len(targets)), num_contexts_seen=len(counts))


def evaluate_config(config, *, order: int = 3, add_k: float = 1.0,
                    split: str = "test") -> NGramScore:
    """Fits on the config's training split, scores its `split` (lra.train's data)."""
    from lra.tasks import registry as tasks

    task = tasks.get(config.task)
    options = dict(config.get("task_options", {}) or {})
    load = lambda s: task.load(config.data_dir, s, config.max_length, **options)  # noqa: E731
    train, held_out = load("train"), load(split)
    start = bool(config.get("start_token", False))
    docs = [("inputs", "mask"), ("inputs2", "mask2")]

    def stacked(data):  # both documents of a dual-input task, as the objective predicts
        pairs = [(data[i], data[m]) for i, m in docs if i in data]
        return (np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs]))

    counts = fit_counts(*stacked(train), order=order, vocab_size=task.vocab_size,
                        start_token=start)
    return score(counts, *stacked(held_out), order=order, vocab_size=task.vocab_size,
                 add_k=add_k, start_token=start)


def main(argv) -> None:
    del argv
    from absl import flags
    from ml_collections import config_flags  # noqa: F401  (the flag below)

    config = flags.FLAGS.config
    if config.objective != "causal_lm":
        cli.refuse("lra.ngram scores next-token prediction: give a config with "
                   "`pretrain,causal` (objective causal_lm)")
    fv = flags.FLAGS
    from lra.errors import UserError
    from lra.tasks import registry as tasks

    # Refused before the data is read (a traceback, or "bits/token nan" and exit 0, before).
    if fv.order < 1:
        cli.refuse(f"--order={fv.order}: give n >= 1 (1 is the unigram)")
    if not (math.isfinite(fv.add_k) and fv.add_k > 0):
        cli.refuse(f"--add_k={fv.add_k:g}: give a positive finite number (add-k smoothing; "
                   "0 would cost an unseen token infinite bits)")
    if fv.split not in tasks.SPLITS:
        cli.refuse(f"--split={fv.split}: give one of {', '.join(tasks.SPLITS)} (the counts "
                   "are fitted on train)")
    for order in sorted({1, 2, fv.order}):
        try:
            s = evaluate_config(config, order=order, add_k=fv.add_k, split=fv.split)
        except (UserError, ValueError) as e:  # missing data, rows with no target
            cli.refuse(str(e))
        print(f"{config.task} {order}-gram (add-{flags.FLAGS.add_k:g}, {s.num_contexts_seen} "
              f"training contexts): {flags.FLAGS.split} bits/token {s.bits_per_token:.4f}, "
              f"next-token accuracy {100 * s.accuracy:.2f}% over {s.num_targets} targets")


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "A task config with pretrain,causal.")
    flags.DEFINE_integer("order", 3, "n of the n-gram (the unigram and bigram print too).")
    flags.DEFINE_float("add_k", 1.0, "Add-k smoothing over the vocabulary.")
    flags.DEFINE_string("split", "test", "The split to score.")
    flags.mark_flag_as_required("config")
    app.run(main, flags_parser=cli.parse_flags_or_refuse)
