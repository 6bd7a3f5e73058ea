r"""ListOps (LRA): generator, reader and task registration.

Expressions nest the operators MIN, MAX, MED (median, truncated to int) and SM (sum mod
10) over the digits 0-9; the label is the expression's value. The generator follows LRA's
`lra_benchmarks/data/listops.py` and writes LRA's release TSV format:

  python -m lra.tasks.listops --output_dir=data/listops

writes data/listops/basic_{train,val,test}.tsv: a `Source\tTarget` header, then one
expression and its label per line, e.g. `( ( ( [MAX 4 ) 2 ) ] )\t4`.

The reader also takes LRA's release folder `lra_release/listops-1000` unchanged.
"""
from __future__ import annotations

import os
import random
import sys
import time
from typing import Union

import numpy as np

from lra.errors import ConfigError, DataError
from lra.tasks import registry

# --- the language --------------------------------------------------------------------

MIN, MAX, MED, SUM_MOD = "[MIN", "[MAX", "[MED", "[SM"
END = "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUES = tuple(range(10))
VALUE_P = 0.25  # below max_depth, a node is an operator with this probability

# id 0 is padding; VOCAB[i] has id i + 1. LRA built its vocabulary from a Python set, so its
# ids changed between runs; these are fixed.
VOCAB = tuple(str(v) for v in VALUES) + OPERATORS + (END,)
VOCAB_SIZE = len(VOCAB) + 1
NUM_CLASSES = 10
MAX_LENGTH = 2000
HEADER = "Source\tTarget"

# A tree is a digit, or an operator node nested as binary pairs, as in LRA:
# (((op, v0), v1), ..., END). Kept in this form so `to_string` matches LRA's text exactly.
Tree = Union[int, str, tuple]

HOW_TO_GET_DATA = (
    "generate it with `python -m lra.tasks.listops --output_dir=<dir>` or unpack LRA's "
    "release files with `python -m lra.download listops --data_dir=data` (data/listops), "
    "then set --config.data_dir=<dir>"
)

# Generation warns, then gives up, after this many trees in a row that add nothing new
# (outside the length window, or duplicates), so an unreachable window cannot loop forever.
# LRA's defaults keep about 1 tree in 12.
WARN_ATTEMPTS_WITHOUT_PROGRESS = 100_000
MAX_ATTEMPTS_WITHOUT_PROGRESS = 1_000_000


# --- generator -----------------------------------------------------------------------


def generate_tree(depth: int, max_depth: int, max_args: int,
                  rng: random.Random) -> tuple[Tree, int]:
    """Returns (tree, length): LRA's `generate_tree`, drawing from `rng` in LRA's order.

    length counts the tokens without parentheses: 1 per digit, operator and END.
    """
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return rng.choice(VALUES), 1
    length = 2  # the operator and END
    values = []
    for _ in range(rng.randint(2, max_args)):
        child, child_length = generate_tree(depth + 1, max_depth, max_args, rng)
        values.append(child)
        length += child_length
    t: Tree = (rng.choice(OPERATORS), values[0])
    for value in values[1:]:
        t = (t, value)
    return (t, END), length


def to_string(t: Tree) -> str:
    """LRA's text form: every pair is written '( left right )'."""
    if isinstance(t, str):
        return t
    if isinstance(t, int):
        return str(t)
    return "( " + to_string(t[0]) + " " + to_string(t[1]) + " )"


def apply_operator(op: str, args: list[int]) -> int:
    if op == MIN:
        return min(args)
    if op == MAX:
        return max(args)
    if op == MED:
        # int(np.median(args)) as LRA, without numpy's per-call cost (it dominated
        # generation): the mean of the middle two truncates to their floor mean.
        s, mid = sorted(args), len(args) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) // 2
    if op == SUM_MOD:
        return sum(args) % 10
    raise ValueError(f"unknown operator {op!r}")


def evaluate(t: Tree) -> int:
    """The value of a tree (LRA's `to_value`)."""
    if isinstance(t, int):
        return t
    chain, args = t[0], []  # t is (chain, END); unwind (((op, v0), v1), ...)
    while not isinstance(chain[0], str):
        args.append(chain[1])
        chain = chain[0]
    args.append(chain[1])
    return apply_operator(chain[0], [evaluate(a) for a in reversed(args)])


def _max_possible_length(max_depth: int, max_args: int) -> int:
    length = 1  # nodes at max_depth are always digits
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


