r"""MQAR, multi-query associative recall (Arora, Eyuboglu et al. 2023, "Zoology"):
generator, reader and task registration.

`generate(vocab_size=, seq_len=, num_kv_pairs=, num_examples=, seed=, power_a=0.01,
random_non_queries=True)` returns numpy (inputs, labels), both (num_examples, seq_len)
int32, as Zoology's `multiquery_ar` (HazyResearch/zoology, zoology/data/multiquery_ar.py,
commit dbcb60d2bd10a3cc7a89ee60c446c44900a4687f) makes them, with the same numpy calls in
the same order, so that with the same seed the rows are identical (its torch call is the
exception, see random_non_queries):

  - keys: num_kv_pairs drawn without replacement from [1, V/2) per row; values likewise
    from [V/2, V); the row starts with the pairs, key value key value ...
  - each key is queried once later: at position 2 * gap after the pairs, the gaps drawn
    without replacement from [0, (L - 2 kv) / 2) with p(i) ∝ a * (i + 1)^(a - 1), a =
    power_a (a = 1: uniform; a = 0.01: near queries much likelier than far ones);
  - labels after Zoology's shift (inputs = sequence[:-1], labels = sequence[1:] with only
    the answers kept): the value sits on the query key's position, -100 everywhere else;
  - every other position is 0, or with random_non_queries a random token in [0, V).
    Zoology draws those with torch.randint from torch's global generator; here they come
    from the same numpy generator, after its other draws (uniform on [0, V) either way),
    so rows equal Zoology's exactly only with random_non_queries=False, which is what its
    figure 2 uses (experiments/paper_configs/iclr24_zoology_figure2/configs.py).

In the loop (`configs/mqar.py`, objective `sequence_labels`): the data are generated on the
fly from `config.task_options` (no files; `config.data_dir` is not read): vocab_size,
num_kv_pairs, power_a, random_non_queries, num_train_examples, num_valid_examples,
num_test_examples, seed; seq_len is config.max_length. Each split has its own seed,
derived from task_options.seed as Zoology's `prepare_data` (zoology/data/utils.py) derives
a train and a test segment's seeds from DataConfig.seed: np.random.seed(seed), then
randint(0, 2^31) for the train split and randint(2^31, 2^32) for the test split; the
validation split (Zoology has none: it reports its test set as "valid") takes one more
randint(2^31, 2^32). So with seed 123 (DataConfig's default) the train and test splits are
Zoology's figure-2 sets, row for row (results/cpu/mqar_mad_generators.md).

  python -m lra.tasks.mqar --vocab_size=8192 --seq_len=64 --num_kv_pairs=4 \
      --num_examples=3 --random_non_queries=false      # prints rows and statistics
"""
from __future__ import annotations

import sys

import numpy as np

from lra.errors import ConfigError
from lra.tasks import registry

IGNORE = -100  # label of positions that are not predicted (Zoology's, torch's ignore_index)

# Zoology's figure 2 (experiments/paper_configs/iclr24_zoology_figure2/configs.py):
# VOCAB_SIZE = 8_192; 100_000 train / 3_000 test examples; random_non_queries False;
# power_a 0.01 (MQARConfig's default; the figure's "train_power_a"/"test_power_a" keys are
# not fields of MQARConfig, so pydantic drops them and the default stands).
VOCAB_SIZE = 8192
NUM_TRAIN_EXAMPLES = 100_000
NUM_TEST_EXAMPLES = 3_000
DATA_SEED = 123  # zoology.config.DataConfig.seed
MAX_SEED = 2 ** 32  # zoology/data/utils.py prepare_data


def check(vocab_size: int, seq_len: int, num_kv_pairs: int, num_examples: int,
           power_a: float) -> None:
    # Zoology's asserts, as errors that say what to change.
    if num_examples < 1:
        raise ConfigError(f"MQAR: num_examples={num_examples} must be at least 1")
    if num_kv_pairs < 1:
        raise ConfigError(f"MQAR: num_kv_pairs={num_kv_pairs} must be at least 1")
    if seq_len % 2:
        raise ConfigError(f"MQAR: seq_len={seq_len} must be even (Zoology's assert)")
    if vocab_size <= seq_len:
        raise ConfigError(f"MQAR: vocab_size={vocab_size} must be larger than seq_len="
                          f"{seq_len} (Zoology's assert)")
    if 4 * num_kv_pairs > seq_len:
        raise ConfigError(f"MQAR: {num_kv_pairs} key-value pairs and their queries need "
                          f"4 x {num_kv_pairs} = {4 * num_kv_pairs} positions, more than "
                          f"seq_len={seq_len}")
    if num_kv_pairs > vocab_size // 2 - 1:
        raise ConfigError(f"MQAR: {num_kv_pairs} distinct keys from [1, {vocab_size // 2}) "
                          f"need vocab_size > {2 * num_kv_pairs + 1}")
    if not power_a > 0:
        raise ConfigError(f"MQAR: power_a={power_a} must be positive (1 = uniform gaps)")


