r"""A linear classifier on a classification task's raw inputs: the baseline a sequence model
must beat before its accuracy says anything about mixing (Fashion-MNIST's pixels: about 84%
for logistic regression in Xiao et al. 2017's benchmark table).

  python -m lra.linear_baseline --config=configs/fashion_mnist.py:mini
  python -m lra.linear_baseline --config=configs/text.py:mini --features=counts

reads the config's data as lra.train does (task, data_dir, max_length, task_options),
fits a multinomial logistic regression on the training split (full batch, Adam, an L2
penalty chosen on the validation split from a small grid) and prints validation and test
accuracy beside the majority label's. Features: `values` (each position's id scaled to
[0, 1] by the largest id: the pixels of an image task, 0 at padding) or `counts` (the bag
of ids: the fraction of each id among the real tokens of a row; for text-like tasks).
Both inputs of a dual-input task are concatenated.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from lra.runs import cli

L2_GRID = (0.0, 1e-4, 1e-3)


@dataclasses.dataclass(frozen=True)
class LinearScore:
    features: str
    l2: float  # the penalty chosen on validation
    val_accuracy: float
    test_accuracy: float
    majority_accuracy: float  # the training split's most frequent label, on test
    num_features: int


def featurize(data: dict[str, np.ndarray], features: str, vocab_size: int) -> np.ndarray:
    parts = []
    for inputs, mask in (("inputs", "mask"), ("inputs2", "mask2")):
        if inputs not in data:
            continue
        x, m = data[inputs], data[mask].astype(bool)
        if features == "values":
            parts.append(np.where(m, x, 0).astype(np.float32) / max(vocab_size - 1, 1))
        elif features == "counts":
            counts = np.zeros((len(x), vocab_size), np.float32)
            rows = np.broadcast_to(np.arange(len(x))[:, None], x.shape)
            np.add.at(counts, (rows[m], x[m]), 1.0)
            parts.append(counts / np.maximum(m.sum(1, keepdims=True), 1))
        else:
            raise ValueError(f"features={features!r}: values or counts")
    return np.concatenate(parts, axis=1)


def fit(x_NxF: np.ndarray, y_N: np.ndarray, num_classes: int, *, l2: float,
        steps: int = 300, lr: float = 0.05):
    """Full-batch Adam on the mean cross-entropy + l2 * |W|^2 (features standardized;
    zeros init and the full batch: deterministic, no seed)."""
    import jax
    import jax.numpy as jnp
    import optax

    mean, std = x_NxF.mean(0), x_NxF.std(0) + 1e-6
    x = jnp.asarray((x_NxF - mean) / std)
    y = jnp.asarray(y_N)
    params = {"w": jnp.zeros((x.shape[1], num_classes)), "b": jnp.zeros((num_classes,))}
    opt = optax.adam(lr)
    state = opt.init(params)

    def loss(p):
        logits = x @ p["w"] + p["b"]
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return xent + l2 * jnp.sum(p["w"] ** 2)

    @jax.jit
    def step(p, s):
        g = jax.grad(loss)(p)
        updates, s = opt.update(g, s)
        return optax.apply_updates(p, updates), s

    for _ in range(steps):
        params, state = step(params, state)
    return lambda z: np.asarray(jnp.argmax(
        jnp.asarray((z - mean) / std) @ params["w"] + params["b"], axis=1))


def evaluate_config(config, *, features: str = "values", steps: int = 300) -> LinearScore:
    from lra.tasks import registry as tasks

    task = tasks.get(config.task)
    if not task.num_classes:
        raise ValueError(f"task {config.task} has no classes: lra.linear_baseline is for "
                         "classification tasks")
    options = dict(config.get("task_options", {}) or {})
    data = {s: task.load(config.data_dir, s, config.max_length, **options)
            for s in ("train", "val", "test")}
    x = {s: featurize(d, features, task.vocab_size) for s, d in data.items()}
    y = {s: np.asarray(d["targets"]).astype(np.int32) for s, d in data.items()}
    best = None
    for l2 in L2_GRID:
        predict = fit(x["train"], y["train"], task.num_classes, l2=l2, steps=steps)
        val = float((predict(x["val"]) == y["val"]).mean())
        if best is None or val > best[1]:
            best = (l2, val, float((predict(x["test"]) == y["test"]).mean()))
    majority = np.bincount(y["train"], minlength=task.num_classes).argmax()
    return LinearScore(features, best[0], best[1], best[2],
                       float((y["test"] == majority).mean()), x["train"].shape[1])


def main(argv) -> None:
    del argv
    from absl import flags

    config = flags.FLAGS.config
    if config.objective != "classify":
        cli.refuse("lra.linear_baseline fits a classifier: give a classification "
                   f"config (objective classify, not {config.objective})")
    from lra.errors import UserError

    try:
        s = evaluate_config(config, features=flags.FLAGS.features, steps=flags.FLAGS.steps)
    except UserError as e:  # missing or unreadable data, a bad config: one line
        cli.refuse(str(e))
    print(f"{config.task} linear classifier on {s.features} ({s.num_features} features, "
          f"l2 {s.l2:g} chosen on validation): val {100 * s.val_accuracy:.2f}%, test "
          f"{100 * s.test_accuracy:.2f}%; majority label {100 * s.majority_accuracy:.2f}%")


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "A classification task config.")
    flags.DEFINE_enum("features", "values", ["values", "counts"],
                      "values: each position's id scaled to [0, 1]; counts: the bag of ids.")
    flags.DEFINE_integer("steps", 300, "Full-batch Adam steps per L2 setting.")
    flags.mark_flag_as_required("config")
    app.run(main, flags_parser=cli.parse_flags_or_refuse)