def _check_generate_args(num_samples: dict[str, int], min_length: int, max_length: int,
                         max_depth: int, max_args: int) -> None:
    for name, n in num_samples.items():
        if n < 0:
            raise ConfigError(f"--{name}={n} must be >= 0")
    if sum(num_samples.values()) == 0:
        raise ConfigError("--num_train_samples, --num_valid_samples and --num_test_samples "
                          "are all 0")
    if max_depth < 1:
        raise ConfigError(f"--max_depth={max_depth} must be >= 1")
    if max_args < 2:
        raise ConfigError(f"--max_args={max_args} must be >= 2 (operators take 2+ arguments)")
    if max_length - min_length < 2:
        raise ConfigError(
            f"no length L satisfies --min_length={min_length} < L < --max_length={max_length}; "
            "raise --max_length or lower --min_length"
        )
    longest = _max_possible_length(max_depth, max_args)
    if longest <= min_length:
        raise ConfigError(
            f"with --max_depth={max_depth} --max_args={max_args} trees have at most {longest} "
            f"tokens, not more than --min_length={min_length}; raise --max_depth or lower "
            "--min_length"
        )


def _prepare_output_dir(output_dir: str) -> None:
    """Creates `output_dir` (and its parents); a ConfigError says why it cannot be used."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConfigError(f"--output_dir={output_dir} is a file, not a folder; give a folder "
                          "(it is created if missing)")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:  # a parent is a file, no permission, read-only file system
        raise ConfigError(f"cannot create --output_dir={output_dir}: {e.strerror or e}; "
                          "give a folder you can write to") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--output_dir={output_dir} is not writable; give a folder you can "
                          "write to")


def generate(
    output_dir: str,
    *,
    num_train_samples: int = 96000,
    num_valid_samples: int = 2000,
    num_test_samples: int = 2000,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    seed: int = 0,
    task: str = "basic",
    verbose: bool = True,
) -> dict[str, str]:
    """Writes {task}_{train,val,test}.tsv to `output_dir`; returns {split: path}.

    Keeps unique trees with min_length < length < max_length (strict, as LRA), then splits
    them in order of generation: train, val, test.
    """
    counts = {"num_train_samples": num_train_samples, "num_valid_samples": num_valid_samples,
              "num_test_samples": num_test_samples}
    _check_generate_args(counts, min_length, max_length, max_depth, max_args)
    _prepare_output_dir(output_dir)  # before generating: a bad folder fails at once
    total = sum(counts.values())
    log = print if verbose else (lambda *_args, **_kw: None)

    # LRA deduplicated with a set, so its file order depended on PYTHONHASHSEED. An
    # insertion-ordered dict and a seeded Random make the same flags give identical files.
    rng = random.Random(seed)
    rows: dict[str, int] = {}
    attempts = stalled = 0
    start = time.monotonic()
    while len(rows) < total:
        tree, length = generate_tree(1, max_depth, max_args, rng)
        attempts += 1
        stalled += 1
        if min_length < length < max_length:
            text = to_string(tree)
            if text not in rows:
                rows[text] = evaluate(tree)
                stalled = 0
                if len(rows) % 1000 == 0:
                    rate = len(rows) / (time.monotonic() - start)
                    log(f"listops: {len(rows)}/{total} unique trees, {rate:.0f}/s, "
                        f"{attempts} drawn", flush=True)
        if stalled == WARN_ATTEMPTS_WITHOUT_PROGRESS:
            log(f"listops: warning: {stalled} draws without a new tree ({len(rows)}/{total} "
                "so far); the length window may be (nearly) unreachable: widen "
                "--min_length/--max_length or raise --max_depth", flush=True)
        if stalled >= MAX_ATTEMPTS_WITHOUT_PROGRESS:
            raise ConfigError(
                f"found only {len(rows)} of {total} unique trees with {min_length} < length < "
                f"{max_length} after {stalled} draws without a new one; widen the window "
                "(--min_length/--max_length), raise --max_depth or --max_args, or ask for "
                "fewer samples"
            )

    items = list(rows.items())
    bounds = [0, num_train_samples, num_train_samples + num_valid_samples, total]
    paths = {}
    for i, split in enumerate(registry.SPLITS):
        path = os.path.join(output_dir, f"{task}_{split}.tsv")
        lines = [HEADER] + [f"{s}\t{v}" for s, v in items[bounds[i]:bounds[i + 1]]]
        # Write then rename, so an interrupted run never leaves a plausible-looking file.
        try:
            with open(path + ".tmp", "w", encoding="utf-8", newline="\n") as f:
                f.write("\n".join(lines) + "\n")
            os.replace(path + ".tmp", path)
        except OSError as e:  # disk full, a folder named like the file, ...
            raise ConfigError(f"cannot write {path}: {e.strerror or e}; free space or give "
                              "another --output_dir") from None
        paths[split] = path
    log(f"listops: wrote {total} trees in {time.monotonic() - start:.1f}s to "
        + ", ".join(paths.values()), flush=True)
    return paths


# --- reader --------------------------------------------------------------------------

def _token_ids(drop_close_bracket: bool) -> dict[str, int]:
    """Token -> id; parentheses (and END if dropped) map to 0 and are filtered out."""
    ids = {token: i + 1 for i, token in enumerate(VOCAB)}
    ids["("] = ids[")"] = 0
    if drop_close_bracket:
        ids[END] = 0  # LRA's alphanumeric tokenizer dropped ']' along with the parentheses
    return ids


# The fast path turns every token of well-formed lines into one byte (operators become
# these placeholders), so a block of lines reads "t t ... t\nt t ... t" and the ids of the
# whole block are one numpy table lookup. Per-token Python was ~0.4 s per 1000 rows.
_PLACEHOLDERS = {MIN: b"a", MAX: b"b", MED: b"c", SUM_MOD: b"d"}
_BLOCK_ROWS = 1024


def _byte_table(ids: dict[str, int]) -> np.ndarray:
    table = np.full(256, -1, dtype=np.int16)  # -1: not a token; int16 keeps rows small
    for token, i in ids.items():
        table[ord(_PLACEHOLDERS.get(token, token.encode()))] = i
    return table


def _encode_block_fast(sources: list[str], table: np.ndarray) -> list[np.ndarray] | None:
    """Token ids (with parentheses, id 0) of lines in the generator's exact format, else None."""
    try:
        b = "\n".join(sources).encode("ascii")
    except UnicodeEncodeError:
        return None
    if any(ch in b for ch in _PLACEHOLDERS.values()):
        return None  # a stray placeholder byte would be read as an operator
    for token, ch in _PLACEHOLDERS.items():
        b = b.replace(token.encode(), ch)
    chars = np.frombuffer(b, dtype=np.uint8)
    separators = chars[1::2]
    is_newline = separators == ord("\n")
    if len(chars) % 2 == 0 or not (is_newline | (separators == ord(" "))).all():
        return None
    seq = table[chars[::2]]
    if (seq < 0).any():
        return None
    return np.split(seq, np.flatnonzero(is_newline) + 1)


