r"""Flip-flop language modelling (issue 72): Liu, Ash, Goel, Krishnamurthy, Zhang 2023,
"Exposing Attention Glitches with Flip-Flop Language Modeling" (arXiv 2306.00946): the
generator, reader and the task `flipflop`.

FFL(T, p), the paper's definition (its section 3): a string of T/2 instruction-data pairs
(sigma_t, x_t), sigma in {w, r, i} (write, read, ignore), x in {0, 1}; the first
instruction is w and the last r; the others are drawn i.i.d. with probabilities
(p_w, p_r, p_i) = ((1 - p) / 2, (1 - p) / 2, p); the bits after w and i are uniform; the
bit after r is the bit of the most recent w (the flip-flop's state). The paper trains on
FFL(512, 0.8) and tests on FFL(0.8) and its two tails, sparse FFL(0.98) (long gaps
between a write and its read) and dense FFL(0.1); only the bits after r are
deterministic, and only they are scored. Its released data (the HuggingFace dataset
synthseq/flipflop) are strings of the characters 0 1 w r i; ours the same strings as
token ids 1 2 3 4 5 for 0 1 w r i (0 is padding), made here rather than downloaded (no
run-time downloads), from the definition above: the rows are not the released ones.

Labels: the bit after each r, predicted at the r (the next token; -100 elsewhere).
`p_ignore` sets the training and validation rows' p, `test_p_ignore` the test split's
(config.eval_splits tests the same weights on the other tails: configs/flipflop.py).

  python -m lra.tasks.flipflop --length=32 --p_ignore=0.8     # rows and statistics
"""
from __future__ import annotations

import sys

import numpy as np

from lra.errors import ConfigError
from lra.tasks import registry

IGNORE = -100
ZERO, ONE, WRITE, READ, SKIP = 1, 2, 3, 4, 5  # the characters 0 1 w r i
CHARS = {ZERO: "0", ONE: "1", WRITE: "w", READ: "r", SKIP: "i"}
VOCAB_SIZE = 6


def generate(*, num_examples: int, length: int, p_ignore: float, seed: int
             ) -> dict[str, np.ndarray]:
    """num_examples FFL(length, p_ignore) strings as the loop reads them."""
    if length < 4 or length % 2:
        raise ConfigError(f"flipflop: length {length} must be even and at least 4 (a write "
                          "and a read, each an instruction and a bit)")
    if not 0.0 <= p_ignore < 1.0:
        raise ConfigError(f"flipflop: p_ignore={p_ignore} must lie in [0, 1)")
    rng = np.random.default_rng(seed)
    pairs = length // 2
    p_rw = (1.0 - p_ignore) / 2
    ops = rng.choice([WRITE, READ, SKIP], size=(num_examples, pairs),
                     p=[p_rw, p_rw, p_ignore])
    ops[:, 0], ops[:, -1] = WRITE, READ
    bits = rng.integers(0, 2, size=(num_examples, pairs))
    # The state: the bit of the most recent write, carried forward.
    last_write = np.where(ops == WRITE, np.arange(pairs)[None], 0)
    last_write = np.maximum.accumulate(last_write, axis=1)
    state = np.take_along_axis(bits, last_write, axis=1)
    bits = np.where(ops == READ, state, bits)
    tokens = np.empty((num_examples, length), np.int32)
    tokens[:, 0::2], tokens[:, 1::2] = ops, bits + ZERO
    targets = np.full((num_examples, length), IGNORE, np.int32)
    reads = tokens == READ
    targets[:, :-1][reads[:, :-1]] = tokens[:, 1:][reads[:, :-1]]
    # The string is the input (a causal model reads a read's bit only after predicting it).
    return {"inputs": tokens, "mask": np.ones((num_examples, length), bool),
            "targets": targets}


def split_seeds(seed: int) -> dict[str, int]:
    seeds = np.random.default_rng(seed).integers(1 << 32, size=3)
    return dict(zip(registry.SPLITS, map(int, seeds)))


def read_split(split: str, max_length: int, *, p_ignore: float = 0.8,
               test_p_ignore: float = 0.8, num_train_examples: int = 20_000,
               num_valid_examples: int = 500, num_test_examples: int = 1000,
               seed: int = 0) -> dict[str, np.ndarray]:
    """One split of FFL(max_length, p): every row max_length tokens."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    num = {"train": num_train_examples, "val": num_valid_examples,
           "test": num_test_examples}[split]
    return generate(num_examples=num, length=max_length, seed=split_seeds(seed)[split],
                    p_ignore=test_p_ignore if split == "test" else p_ignore)


_read = registry.generated_reader(read_split)

if __name__ != "__main__":
    registry.register(registry.Task(
        name="flipflop",
        num_classes=VOCAB_SIZE,
        vocab_size=VOCAB_SIZE,
        max_length=512,
        reader=_read,
        sequence_labels=True,
        how_to_get_data="nothing to get: flipflop is generated from config.task_options",
    ))


def describe(data: dict[str, np.ndarray]) -> dict[str, float]:
    x = data["inputs"]
    ops = x[:, 0::2]
    reads = np.argwhere(ops == READ)
    # The gap from each read to its write, in instruction pairs.
    gaps = []
    for n, t in reads[:2000]:
        writes = np.flatnonzero(ops[n, :t] == WRITE)
        gaps.append(t - writes[-1])
    return {"rows": int(len(x)), "length": int(x.shape[1]),
            "share_w": float((ops == WRITE).mean()), "share_r": float((ops == READ).mean()),
            "share_i": float((ops == SKIP).mean()),
            "reads_per_row": float((data["targets"] != IGNORE).sum(1).mean()),
            "mean_read_gap_pairs": float(np.mean(gaps))}


def _main() -> None:
    from absl import app, flags

    flags.DEFINE_integer("length", 32, "Row length (even).")
    flags.DEFINE_float("p_ignore", 0.8, "p: the share of ignore instructions.")
    flags.DEFINE_integer("num_examples", 4, "Rows.")
    flags.DEFINE_integer("seed", 0, "Seed.")
    FLAGS = flags.FLAGS

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            data = generate(num_examples=FLAGS.num_examples, length=FLAGS.length,
                            p_ignore=FLAGS.p_ignore, seed=FLAGS.seed)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        for x in data["inputs"][:4]:
            print("".join(CHARS[int(v)] for v in x))
        print(describe(data))

    app.run(main)


if __name__ == "__main__":
    _main()
