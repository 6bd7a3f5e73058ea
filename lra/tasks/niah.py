r"""Needle in a haystack (issue 72): RULER's synthetic needle tasks (Hsieh et al. 2024, "RULER:
What's the Real Context Size of Your Long-Context Language Models?") at small scale, over
our own token ids: generator, reader and the task `niah`.

RULER's task (NVIDIA/RULER at c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a: scripts/
data/synthetic/niah.py, the task rows of scripts/synthetic.yaml), and what is scaled down:

- A needle is "One of the special magic {numbers} for {key} is: {value}." Ours: the tokens
  NEEDLE key IS value, a key `key_len` tokens from `num_keys` key tokens, a value
  `value_len` tokens from `num_values` value tokens (RULER: keys adjective-noun words or
  UUIDs, values 7-digit numbers or UUIDs: several tokens each in a real tokenizer).
- The haystack (`haystack`): `noise` is one sentence repeated ("The grass is green. The
  sky is blue. ..."; ours a fixed run of `sentence_len` filler tokens), the needles put
  between sentences; `needle` is distractor needles with other keys and values
  (niah_multikey_2/3), the needles put between them; RULER's `essay` (Paul Graham's essays)
  is `random` here: filler tokens drawn uniformly from `num_filler`, the needles put
  anywhere. Distractor keys differ from the row's keys (RULER draws them at random from a
  large set: a collision is unlikely there and would make the answer ambiguous).
- `num_needle_k` keys with needles, `num_needle_v` values per key (one needle each),
  `num_needle_q` of the keys queried (num_needle_k is at least num_needle_q, as RULER
  sets it). RULER's rows: single_1 (noise, 1 1 1), single_2 (essay), single_3 (essay,
  UUID values), multikey_1 (essay, 4 keys), multikey_2 (needle haystack), multikey_3
  (needle haystack, UUID keys and values), multivalue (4 values), multiquery (4 queries):
  VARIANTS below, each at our key and value lengths.
- Depth: RULER puts the needles at uniformly drawn sentence slots (noise, needle) or at
  depths from 40 points spaced over 0..100% (essay); the depth of a needle is the share of
  the haystack before it. Ours: each needle at a distinct slot drawn uniformly (`random`:
  any token boundary), the depth likewise the haystack's share before it; the test split
  at a depth range through `test_depth_min`/`test_depth_max` (config.eval_depth_buckets:
  the accuracy per depth bucket, lra/training/lengths.py).
- The question: RULER's template asks "What are all the special magic numbers for {query}
  mentioned in the provided text?" and scores a row by the share of its values found in
  the generated text (string_match_all). Ours: QUERY key IS, then the values of that key
  in the order their needles stand in the context (value_len tokens each), one query
  after the other; the model predicts each answer token at the position before it
  (teacher forcing, the answers before it given), so test_accuracy is the share of answer
  tokens right and test_example_accuracy the share of rows with every answer right.
  RULER's preamble ("Some special magic numbers are hidden within the following text...")
  carries no information here and is left out.
- Every row fills the model's length: the context is config.max_length + 1 minus the
  query's tokens (RULER: as many haystack sentences as fit in max_seq_length).

Token ids: 0 padding (unused: rows are full), 1 NEEDLE, 2 IS, 3 QUERY, 4 FILL (the
tokens left over where distractor needles do not fill the haystack, at its start), then
the key tokens, the value tokens, the filler tokens.

  python -m lra.tasks.niah --variant=multikey_2 --length=64   # rows and statistics
"""
from __future__ import annotations

import inspect
import sys

import numpy as np

from lra.errors import ConfigError
from lra.tasks import registry