def _encode_slow(source: str, ids: dict[str, int], where: str) -> np.ndarray:
    """Token ids of any whitespace-separated line, with an exact error for a bad token."""
    try:
        return np.array([ids[t] for t in source.split()], dtype=np.int16)
    except KeyError as e:
        raise DataError(f"{where}: unknown token {e.args[0]!r} in {_excerpt(source)}; "
                        f"expected digits, {', '.join(OPERATORS)}, {END}, parentheses") from None


def _encode_block(block: list[tuple[int, str]], ids: dict[str, int], table: np.ndarray,
                  path: str, max_length: int) -> list[np.ndarray]:
    """Token ids of (line number, expression) pairs, parentheses dropped, truncated."""
    if not block:
        return []
    numbers, sources = zip(*block)
    encoded = _encode_block_fast(list(sources), table)
    if encoded is None:  # odd whitespace, or a bad token that needs its exact error
        encoded = [_encode_slow(s, ids, f"{path}:{n}") for n, s in block]
    sequences = []
    for seq, n in zip(encoded, numbers):
        seq = seq[seq != 0]
        if not len(seq):
            raise DataError(f"{path}:{n}: the expression has no tokens")
        sequences.append(seq[:max_length])
    return sequences


def _excerpt(text: str, width: int = 60) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


