r"""State tracking (issue 72): parity and modular arithmetic as Grazzi et al. 2025 ("Unlocking
State-Tracking in Linear RNNs Through Negative Eigenvalues") generate them, and the group
word problems of Merrill et al. 2024 ("The Illusion of State in State-Space Models"):
generators, readers and the task `state_tracking`.

Two families, chosen by `task_options.language`:

- `parity`, `modular_arithmetic`: automl/unlocking_state_tracking at df8f840
  (xlstm/experiments/data/formal_language/: tasks/parity.py, tasks/modular_arithmetic.py,
  online_generate.py, formal_language_dataset.py; the xLSTM repository's formal-language
  code). One label per row, the answer after the last input token. `parity_row` and
  `modular_arithmetic_row` make one row with the same numpy calls in the same order as
  theirs, and a split is theirs row for row at the same seed (results/cpu/
  state_tracking_generators.md):
    * a row of `context_length` tokens: the sequence (parity: bits 1 / 2; modular
      arithmetic: numbers 5.. and operators + - * as 1 2 3, then `=` 4), the answer token at
      position size - 1 (parity: (sum - size + 1) mod 2 + 1, i.e. 1 + the count of 2s mod 2;
      modular arithmetic: the expression's value mod vocab_size - 5, + 5, `*` binding
      first), zeros after; size uniform in [min_length, max_length] (modular arithmetic:
      odd sizes);
    * FormLangDataset's enable_mask and shift 1: inputs = the row with the answer replaced
      by 0, without its last token; labels = the answer at its position, shifted one back
      (-100 elsewhere; theirs -1, torch's ignore index there). The model's length is
      context_length - 1 = config.max_length; `mask` is True on the size - 1 input tokens;
    * example i of a split is generated alone with seed base + i, base =
      default_rng(split seed).integers(2^32 - count) (OnlineTaskGenerate); the split seeds
      are random.Random(seed).randint(0, 2^32) for train, validation, test in that order
      (FormLangDatasetGenerator._generate_seeds with their `subpar` validation and test
      parts). `count` is each split's size in their configs (parity 5,120,000 train,
      modular arithmetic 102,400,000; 8,192 validation and test), kept as the seed's
      argument whatever num_*_examples takes, so that our first rows are theirs.
  Their validation and test rows have lengths 40..256 (the extrapolation range) and they
  train on 3..40; ours: train_* and val_* lengths 3..40 (model selection in-distribution),
  test_* 40..max; the accuracy at each longer length is `config.eval_lengths`'
  (lra/training/lengths.py).

- word problems `S3`, `S4`, `A4`, `A5`, `S5`, `Z<m>` (e.g. Z2 = parity as a group): a row of
  elements drawn uniformly (jopetty/word-problem generate_data.py: random.choices over the
  group's elements), labelled at *every* position with the product so far,
  g_1 g_2 ... g_t (DeltaProduct's and the Illusion of State's sequence-to-sequence form).
  A permutation p of {0..n-1} is a tuple; the product of p then q is the map
  i -> q[p[i]] (apply p, then q). Elements are numbered in lexicographic order of their
  tuples (identity = 0); tokens are element + 1 (0 is padding), labels the element id.
  Their generator numbers elements through the abstract_algebra package; the rows are not
  theirs, the distribution is (uniform elements, the prefix products).

  python -m lra.tasks.state_tracking --language=parity --min_length=3 --max_length=12
      # prints rows and statistics
"""
from __future__ import annotations

import functools
import itertools
import random
import sys

import numpy as np

from lra.errors import ConfigError
from lra.tasks import registry

IGNORE = -100
SEED = 42  # their configs' dataset.kwargs.seed
# Each split's `count` in their configs (parity_*.yaml, mod_arithmetic_*.yaml): the seed of
# example i is base + i with base drawn below 2^32 - count.
THEIR_COUNT = {"parity": {"train": 5_120_000, "val": 8192, "test": 8192},
               "modular_arithmetic": {"train": 102_400_000, "val": 8192, "test": 8192}}
