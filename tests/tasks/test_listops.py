"""ListOps: generator semantics against LRA's real data, reader format and errors, registry."""
from __future__ import annotations

import collections
import csv
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

import lra.tasks
from lra.errors import ConfigError, DataError
from lra.tasks import listops

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL_SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data",
                           "listops_real_sample.tsv")
ID = {token: i + 1 for i, token in enumerate(["0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
                                              "[MIN", "[MAX", "[MED", "[SM", "]"])}
SMALL = dict(num_train_samples=200, num_valid_samples=20, num_test_samples=20, min_length=10,
             max_length=60, max_depth=5, max_args=10, verbose=False)


# --- an evaluator of the text form, independent of the module's tree code -------------


def parse(source: str) -> tuple[int | tuple, int]:
    """Returns (node, length): a node is a digit or (op, [children]); length omits parens."""
    stack: list[tuple[str, list]] = []
    root = None
    length = 0
    for token in source.split():
        if token in ("(", ")"):
            continue
        length += 1
        if token.startswith("["):
            stack.append((token, []))
            continue
        node = stack.pop() if token == "]" else int(token)
        if stack:
            stack[-1][1].append(node)
        else:
            assert root is None, f"two roots in {source!r}"
            root = node
    assert not stack and root is not None, f"unbalanced expression {source!r}"
    return root, length


def value(node) -> int:
    if isinstance(node, int):
        return node
    op, children = node
    args = [value(c) for c in children]
    return {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)),
            "[SM": lambda a: sum(a) % 10}[op](args)


def token_ids(source: str) -> list[int]:
    return [ID[t] for t in source.split() if t not in ("(", ")")]