def gap_probabilities(space: int, power_a: float) -> np.ndarray:
    """p(gap = i) for i in [0, space): Zoology's power law a * (i + 1)^(a - 1), normalised."""
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    return p / p.sum()


def generate(*, vocab_size: int, seq_len: int, num_kv_pairs: int, num_examples: int,
             seed: int, power_a: float = 0.01,
             random_non_queries: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels), int32 arrays of shape (num_examples, seq_len): Zoology's
    multiquery_ar (num_passes=1) with np.random.seed(seed) replaced by a
    RandomState(seed), which draws the same numbers. Labels are -100 except at the
    num_kv_pairs query positions of each row, where they hold the queried key's value."""
    check(vocab_size, seq_len, num_kv_pairs, num_examples, power_a)
    rng = np.random.RandomState(seed)
    context_size = num_kv_pairs * 2
    key_vocab_size = vocab_size // 2
    key_choices = np.arange(1, key_vocab_size)
    value_choices = np.arange(key_vocab_size, vocab_size)

    # np.apply_along_axis(np.random.choice, 1, tiled, replace=False, size=kv) calls
    # choice(row, ...) row after row: the same as this loop.
    keys = np.stack([rng.choice(key_choices, replace=False, size=num_kv_pairs)
                     for _ in range(num_examples)])
    values = np.stack([rng.choice(value_choices, replace=False, size=num_kv_pairs)
                       for _ in range(num_examples)])

    kvs = np.zeros((num_examples, context_size), dtype=np.int64)
    kvs[:, 0::2] = keys
    kvs[:, 1::2] = values

    space = (seq_len - context_size) // 2
    p = gap_probabilities(space, power_a)
    gap_choices = np.arange(space, dtype=int)
    gaps = np.stack([rng.choice(gap_choices, replace=False, p=p, size=num_kv_pairs)
                     for _ in range(num_examples)])

    queries = np.zeros((num_examples, seq_len - context_size + 1), dtype=np.int64)
    np.put_along_axis(queries, gaps * 2, values=keys, axis=1)
    examples = np.concatenate([kvs, queries], axis=1)

    labels = np.full((num_examples, seq_len + 1), IGNORE, dtype=np.int64)
    np.put_along_axis(labels, gaps * 2 + context_size + 1, values=values, axis=1)

    inputs, labels = examples[:, :-1], labels[:, 1:]
    if random_non_queries:
        # Zoology: inputs[inputs == 0] = torch.randint(vocab_size, size=inputs.shape)[...]
        noise = rng.randint(vocab_size, size=inputs.shape)
        inputs = np.where(inputs == 0, noise, inputs)
    return inputs.astype(np.int32), labels.astype(np.int32)