def read_split(data_dir: str, split: str, max_length: int, *, task_prefix: str = "basic",
               drop_close_bracket: bool = False) -> dict[str, np.ndarray]:
    """Reads {data_dir}/{task_prefix}_{split}.tsv into inputs/mask/targets arrays.

    Parentheses are dropped; ']' is a token unless `drop_close_bracket` (LRA's original
    tokenisation). Sequences longer than `max_length` keep their first `max_length` tokens.
    """
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    if not os.path.isdir(data_dir):
        raise DataError(f"ListOps data directory {data_dir} does not exist; {HOW_TO_GET_DATA}")
    path = os.path.join(data_dir, f"{task_prefix}_{split}.tsv")
    if not os.path.isfile(path):
        raise DataError(f"ListOps file {path} does not exist; {HOW_TO_GET_DATA}")

    ids = _token_ids(drop_close_bracket)
    table = _byte_table(ids)
    sequences: list[np.ndarray] = []
    targets: list[int] = []
    block: list[tuple[int, str]] = []  # (line number, expression), encoded together
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\r\n")
        if header != HEADER:
            raise DataError(f"{path}:1: expected the header {HEADER!r}, got {_excerpt(header)}")
        for line_number, line in enumerate(f, start=2):
            line = line.rstrip("\r\n")
            if not line:
                continue  # a blank line (e.g. at the end of a hand-edited file) holds nothing
            where = f"{path}:{line_number}"
            fields = line.split("\t")
            if len(fields) != 2:
                raise DataError(f"{where}: expected 2 tab-separated columns (expression, "
                                f"label), got {len(fields)}: {_excerpt(line)}")
            source, target = fields
            try:
                label = int(target)
            except ValueError:
                raise DataError(f"{where}: label {target!r} is not an integer") from None
            if not 0 <= label < NUM_CLASSES:
                raise DataError(f"{where}: label {label} is outside [0, {NUM_CLASSES})")
            targets.append(label)
            block.append((line_number, source))
            if len(block) == _BLOCK_ROWS:
                sequences += _encode_block(block, ids, table, path, max_length)
                block = []
    sequences += _encode_block(block, ids, table, path, max_length)
    if not sequences:
        raise DataError(f"ListOps file {path} has no examples (only a header); regenerate it "
                        "or use LRA's release")

    inputs = np.zeros((len(sequences), max_length), dtype=np.int32)
    lengths = np.array([len(s) for s in sequences])
    for row, seq in zip(inputs, sequences):
        row[:len(seq)] = seq
    return {
        "inputs": inputs,
        "mask": np.arange(max_length) < lengths[:, None],
        "targets": np.array(targets, dtype=np.int32),
    }


def _read(data_dir: str, split: str, max_length: int, *,
          drop_close_bracket: bool = False) -> dict[str, np.ndarray]:
    return read_split(data_dir, split, max_length, drop_close_bracket=drop_close_bracket)


# Under `python -m lra.tasks.listops` this file runs as __main__; if the registry later
# imports lra.tasks.listops in the same process, that copy registers the task.
if __name__ != "__main__":
    registry.register(registry.Task(
        name="listops",
        num_classes=NUM_CLASSES,
        vocab_size=VOCAB_SIZE,
        max_length=MAX_LENGTH,
        reader=_read,
        default_data_dir="data/listops",
        how_to_get_data=HOW_TO_GET_DATA,
    ))


# --- command line --------------------------------------------------------------------


def _main() -> None:
    # Flags are defined here, not at import, so importing the task never claims global
    # absl flag names (--seed, --max_length, ...) that a launcher may define too.
    from absl import app, flags

    flags.DEFINE_string("output_dir", None, "Folder for {task}_{train,val,test}.tsv.",
                        required=True)
    flags.DEFINE_integer("num_train_samples", 96000, "Training examples.")
    flags.DEFINE_integer("num_valid_samples", 2000, "Validation examples.")
    flags.DEFINE_integer("num_test_samples", 2000, "Test examples.")
    flags.DEFINE_integer("min_length", 500, "Keep trees with more tokens than this.")
    flags.DEFINE_integer("max_length", 2000, "Keep trees with fewer tokens than this.")
    flags.DEFINE_integer("max_depth", 10, "Maximum nesting depth of the trees.")
    flags.DEFINE_integer("max_args", 10, "Maximum number of arguments of an operator.")
    flags.DEFINE_integer("seed", 0, "Random seed; the same flags give identical files.")
    flags.DEFINE_string("task", "basic", "File name prefix.")
    FLAGS = flags.FLAGS

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        try:
            generate(FLAGS.output_dir, num_train_samples=FLAGS.num_train_samples,
                     num_valid_samples=FLAGS.num_valid_samples,
                     num_test_samples=FLAGS.num_test_samples, min_length=FLAGS.min_length,
                     max_length=FLAGS.max_length, max_depth=FLAGS.max_depth,
                     max_args=FLAGS.max_args, seed=FLAGS.seed, task=FLAGS.task)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    app.run(main)


if __name__ == "__main__":
    _main()