IGNORE = -100
PAD, NEEDLE, IS, QUERY, FILL = range(5)
FIRST = 5  # the first key token
HAYSTACKS = ("noise", "random", "needle")
# RULER's niah rows (scripts/synthetic.yaml): haystack (essay -> random) and needle counts.
VARIANTS = {
    "single_1": dict(haystack="noise", num_needle_k=1, num_needle_v=1, num_needle_q=1),
    "single_2": dict(haystack="random", num_needle_k=1, num_needle_v=1, num_needle_q=1),
    "multikey_1": dict(haystack="random", num_needle_k=4, num_needle_v=1, num_needle_q=1),
    "multikey_2": dict(haystack="needle", num_needle_k=1, num_needle_v=1, num_needle_q=1),
    "multivalue": dict(haystack="random", num_needle_k=1, num_needle_v=4, num_needle_q=1),
    "multiquery": dict(haystack="random", num_needle_k=4, num_needle_v=1, num_needle_q=4),
}


def vocab_size_of(*, num_keys: int = 32, num_values: int = 32, num_filler: int = 64,
                  **_options) -> int:
    return FIRST + int(num_keys) + int(num_values) + int(num_filler)


def _decode(index: np.ndarray, base: int, length: int, offset: int) -> np.ndarray:
    """Integers in [0, base^length) as `length` digits in base `base`, plus offset."""
    digits = [(index // base ** i) % base for i in range(length - 1, -1, -1)]
    return np.stack(digits, axis=-1) + offset


def _slots(rng, allowed: np.ndarray, count: int, why: str) -> np.ndarray:
    if len(allowed) < count:
        raise ConfigError(f"niah: {count} needles need {count} slots, only {len(allowed)} "
                          f"{why}; make the row longer or the depth range wider")
    return np.sort(rng.choice(allowed, size=count, replace=False))


def make_row(rng: np.random.Generator, *, length: int, haystack: str, num_needle_k: int,
             num_needle_v: int, num_needle_q: int, key_len: int, value_len: int,
             num_keys: int, num_values: int, num_filler: int, sentence_len: int,
             depth_min: float = 0.0, depth_max: float = 1.0) -> dict:
    """One row: tokens (length + 1: the inputs are tokens[:-1], the labels tokens[1:] at
    the answers), the answer positions in tokens, and each needle's depth and slot."""
    nk = max(num_needle_k, num_needle_q)
    needle_len = 2 + key_len + value_len
    n_needles = nk * num_needle_v
    query_len = num_needle_q * (2 + key_len + num_needle_v * value_len)
    context = length + 1 - query_len
    hay = context - n_needles * needle_len
    if hay < 0:
        raise ConfigError(f"niah: length {length} holds {context} context tokens, fewer than "
                          f"the {n_needles} needles' {n_needles * needle_len}")
    key_space, value_space = num_keys ** key_len, num_values ** value_len
    n_hay_needles = hay // needle_len if haystack == "needle" else 0
    if nk + n_hay_needles > key_space:
        raise ConfigError(f"niah: {nk + n_hay_needles} distinct keys needed, "
                          f"num_keys^key_len = {key_space}; raise num_keys or key_len")
    if n_needles > value_space:
        raise ConfigError(f"niah: {n_needles} distinct values needed, num_values^value_len "
                          f"= {value_space}")
    key_ids = rng.choice(key_space, size=nk + n_hay_needles, replace=False)
    keys = _decode(key_ids, num_keys, key_len, FIRST)
    values = _decode(rng.choice(value_space, size=n_needles, replace=False), num_values,
                     value_len, FIRST + num_keys).reshape(nk, num_needle_v, value_len)
    filler0 = FIRST + num_keys + num_values
    # The haystack as tokens and the offsets (within it) where a needle may go.
    if haystack == "noise":
        sentence = filler0 + np.arange(sentence_len) % num_filler
        tokens = np.resize(sentence, hay)
        allowed = np.arange(0, hay + 1, sentence_len)
    elif haystack == "random":
        tokens = rng.integers(filler0, filler0 + num_filler, size=hay)
        allowed = np.arange(hay + 1)
    elif haystack == "needle":
        lead = hay - n_hay_needles * needle_len
        hay_values = _decode(rng.integers(value_space, size=n_hay_needles), num_values,
                             value_len, FIRST + num_keys)
        units = np.concatenate([np.full((n_hay_needles, 1), NEEDLE), keys[nk:],
                                np.full((n_hay_needles, 1), IS), hay_values], axis=1)
        tokens = np.concatenate([np.full(lead, FILL), units.reshape(-1)])
        allowed = lead + np.arange(n_hay_needles + 1) * needle_len
    else:
        raise ConfigError(f"niah: haystack={haystack!r}; one of {', '.join(HAYSTACKS)}")
    depth = allowed / max(hay, 1)
    inside = (depth >= depth_min) & ((depth < depth_max) | (depth_max >= 1.0))
    # RULER: noise and needle haystacks put each needle at its own sentence slot; the
    # random haystack likewise at its own token boundary.
    slots = _slots(rng, allowed[inside], n_needles,
                   f"lie at depths [{depth_min:g}, {depth_max:g})")
    order = rng.permutation(n_needles)  # which (key, value) goes to which slot
    needles = [np.concatenate([[NEEDLE], keys[i // num_needle_v], [IS],
                               values[i // num_needle_v, i % num_needle_v]])
               for i in order]
    pieces, start = [], 0
    for slot, needle in zip(slots, needles):
        pieces += [tokens[start:slot], needle]
        start = slot
    pieces.append(tokens[start:])
    # The query: QUERY key IS, then the key's values in the order their needles stand.
    queried = rng.choice(nk, size=num_needle_q, replace=False)
    for q in queried:
        seen = [i % num_needle_v for i in order if i // num_needle_v == q]
        pieces.append(np.concatenate([[QUERY], keys[q], [IS], values[q, seen].reshape(-1)]))
    row = np.concatenate(pieces).astype(np.int32)
    # Answer positions: each query block's values, after the context.
    offsets, pos = [], context
    for q in queried:
        offsets.append(pos + 2 + key_len + np.arange(num_needle_v * value_len))
        pos += 2 + key_len + num_needle_v * value_len
    assert len(row) == length + 1, (len(row), length)
    depths = slots / max(hay, 1)  # each needle's share of the haystack before it
    return {"tokens": row, "answers": np.concatenate(offsets), "depths": depths,
            "slots": slots + needle_len * np.arange(n_needles),
            "queried_depths": depths[[j for q in queried for j, i in enumerate(order)
                                      if i // num_needle_v == q]]}


def generate(*, num_examples: int, length: int, seed: int, **options) -> dict[str, np.ndarray]:
    """num_examples rows as the loop reads them: inputs, mask (all True), targets (the
    answers at the positions before them, -100 elsewhere), and `depth`, each row's queried
    needles' mean depth (for statistics; the loop does not read it)."""
    rng = np.random.default_rng(seed)
    inputs = np.empty((num_examples, length), np.int32)
    targets = np.full((num_examples, length), IGNORE, np.int32)
    depth = np.empty(num_examples, np.float32)
    for n in range(num_examples):
        r = make_row(rng, length=length, **options)
        inputs[n] = r["tokens"][:-1]
        targets[n, r["answers"] - 1] = r["tokens"][r["answers"]]
        depth[n] = r["queried_depths"].mean()
    return {"inputs": inputs, "mask": np.ones(inputs.shape, bool), "targets": targets,
            "depth": depth}


def split_seeds(seed: int) -> dict[str, int]:
    seeds = np.random.default_rng(seed).integers(1 << 32, size=3)
    return dict(zip(registry.SPLITS, map(int, seeds)))


def read_split(split: str, max_length: int, *, haystack: str = "noise",
               num_needle_k: int = 1, num_needle_v: int = 1, num_needle_q: int = 1,
               key_len: int = 2, value_len: int = 2, num_keys: int = 32,
               num_values: int = 32, num_filler: int = 64, sentence_len: int = 16,
               test_depth_min: float = 0.0, test_depth_max: float = 1.0,
               num_train_examples: int = 20_000, num_valid_examples: int = 500,
               num_test_examples: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
    """One split; every row max_length tokens. The depth range applies to the test split
    only (training and validation place the needles anywhere)."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    if not 0.0 <= test_depth_min < test_depth_max <= 1.0:
        raise ConfigError(f"niah: test depths [{test_depth_min:g}, {test_depth_max:g}) must "
                          "satisfy 0 <= min < max <= 1")
    for name, v in (("key_len", key_len), ("value_len", value_len), ("num_keys", num_keys),
                    ("num_values", num_values), ("num_filler", num_filler),
                    ("sentence_len", sentence_len), ("num_needle_k", num_needle_k),
                    ("num_needle_v", num_needle_v), ("num_needle_q", num_needle_q)):
        if int(v) < 1:
            raise ConfigError(f"niah: {name}={v} must be at least 1")
    depths = (test_depth_min, test_depth_max) if split == "test" else (0.0, 1.0)
    num = {"train": num_train_examples, "val": num_valid_examples,
           "test": num_test_examples}[split]
    data = generate(num_examples=num, length=max_length, seed=split_seeds(seed)[split],
                    haystack=haystack, num_needle_k=num_needle_k, num_needle_v=num_needle_v,
                    num_needle_q=num_needle_q, key_len=key_len, value_len=value_len,
                    num_keys=num_keys, num_values=num_values, num_filler=num_filler,
                    sentence_len=sentence_len, depth_min=depths[0], depth_max=depths[1])
    del data["depth"]
    return data


def at_depth(options: dict, lo: float, hi: float) -> dict:
    """The test split's options with every needle at a depth in [lo, hi)."""
    return {**options, "test_depth_min": lo, "test_depth_max": hi}


_read = registry.generated_reader(read_split)

if __name__ != "__main__":
    registry.register(registry.Task(
        name="niah",
        num_classes=vocab_size_of(),
        vocab_size=vocab_size_of(),
        max_length=256,
        reader=_read,
        sequence_labels=True,
        vocab_size_of=vocab_size_of,
        at_depth=at_depth,
        how_to_get_data="nothing to get: niah is generated from config.task_options",
    ))


def describe(data: dict[str, np.ndarray], buckets: int = 5) -> dict:
    """Statistics of a split (results/cpu/niah_generators.md sets them beside RULER's)."""
    labelled = data["targets"] != IGNORE
    hist = np.histogram(data["depth"], bins=buckets, range=(0.0, 1.0))[0] / len(data["depth"])
    first = labelled.argmax(1)
    inputs = data["inputs"]
    return {"rows": int(len(inputs)), "length": int(inputs.shape[1]),
            "needles_per_row": float((inputs == NEEDLE).sum(1).mean()),
            "answers_per_row": float(labelled.sum(1).mean()),
            "depth_mean": float(data["depth"].mean()), "depth_std": float(data["depth"].std()),
            "depth_histogram": [round(float(h), 3) for h in hist],
            "query_tokens": float((inputs.shape[1] - (inputs == QUERY).argmax(1)).mean()),
            "first_answer_position": float(first.mean())}


def _main() -> None:
    from absl import app, flags

    flags.DEFINE_enum("variant", "single_1", list(VARIANTS), "RULER's row.")
    flags.DEFINE_integer("length", 64, "Row length (the model's).")
    flags.DEFINE_integer("num_examples", 4, "Rows.")
    flags.DEFINE_integer("seed", 0, "Seed.")
    FLAGS = flags.FLAGS

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        defaults = {p.name: p.default for p in inspect.signature(read_split).parameters.values()
                    if p.name in ("key_len", "value_len", "num_keys", "num_values",
                                  "num_filler", "sentence_len")}
        try:
            data = generate(num_examples=FLAGS.num_examples, length=FLAGS.length,
                            seed=FLAGS.seed, **VARIANTS[FLAGS.variant], **defaults)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        names = {PAD: "_", NEEDLE: "N", IS: "=", QUERY: "Q", FILL: "."}
        for x, y in zip(data["inputs"][:4], data["targets"][:4]):
            print("inputs:", " ".join(names.get(int(v), str(v)) for v in x))
            print("labels:", " ".join(str(v) for v in y[y != IGNORE]))
        print(describe(data))

    app.run(main)


if __name__ == "__main__":
    _main()