def read_rows(path: str) -> list[tuple[str, int]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert rows[0] == ["Source", "Target"]
    return [(source, int(target)) for source, target in rows[1:]]


def write(tmp_path, text: str, name: str = "basic_train.tsv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("listops"))
    listops.generate(out, **SMALL)
    return out


# --- the real LRA sample ---------------------------------------------------------------


@pytest.fixture
def real_dir(tmp_path) -> str:
    shutil.copy(REAL_SAMPLE, tmp_path / "basic_test.tsv")
    return str(tmp_path)


def test_real_sample_reads_with_its_labels_and_tokens(real_dir):
    rows = read_rows(REAL_SAMPLE)
    data = listops.read_split(real_dir, "test", 2000)
    assert data["inputs"].dtype == np.int32 and data["targets"].dtype == np.int32
    assert data["mask"].dtype == bool and data["inputs"].shape == (10, 2000)
    np.testing.assert_array_equal(data["targets"], [label for _, label in rows])
    assert list(data["targets"][:2]) == [7, 6]
    # [MAX 4 [MIN 4 4 6 9 0 0 ] 5 [MED ...
    assert list(data["inputs"][0, :12]) == [12, 5, 11, 5, 5, 7, 10, 1, 1, 15, 6, 13]
    for i, (source, _) in enumerate(rows):
        expected = token_ids(source)
        n = len(expected)
        assert list(data["inputs"][i, :n]) == expected
        assert data["mask"][i, :n].all() and not data["mask"][i, n:].any()
        assert not data["inputs"][i, n:].any()


def test_drop_close_bracket_reproduces_lra_tokens(real_dir):
    kept = listops.read_split(real_dir, "test", 2000)
    dropped = listops.read_split(real_dir, "test", 2000, drop_close_bracket=True)
    assert not (dropped["inputs"] == ID["]"]).any()
    for i, (source, _) in enumerate(read_rows(REAL_SAMPLE)):
        # LRA's alphanumeric tokenizer: words only, so '(' ')' ']' vanish.
        words = [t for t in source.split() if t not in ("(", ")", "]")]
        assert list(dropped["inputs"][i, :dropped["mask"][i].sum()]) == [ID[t] for t in words]
        assert kept["mask"][i].sum() - dropped["mask"][i].sum() == source.split().count("]")


def test_real_sample_labels_match_our_semantics():
    for source, label in read_rows(REAL_SAMPLE):
        assert value(parse(source)[0]) == label, source


def test_to_string_writes_the_real_sample_byte_for_byte():
    def to_tree(node):  # back to LRA's nested pairs: (((op, c0), c1), ..., END)
        if isinstance(node, int):
            return node
        op, children = node
        t = (op, to_tree(children[0]))
        for child in children[1:]:
            t = (t, to_tree(child))
        return (t, listops.END)

    for source, _ in read_rows(REAL_SAMPLE):
        assert listops.to_string(to_tree(parse(source)[0])) == source


def test_evaluate_and_to_string_agree_with_the_text_form():
    rng = random.Random(1)
    for _ in range(300):
        tree, length = listops.generate_tree(1, 5, 6, rng)
        node, text_length = parse(listops.to_string(tree))
        assert listops.evaluate(tree) == value(node)
        assert length == text_length


def test_median_truncates_like_numpy():
    rng = random.Random(0)
    for _ in range(500):
        args = [rng.randrange(10) for _ in range(rng.randint(2, 10))]
        assert listops.apply_operator(listops.MED, args) == int(np.median(args))


# --- generator -------------------------------------------------------------------------


def test_generated_files_are_well_formed(small_data):
    seen = set()
    counts = {"train": 200, "val": 20, "test": 20}
    for split, count in counts.items():
        path = os.path.join(small_data, f"basic_{split}.tsv")
        with open(path) as f:
            assert f.readline() == "Source\tTarget\n"
        rows = read_rows(path)
        assert len(rows) == count
        for source, label in rows:
            node, length = parse(source)
            assert 10 < length < 60
            assert isinstance(node, tuple)
            assert value(node) == label
            assert source.startswith("( ") and source.endswith(" ] )") and "  " not in source
            seen.add(source)
    assert len(seen) == sum(counts.values())  # no duplicates within or across splits


def test_same_seed_same_bytes_other_seed_differs(tmp_path, small_data):
    again = listops.generate(str(tmp_path / "a"), **SMALL)
    other = listops.generate(str(tmp_path / "b"), **{**SMALL, "seed": 1})
    for split in ("train", "val", "test"):
        reference = open(os.path.join(small_data, f"basic_{split}.tsv"), "rb").read()
        assert open(again[split], "rb").read() == reference
        assert open(other[split], "rb").read() != reference


def test_command_line_matches_generate(tmp_path):
    args = dict(num_train_samples=30, num_valid_samples=5, num_test_samples=5, min_length=10,
                max_length=40, max_depth=4, seed=3)
    flags = [f"--{k}={v}" for k, v in args.items()]
    # A fixed, unusual hash seed: output must not depend on set/dict hashing.
    env = {**os.environ, "PYTHONPATH": REPO, "PYTHONHASHSEED": "123"}
    out = tmp_path / "cli"
    result = subprocess.run([sys.executable, "-m", "lra.tasks.listops", f"--output_dir={out}",
                             "--task=mytask", *flags], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "wrote 40 trees" in result.stdout
    expected = listops.generate(str(tmp_path / "api"), task="mytask", verbose=False, **args)
    for split, path in expected.items():
        assert open(out / f"mytask_{split}.tsv", "rb").read() == open(path, "rb").read()

    bad = subprocess.run([sys.executable, "-m", "lra.tasks.listops", f"--output_dir={out}",
                          "--min_length=100", "--max_length=50"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert "--min_length=100" in bad.stderr and "Traceback" not in bad.stderr


def test_output_dir_that_is_a_file_is_refused_before_generating(tmp_path, monkeypatch):
    """--output_dir naming a file (or below one) is a one-line error, found before any
    tree is drawn (it was a FileExistsError traceback after generating everything)."""
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    monkeypatch.setattr(listops, "generate_tree",
                        lambda *a, **k: pytest.fail("generated before checking the folder"))
    for out, detail in [(a_file, "is a file, not a folder"),
                        (a_file / "sub", "cannot create")]:
        with pytest.raises(ConfigError, match=detail) as info:
            listops.generate(str(out), **SMALL)
        assert str(out) in str(info.value)
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.run([sys.executable, "-m", "lra.tasks.listops", f"--output_dir={a_file}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"error: --output_dir={a_file} is a file, not a folder; "
                                   "give a folder (it is created if missing)")
    assert a_file.read_text() == "not a folder"


def test_tree_distribution_matches_value_p_and_max_args():
    # max_depth=3: nodes at depths 1-2 are drawn (operator with p=0.25), depth 3 is a digit.
    rng = random.Random(0)
    max_args = 5
    drawn = leaves = 0
    arity = collections.Counter()
    operators = collections.Counter()

    def visit(node, depth):
        nonlocal drawn, leaves
        if depth < 3:
            drawn += 1
            leaves += isinstance(node, int)
        else:
            assert isinstance(node, int)
        if isinstance(node, tuple):
            arity[len(node[1])] += 1
            operators[node[0]] += 1
            for child in node[1]:
                visit(child, depth + 1)

    for _ in range(6000):
        tree, _ = listops.generate_tree(1, 3, max_args, rng)
        visit(parse(listops.to_string(tree))[0], 1)
    assert abs(leaves / drawn - 0.75) < 0.015, leaves / drawn
    assert set(arity) == set(range(2, max_args + 1))
    total = sum(arity.values())
    for count in list(arity.values()) + list(operators.values()):
        assert abs(count / total - 0.25) < 0.04  # 4 arities (2..5) and 4 operators, uniform


@pytest.mark.parametrize("overrides, flag", [
    (dict(min_length=60, max_length=60), "--max_length"),
    (dict(min_length=10, max_length=11), "--max_length"),
    (dict(max_depth=0), "--max_depth"),
    (dict(max_args=1), "--max_args"),
    (dict(max_depth=2, max_args=3, min_length=10), "--max_depth"),  # trees have <= 5 tokens
    (dict(num_train_samples=-1), "--num_train_samples"),
])
def test_impossible_parameters_are_refused(tmp_path, overrides, flag):
    with pytest.raises(ConfigError, match=flag):
        listops.generate(str(tmp_path), **{**SMALL, **overrides})
    assert not os.listdir(tmp_path)


def test_exhausted_window_warns_then_stops(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(listops, "WARN_ATTEMPTS_WITHOUT_PROGRESS", 1000)
    monkeypatch.setattr(listops, "MAX_ATTEMPTS_WITHOUT_PROGRESS", 5000)
    # max_depth=1: every tree is a single digit, so only 10 distinct trees exist.
    args = {**SMALL, "max_depth": 1, "min_length": 0, "max_length": 2, "verbose": True}
    with pytest.raises(ConfigError, match="found only 10 of 240.*--min_length/--max_length"):
        listops.generate(str(tmp_path), **args)
    assert "warning: 1000 draws without a new tree" in capsys.readouterr().out


# --- reader ----------------------------------------------------------------------------


def test_reader_matches_generated_rows_across_blocks(small_data, monkeypatch):
    data = listops.read_split(small_data, "train", 64)
    rows = read_rows(os.path.join(small_data, "basic_train.tsv"))
    np.testing.assert_array_equal(data["targets"], [label for _, label in rows])
    for i, (source, _) in enumerate(rows):
        n = parse(source)[1]
        assert list(data["inputs"][i, :n]) == token_ids(source)
        assert data["mask"][i].sum() == n
    # Small blocks exercise block boundaries of the vectorised path.
    monkeypatch.setattr(listops, "_BLOCK_ROWS", 7)
    small_blocks = listops.read_split(small_data, "train", 64)
    for key in data:
        np.testing.assert_array_equal(small_blocks[key], data[key])


def test_irregular_whitespace_reads_like_the_canonical_form(tmp_path):
    canonical = "( ( ( [MAX 4 ) ( ( ( [SM 1 ) 9 ) ] ) ) ] )"
    messy = "  (  ( ( [MAX\t4 ) ( ( ( [SM 1 ) 9 )  ] ) ) ] ) ".replace("\t", " \x0b ")
    write(tmp_path, f"Source\tTarget\n{canonical}\t4\n{messy}\t4\n\n")
    data = listops.read_split(str(tmp_path), "train", 10)
    assert list(data["inputs"][0, :6]) == [12, 5, 14, 2, 10, 15]
    np.testing.assert_array_equal(data["inputs"][0], data["inputs"][1])
    assert len(data["targets"]) == 2  # the trailing blank line is skipped


def test_truncation_and_padding(tmp_path):
    long = "( ( ( ( ( ( ( ( ( [SM 1 ) 2 ) 3 ) 4 ) 5 ) 6 ) 7 ) 8 ) ] )"  # 10 tokens
    write(tmp_path, f"Source\tTarget\n{long}\t6\n( ( ( [MIN 3 ) 2 ) ] )\t2\n")
    data = listops.read_split(str(tmp_path), "train", 6)
    assert data["inputs"].shape == (2, 6)
    assert list(data["inputs"][0]) == [14, 2, 3, 4, 5, 6] and data["mask"][0].all()
    assert list(data["inputs"][1]) == [11, 4, 3, 15, 0, 0]
    assert list(data["mask"][1]) == [True] * 4 + [False] * 2


def test_missing_data_says_how_to_get_it(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(DataError, match="nowhere.*python -m lra.tasks.listops.*python -m lra.download listops"):
        listops.read_split(missing, "train", 10)
    with pytest.raises(DataError, match="basic_val.tsv does not exist.*lra.download"):
        listops.read_split(str(tmp_path), "val", 10)


GOOD = "( ( ( [MIN 3 ) 2 ) ] )"


@pytest.mark.parametrize("text, where, detail", [
    ("Source,Target\n", ":1:", "expected the header"),
    (f"Source\tTarget\n{GOOD}\t2\n{GOOD} 2\n", ":3:", "got 1"),
    (f"Source\tTarget\n{GOOD}\t2\tx\n", ":2:", "got 3"),
    (f"Source\tTarget\n{GOOD}\ttwo\n", ":2:", "label 'two' is not an integer"),
    (f"Source\tTarget\n{GOOD}\t12\n", ":2:", r"label 12 is outside \[0, 10\)"),
    (f"Source\tTarget\n{GOOD}\t2\n( ( [MIN 3 ) [FOO ] )\t2\n", ":3:", "unknown token '\\[FOO'"),
    (f"Source\tTarget\n( ( [MIN 3 ) a ] )\t2\n", ":2:", "unknown token 'a'"),
    (f"Source\tTarget\n( ( [MIN 3 ) 12 ] )\t2\n", ":2:", "unknown token '12'"),
    (f"Source\tTarget\n( )\t2\n", ":2:", "no tokens"),
])
def test_malformed_lines_name_file_and_line(tmp_path, text, where, detail):
    path = write(tmp_path, text)
    with pytest.raises(DataError, match=detail) as error:
        listops.read_split(str(tmp_path), "train", 10)
    assert f"{path}{where}" in str(error.value) and "\n" not in str(error.value)


def test_header_only_file_is_an_error(tmp_path):
    path = write(tmp_path, "Source\tTarget\n")
    with pytest.raises(DataError, match="no examples") as error:
        listops.read_split(str(tmp_path), "train", 10)
    assert path in str(error.value)


# --- registry --------------------------------------------------------------------------


def test_registered_task_reads_with_defaults(small_data):
    task = lra.tasks.get("listops")
    assert (task.num_classes, task.vocab_size, task.max_length) == (10, 16, 2000)
    assert listops.VOCAB_SIZE == len(listops.VOCAB) + 1 == 16
    assert task.how_to_get_data and "\n" not in task.how_to_get_data
    data = task.load(small_data, "val", 64)
    direct = listops.read_split(small_data, "val", 64)
    np.testing.assert_array_equal(data["inputs"], direct["inputs"])


def test_unknown_task_lists_available():
    with pytest.raises(ConfigError, match="listops"):
        lra.tasks.get("nope")