THEIR_VOCAB = {"parity": 3, "modular_arithmetic": 10}
FORMAL = tuple(THEIR_COUNT)
GROUPS = ("S3", "S4", "A4", "A5", "S5")


# --- their formal-language rows ----------------------------------------------------------


def parity_row(*, vocab_size: int, min_length: int, max_length: int, context_length: int,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    """tasks/parity.py's parity(batch_size=1, ...): (row, prediction_mask) of
    context_length tokens, the same calls in the same order."""
    rng = np.random.default_rng(seed)
    res = np.zeros([1, context_length], dtype=np.int32)
    res[:, :-1] = rng.integers(1, vocab_size, size=[1, context_length - 1])
    size = rng.integers(min_length, max_length + 1, size=[1])[0]
    res[0, size - 1:] = 0
    res[0, size - 1] = (np.sum(res[0, :size - 1]) - size + 1) % (vocab_size - 1) + 1
    mask = np.zeros_like(res)
    mask[0, size - 1] = 1
    return res[0], mask[0]


def modular_arithmetic_row(*, vocab_size: int, min_length: int, max_length: int,
                           context_length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """tasks/modular_arithmetic.py's modular_arithmetic(batch_size=1, ...): numbers are
    tokens 5..vocab_size-1 (value token - 5), operators + - * are 1 2 3, `=` is 4; `*`
    binds before + and -; the answer (mod vocab_size - 5) follows `=`."""
    rng = np.random.default_rng(seed)
    res = rng.integers(vocab_size - 5, size=[1, context_length]) + 5
    res[:, 1::2] = rng.integers(3, size=[1, context_length // 2]) + 1
    min_seq = min((min_length + 1) // 2, (max_length + 1) // 2)
    size = 2 * rng.integers(min_seq, (max_length + 1) // 2 + 1, size=[1])[0] - 1
    mask = np.zeros_like(res)
    row = res[0]
    row[size - 2] = 4
    row[size:] = 0
    total, prev_val, prev_sign = 0, row[0] - 5, 1
    for n, num in enumerate(row[1:size - 2]):
        if n % 2 == 0:  # an operator
            if num != 3:  # + or -: close the product so far
                total += prev_sign * prev_val
                prev_val = 1
                prev_sign = -1 if num == 2 else 1
        else:
            prev_val *= (num - 5)
    total += prev_sign * prev_val
    row[size - 1] = total % (vocab_size - 5) + 5
    mask[0, size - 1] = 1
    return row.astype(np.int32), mask[0]


ROWS = {"parity": parity_row, "modular_arithmetic": modular_arithmetic_row}


def split_seeds(seed: int) -> dict[str, int]:
    """FormLangDatasetGenerator._generate_seeds: random.Random(seed).randint(0, 2^32) for
    train, validation, test (their subpart names), in that order."""
    rng = random.Random(seed)
    return {split: rng.randint(0, 1 << 32) for split in ("train", "val", "test")}


def base_seed(split_seed: int, count: int) -> int:
    """OnlineTaskGenerate: example i is generated with seed base + i."""
    return int(np.random.default_rng(seed=split_seed).integers((1 << 32) - count))


def formal_split(language: str, *, num_examples: int, min_length: int, max_length: int,
                 context_length: int, vocab_size: int, split_seed: int, count: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Their rows 0..num_examples-1 of one split: (rows, prediction masks), each
    num_examples x context_length."""
    if num_examples > count:
        raise ConfigError(f"state_tracking: {num_examples} examples, more than the split's "
                          f"count {count} (the seeds' range)")
    base = base_seed(split_seed, count)
    make = ROWS[language]
    rows = [make(vocab_size=vocab_size, min_length=min_length, max_length=max_length,
                 context_length=context_length, seed=base + i) for i in range(num_examples)]
    return np.stack([r for r, _ in rows]), np.stack([m for _, m in rows])


def masked_shift(rows: np.ndarray, masks: np.ndarray) -> dict[str, np.ndarray]:
    """FormLangDataset with enable_mask and shift 1, as the loop reads it: the answer
    hidden from the inputs (0) and predicted one position earlier; `mask` True on the
    tokens before the answer."""
    inputs = np.where(masks == 1, 0, rows)[:, :-1]
    labels = np.where(masks == 1, rows, IGNORE)[:, 1:]
    answer = np.argmax(masks, axis=1)  # the answer's position in the row
    mask = np.arange(inputs.shape[1])[None] < answer[:, None]
    return {"inputs": inputs.astype(np.int32), "mask": mask,
            "targets": labels.astype(np.int32)}


# --- group word problems -----------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def group_table(name: str) -> np.ndarray:
    """The multiplication table T[a, b] = id of (a then b) of a group named S<n>, A<n> or
    Z<m>, its elements numbered in lexicographic order of their permutation tuples
    (Z<m>: the rotations of m points, i.e. addition mod m)."""
    kind, n = name[0], name[1:]
    if kind not in "SAZ" or not n.isdigit() or int(n) < 2:
        raise ConfigError(f"state_tracking: unknown group {name!r}; one of S<n>, A<n>, "
                          f"Z<m> (n, m >= 2), e.g. {', '.join(GROUPS)}, Z2, Z60")
    n = int(n)
    if kind == "Z":
        idx = np.arange(n)
        return ((idx[:, None] + idx[None, :]) % n).astype(np.int32)
    perms = list(itertools.permutations(range(n)))
    if kind == "A":  # even permutations: an even number of inversions
        perms = [p for p in perms
                 if sum(p[i] > p[j] for i in range(n) for j in range(i + 1, n)) % 2 == 0]
    index = {p: i for i, p in enumerate(perms)}
    return np.array([[index[tuple(q[p[i]] for i in range(n))] for q in perms]
                     for p in perms], dtype=np.int32)


def word_problem(group: str, *, num_examples: int, min_length: int, max_length: int,
                 seq_len: int, seed: int) -> dict[str, np.ndarray]:
    """Rows of uniform elements (tokens element + 1, 0 after the row's length, uniform in
    [min_length, max_length]) labelled at every position with the product so far."""
    table = group_table(group)
    rng = np.random.default_rng(seed)
    elements = rng.integers(0, len(table), size=(num_examples, seq_len))
    sizes = rng.integers(min_length, max_length + 1, size=num_examples)
    prefix = np.empty_like(elements)
    prefix[:, 0] = elements[:, 0]
    for t in range(1, seq_len):
        prefix[:, t] = table[prefix[:, t - 1], elements[:, t]]
    mask = np.arange(seq_len)[None] < sizes[:, None]
    return {"inputs": np.where(mask, elements + 1, 0).astype(np.int32), "mask": mask,
            "targets": np.where(mask, prefix, IGNORE).astype(np.int32)}


# --- the task ----------------------------------------------------------------------------


def vocab_size_of(*, language: str = "parity", vocab_size: int = 0, **_options) -> int:
    """Tokens (0 = padding): their vocab_size for parity / modular arithmetic, the group's
    order + 1 for a word problem (labels, the element ids, lie below it)."""
    if language in FORMAL:
        return int(vocab_size or THEIR_VOCAB[language])
    return len(group_table(language)) + 1


def _lengths(split: str, options: dict) -> tuple[int, int]:
    lo, hi = options[f"{split}_min_length"], options[f"{split}_max_length"]
    return int(lo), int(hi)


def read_split(split: str, max_length: int, *, language: str = "parity", vocab_size: int = 0,
               train_min_length: int = 3, train_max_length: int = 40,
               val_min_length: int = 3, val_max_length: int = 40,
               test_min_length: int = 40, test_max_length: int = 0,
               num_train_examples: int = 20_000, num_valid_examples: int = 1_000,
               num_test_examples: int = 1_000, seed: int = SEED) -> dict[str, np.ndarray]:
    """One split as the loop reads it. max_length is the model's length (their
    context_length - 1 for the formal languages); test_max_length 0 = as long as fits."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    options = dict(train_min_length=train_min_length, train_max_length=train_max_length,
                   val_min_length=val_min_length, val_max_length=val_max_length,
                   test_min_length=test_min_length, test_max_length=test_max_length)
    formal = language in FORMAL
    vocab_size_of(language=language)  # an unknown language first: before its lengths
    longest = max_length + 1 if formal else max_length  # a formal row holds its answer too
    if not options["test_max_length"]:
        options["test_max_length"] = longest
    lo, hi = _lengths(split, options)
    if not 2 <= lo <= hi <= longest:
        raise ConfigError(f"state_tracking: {split} lengths {lo}..{hi} must satisfy 2 <= "
                          f"min <= max <= {longest} (config.max_length={max_length}"
                          f"{' + 1: the row holds its answer' if formal else ''})")
    num = {"train": num_train_examples, "val": num_valid_examples,
           "test": num_test_examples}[split]
    seeds = split_seeds(seed)
    if formal:
        if language == "modular_arithmetic" and lo < 3:
            raise ConfigError("state_tracking: modular_arithmetic rows need at least 3 "
                              "tokens (a number, =, the answer)")
        rows, masks = formal_split(language, num_examples=num, min_length=lo, max_length=hi,
                                   context_length=max_length + 1,
                                   vocab_size=vocab_size_of(language=language,
                                                            vocab_size=vocab_size),
                                   split_seed=seeds[split],
                                   count=THEIR_COUNT[language][split])
        return masked_shift(rows, masks)
    return word_problem(language, num_examples=num, min_length=lo, max_length=hi,
                        seq_len=max_length, seed=seeds[split])


def at_length(options: dict, max_length: int, length: int) -> tuple[int, dict]:
    """The test split with every row `length` long (lra/training/lengths.py): the model's
    length stays unless the rows need more."""
    formal = options.get("language", "parity") in FORMAL
    need = length - 1 if formal else length
    return max(max_length, need), {**options, "test_min_length": length,
                                   "test_max_length": length}


_read = registry.generated_reader(read_split)

if __name__ != "__main__":
    registry.register(registry.Task(
        name="state_tracking",
        num_classes=3,
        vocab_size=3,
        max_length=255,
        reader=_read,
        sequence_labels=True,
        vocab_size_of=vocab_size_of,
        at_length=at_length,
        how_to_get_data="nothing to get: state_tracking is generated from "
                        "config.task_options",
    ))


def describe(data: dict[str, np.ndarray]) -> dict[str, float]:
    """Statistics of a split (what results/cpu/state_tracking_generators.md compares)."""
    labelled = data["targets"] != IGNORE
    labels = data["targets"][labelled]
    lengths = data["mask"].sum(1)
    return {"rows": int(len(lengths)), "mean_length": float(lengths.mean()),
            "min_length": int(lengths.min()), "max_length": int(lengths.max()),
            "labels_per_row": float(labelled.sum(1).mean()),
            "majority_label_share": float(np.bincount(labels).max() / max(len(labels), 1))}


def _main() -> None:
    from absl import app, flags

    flags.DEFINE_string("language", "parity", "parity, modular_arithmetic, S3, A5, S5, Z<m>.")
    flags.DEFINE_integer("min_length", 3, "Shortest row.")
    flags.DEFINE_integer("max_length", 12, "Longest row (also the model's length).")
    flags.DEFINE_integer("num_examples", 4, "Rows.")
    flags.DEFINE_integer("seed", SEED, "Seed.")
    FLAGS = flags.FLAGS

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            data = read_split("train", FLAGS.max_length, language=FLAGS.language,
                              train_min_length=FLAGS.min_length,
                              train_max_length=FLAGS.max_length,
                              num_train_examples=FLAGS.num_examples, seed=FLAGS.seed)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        for x, m, y in zip(data["inputs"][:8], data["mask"][:8], data["targets"][:8]):
            print("inputs:", " ".join(str(v) if k else "_" for v, k in zip(x, m)))
            print("labels:", " ".join("." if v == IGNORE else str(v) for v in y))
        print(describe(data))

    app.run(main)


if __name__ == "__main__":
    _main()