def split_seeds(seed: int) -> dict[str, int]:
    """The generator seed of each split, derived from the data seed as Zoology's
    prepare_data does for one train and one test segment (module docstring)."""
    rng = np.random.RandomState(seed)
    train = int(rng.randint(0, MAX_SEED // 2, size=1)[0])
    test = int(rng.randint(MAX_SEED // 2, MAX_SEED, size=1)[0])
    val = int(rng.randint(MAX_SEED // 2, MAX_SEED, size=1)[0])
    return {"train": train, "val": val, "test": test}


def read_split(split: str, max_length: int, *, vocab_size: int = VOCAB_SIZE,
               num_kv_pairs: int = 4, power_a: float = 0.01,
               random_non_queries: bool = False,
               num_train_examples: int = NUM_TRAIN_EXAMPLES,
               num_valid_examples: int = NUM_TEST_EXAMPLES,
               num_test_examples: int = NUM_TEST_EXAMPLES,
               seed: int = DATA_SEED) -> dict[str, np.ndarray]:
    """One split as the loop reads it: inputs (NxL), mask (all True) and targets, the
    per-position labels (NxL, -100 where ignored); seq_len = max_length."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    num = {"train": num_train_examples, "val": num_valid_examples,
           "test": num_test_examples}[split]
    inputs, labels = generate(vocab_size=vocab_size, seq_len=max_length,
                              num_kv_pairs=num_kv_pairs, num_examples=num,
                              seed=split_seeds(seed)[split], power_a=power_a,
                              random_non_queries=bool(random_non_queries))
    return {"inputs": inputs, "mask": np.ones(inputs.shape, dtype=bool), "targets": labels}


def _read(data_dir: str, split: str, max_length: int, *, vocab_size: int = VOCAB_SIZE,
          num_kv_pairs: int = 4, power_a: float = 0.01, random_non_queries: bool = False,
          num_train_examples: int = NUM_TRAIN_EXAMPLES,
          num_valid_examples: int = NUM_TEST_EXAMPLES,
          num_test_examples: int = NUM_TEST_EXAMPLES,
          seed: int = DATA_SEED) -> dict[str, np.ndarray]:
    del data_dir  # generated on the fly
    return read_split(split, max_length, vocab_size=vocab_size, num_kv_pairs=num_kv_pairs,
                      power_a=power_a, random_non_queries=random_non_queries,
                      num_train_examples=num_train_examples,
                      num_valid_examples=num_valid_examples,
                      num_test_examples=num_test_examples, seed=seed)


def _vocab_size(*, vocab_size: int = VOCAB_SIZE, **_options) -> int:
    return int(vocab_size)


if __name__ != "__main__":
    registry.register(registry.Task(
        name="mqar",
        num_classes=VOCAB_SIZE,
        vocab_size=VOCAB_SIZE,
        max_length=64,
        reader=_read,
        sequence_labels=True,
        vocab_size_of=_vocab_size,
        how_to_get_data="nothing to get: MQAR is generated from config.task_options",
    ))


# --- command line: a look at the rows ----------------------------------------------------


def describe(inputs: np.ndarray, labels: np.ndarray, vocab_size: int,
             num_kv_pairs: int) -> dict[str, float]:
    """Statistics of a generated set (what results/cpu/mqar_mad_generators.md compares)."""
    kv = inputs[:, :2 * num_kv_pairs]
    keys, values = kv[:, 0::2], kv[:, 1::2]
    labelled = labels != IGNORE
    rows, cols = np.nonzero(labelled)
    gaps = (cols - 2 * num_kv_pairs) // 2
    return {"key_min": int(keys.min()), "key_max": int(keys.max()),
            "value_min": int(values.min()), "value_max": int(values.max()),
            "labelled_share": float(labelled.mean()),
            "labels_per_row": float(labelled.sum(1).mean()),
            "mean_gap": float(gaps.mean()), "median_gap": float(np.median(gaps)),
            "zero_share": float((inputs == 0).mean())}


def _main() -> None:
    from absl import app, flags

    flags.DEFINE_integer("vocab_size", VOCAB_SIZE, "Vocabulary size V.")
    flags.DEFINE_integer("seq_len", 64, "Sequence length L (even).")
    flags.DEFINE_integer("num_kv_pairs", 4, "Key-value pairs per row.")
    flags.DEFINE_integer("num_examples", 3, "Rows.")
    flags.DEFINE_integer("seed", 0, "Seed.")
    flags.DEFINE_float("power_a", 0.01, "Power-law exponent of the query gaps.")
    flags.DEFINE_boolean("random_non_queries", True, "Random tokens instead of 0.")
    FLAGS = flags.FLAGS

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            inputs, labels = generate(
                vocab_size=FLAGS.vocab_size, seq_len=FLAGS.seq_len,
                num_kv_pairs=FLAGS.num_kv_pairs, num_examples=FLAGS.num_examples,
                seed=FLAGS.seed, power_a=FLAGS.power_a,
                random_non_queries=FLAGS.random_non_queries)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        for x, y in zip(inputs[:8], labels[:8]):
            print("inputs:", " ".join(map(str, x)))
            print("labels:", " ".join("." if v == IGNORE else str(v) for v in y))
        print(describe(inputs, labels, FLAGS.vocab_size, FLAGS.num_kv_pairs))

    app.run(main)


if __name__ == "__main__":
    _main()
