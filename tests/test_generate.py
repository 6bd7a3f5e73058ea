"""`python -m lra.generate`: sampling from a causal_lm run (lra/generate.py).

One tiny ListOps causal_lm run (and one tiny Image run) is trained per module and shared.
The decoding contract itself (prefill + steps == the parallel forward, every variant) is
tests/models/test_decoding.py's; here: that the generator feeds the right tokens at the
right positions, stops at max_length, writes what a person reads, and that every mistake
is one line.
"""
from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.tasks
from configs import image, listops
from lra import generate, train
from lra.reporting import samples as samples_lib
from tests.test_tasks_train import write_cifar

MAX_LEN = 32


def _train(config, data_dir: str, workdir: str, steps: int) -> str:
    config.data_dir = data_dir
    for key, value in {"num_train_steps": steps, "eval_frequency": steps // 2,
                       "checkpoint_freq": steps // 2, "num_eval_steps": 1,
                       "log_every_steps": steps // 2}.items():
        config[key] = value
    train.train_and_evaluate(config, workdir)
    return workdir


@pytest.fixture(scope="module")
def run(listops_dir, tmp_path_factory):
    """A ListOps causal_lm run (transformer, max_length 32), 8 steps."""
    config = listops.get_config("model=transformer,runlocal,causal,pretrain")
    config.max_length = MAX_LEN
    return _train(config, listops_dir, str(tmp_path_factory.mktemp("run")), 8)


@pytest.fixture
def copy_of(run, tmp_path):
    """A copy of the run's workdir to break."""
    path = str(tmp_path / "copy")
    shutil.copytree(run, path, ignore=shutil.ignore_patterns("samples"))
    return path


def _test_examples(data_dir: str):
    split = lra.tasks.get("listops").load(data_dir, "test", MAX_LEN)
    return split["inputs"], split["mask"].sum(axis=1)


def _restored(workdir: str):
    config, _ = generate.load_config(workdir)
    model = generate.build(config, lra.tasks.get(config.task))
    generate.restore(model, workdir)
    return model


def _greedy_by_parallel_forward(model, prompt, count: int, *, max_len: int, l1: bool,
                                vocab_size: int) -> tuple[list[int], int]:
    """Teacher-free greedy decoding through the parallel forward `model(tokens)` on the
    growing sequence: (the tokens, how many of them are unambiguous). A token whose top
    two logits (or, for l1, whose scaled value and the rounding boundary) are within
    float32 noise of each other is where the comparison stops: either choice is right."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, t, m: nnx.merge(graphdef, state)(t, m, deterministic=True))
    seq = [int(t) for t in prompt]
    clear = None
    for _ in range(count):
        tokens = np.zeros((1, max_len), np.int32)
        tokens[0, :len(seq)] = seq
        mask = np.arange(max_len)[None] < len(seq)
        out = np.asarray(forward(state, tokens, mask))[0, len(seq) - 1]
        if l1:
            scaled = float(np.clip(out, 0, 1)) * (vocab_size - 1)
            token, margin = int(np.round(scaled)), abs(abs(scaled - np.round(scaled)) - 0.5)
        else:
            out = out.copy()
            out[0] = -np.inf  # id 0 is padding, never sampled
            top2 = np.sort(out)[-2:]
            token, margin = int(np.argmax(out)), float(top2[1] - top2[0])
        if margin < 1e-4 and clear is None:
            clear = len(seq) - len(prompt)
        seq.append(token)
    return seq[len(prompt):], count if clear is None else clear


# ----------------------------------------------------------------------------- ListOps


def test_main_writes_samples_whose_prompts_are_the_test_examples(run, listops_dir, tmp_path,
                                                                 capsys):
    out = str(tmp_path / "out")
    assert generate.main(["generate", f"--workdir={run}", "--num_samples=3", "--seed=1",
                          f"--output={out}"]) == 0
    printed = capsys.readouterr().out
    assert "tokens/s" in printed.strip().splitlines()[-1]
    text = open(os.path.join(out, "samples.txt"), encoding="utf-8").read()
    entries = [line for line in text.splitlines() if line.startswith("sample ")]
    assert len(entries) == 3
    models = [line for line in text.splitlines() if line.startswith("  model:")]
    originals = [line for line in text.splitlines() if line.startswith("  original:")]
    inputs, lengths = _test_examples(listops_dir)
    mark = f" {samples_lib.PROMPT_MARK} "
    for n in range(3):
        # The default prompt: half of each example, at least one token.
        p = max(1, int(lengths[n]) // 2)
        prompt = samples_lib.tokens_to_text("listops", inputs[n, :p])
        rest = samples_lib.tokens_to_text("listops", inputs[n, p:lengths[n]])
        assert models[n].split(":", 1)[1].strip().startswith(prompt + mark)
        assert originals[n].split(":", 1)[1].strip() == prompt + mark + rest
        # Every row runs to max_length (no --max_new_tokens), in the vocabulary's words.
        generated = models[n].split(mark, 1)[1].split(" ")
        assert len(generated) == MAX_LEN - p
        assert set(generated) <= set(listops_vocab())
    assert "samples.txt" in printed and "sample 3/3" in printed


def listops_vocab():
    from lra.tasks.listops import VOCAB

    return VOCAB


def test_greedy_is_repeatable_and_is_the_parallel_forwards_argmax(run, tmp_path):
    first = generate.generate(run, num_samples=3, temperature=0, output=str(tmp_path / "a"))
    again = generate.generate(run, num_samples=3, temperature=0, output=str(tmp_path / "b"))
    for a, b in zip(first["samples"], again["samples"]):
        np.testing.assert_array_equal(a["generated"], b["generated"])
    assert (open(first["path"], encoding="utf-8").read()
            == open(again["path"], encoding="utf-8").read())
    # The scan samples from the right positions: the same tokens as argmax through the
    # parallel forward on the growing sequence, for two rows of different prompt lengths
    # (each row steps from its own position).
    model = _restored(run)
    assert len(first["samples"][0]["prompt"]) != len(first["samples"][1]["prompt"])
    vocab = lra.tasks.get("listops").vocab_size
    for s in (first["samples"][0], first["samples"][1]):
        expected, clear = _greedy_by_parallel_forward(
            model, s["prompt"], len(s["generated"]), max_len=MAX_LEN, l1=False,
            vocab_size=vocab)
        assert clear >= 5
        assert list(s["generated"][:clear]) == expected[:clear]


def test_stop_token_ends_each_row_at_its_first_stop(run, tmp_path):
    """Issue 74 section 3: --stop_token (the task's text of a token, or id:N) cuts each
    row after the first such token it samples, and says so; other rows run on."""
    from lra.tasks.listops import VOCAB

    full = generate.generate(run, num_samples=3, temperature=0, output=str(tmp_path / "a"))
    row = full["samples"][0]["generated"]
    assert len(row) > 2
    stop_id = int(row[1])  # a token the greedy row samples second (maybe also first)
    for spec in (VOCAB[stop_id - 1], f"id:{stop_id}"):
        cut = generate.generate(run, num_samples=3, temperature=0, stop_token=spec,
                                output=str(tmp_path / "b"))
        for whole, s in zip(full["samples"], cut["samples"]):
            hits = np.flatnonzero(whole["generated"] == stop_id)
            end = int(hits[0]) + 1 if len(hits) else len(whole["generated"])
            np.testing.assert_array_equal(s["generated"], whole["generated"][:end])
            assert ("stopped at the stop token" in s["stop"]) == bool(len(hits))
        assert len(cut["samples"][0]["generated"]) <= 2
        assert "stopped at the stop token" in open(cut["path"], encoding="utf-8").read()


def test_sampler_temperatures_tiny_huge_and_infinite():
    """Issue 46, item 4: 1e-45 is greedy (it overflowed logits / T: garbage), inf draws
    uniformly among the allowed tokens (it gave the padding id every time), padding is
    never drawn at any temperature, and T = 1 draws from softmax(logits)."""
    vocab = 6
    logits_1xV = jnp.array([[0.0, 3.0, 1.0, -2.0, 0.5, 2.5]])  # 0 is padding
    keys = jax.random.split(jax.random.key(0), 4000)

    def draws(temperature, top_k=0):
        sample = generate.make_sampler(lm_loss="xent", vocab_size=vocab,
                                       temperature=temperature, top_k=top_k, pad_id=0)
        return np.asarray(jax.vmap(lambda k: sample(logits_1xV, k)[0])(keys))

    for tiny in (1e-45, 1e-7, 1e-20):
        assert set(draws(tiny)) == {1}, tiny
    uniform = np.bincount(draws(float("inf")), minlength=vocab) / len(keys)
    assert uniform[0] == 0 and np.all(np.abs(uniform[1:] - 0.2) < 0.03), uniform
    assert set(draws(float("inf"), top_k=2)) == {1, 5}
    assert 0 not in draws(1e30)  # dividing, not multiplying: no overflow to inf
    freq = np.bincount(draws(1.0), minlength=vocab) / len(keys)
    p = np.exp(np.asarray(logits_1xV[0, 1:]))
    np.testing.assert_allclose(freq[1:], p / p.sum(), atol=0.03)
    half = np.bincount(draws(0.5), minlength=vocab) / len(keys)  # logits + T g branch
    p = np.exp(2 * np.asarray(logits_1xV[0, 1:]))
    np.testing.assert_allclose(half[1:], p / p.sum(), atol=0.03)


def test_top_k_1_is_greedy_and_seeds_differ(run, tmp_path):
    greedy = generate.generate(run, num_samples=2, temperature=0, output=str(tmp_path / "g"))
    top1 = generate.generate(run, num_samples=2, temperature=2.0, top_k=1, seed=3,
                             output=str(tmp_path / "k"))
    for a, b in zip(greedy["samples"], top1["samples"]):
        np.testing.assert_array_equal(a["generated"], b["generated"])
    seeds = [generate.generate(run, num_samples=2, temperature=1.0, seed=s,
                               output=str(tmp_path / f"s{s}")) for s in (0, 1)]
    assert any(not np.array_equal(a["generated"], b["generated"])
               for a, b in zip(seeds[0]["samples"], seeds[1]["samples"]))
    assert all(0 not in s["generated"] for r in seeds for s in r["samples"])  # no padding


def test_max_new_tokens_is_capped_at_max_length_per_row(run, tmp_path, capsys):
    full = generate.generate(run, num_samples=3, temperature=0, max_new_tokens=1000,
                             prompt_len=10, output=str(tmp_path / "f"))
    err = capsys.readouterr().err.strip().splitlines()
    # Rows of different prompt lengths (examples shorter than 10 tokens are whole prompts),
    # so each row stops at its own step.
    prompts = [len(s["prompt"]) for s in full["samples"]]
    assert len(set(prompts)) > 1
    assert err == [f"warning: --prompt_len=10: {sum(p < 10 for p in prompts)} of the test "
                   "examples are shorter; their prompt is the whole example",
                   "warning: --max_new_tokens=1000 goes past max_length=32 for 3 of 3 "
                   "samples; they stop there (new tokens: "
                   f"{', '.join(str(MAX_LEN - p) for p in prompts)})"]
    for s in full["samples"]:
        assert len(s["prompt"]) + len(s["generated"]) == MAX_LEN
        assert "stopped at max_length 32" in s["stop"]
    # No row was fed a position past max_length - 1: each cache holds its prompt and every
    # new token but the last (never fed), however many steps the scan ran for longer rows.
    held = full["timing"]["tokens_held_B"]
    np.testing.assert_array_equal(held, [MAX_LEN - 1] * 3)
    # Rows that stop early keep their tokens: a shorter request is a prefix of the longer.
    short = generate.generate(run, num_samples=3, temperature=0, max_new_tokens=3,
                              prompt_len=10, output=str(tmp_path / "s"))
    np.testing.assert_array_equal(short["timing"]["tokens_held_B"],
                                  [p + 3 - 1 for p in prompts])
    for a, b in zip(short["samples"], full["samples"]):
        assert len(a["generated"]) == 3
        np.testing.assert_array_equal(a["generated"], b["generated"][:3])
    assert "--max_new_tokens" not in capsys.readouterr().err


def test_a_run_without_results_json_uses_its_last_checkpoint(copy_of, tmp_path):
    os.remove(os.path.join(copy_of, "results.json"))  # still training, or interrupted
    result = generate.generate(copy_of, num_samples=1, max_new_tokens=2,
                               output=str(tmp_path / "o"))
    assert "no results.json yet" in result["config_from"]
    assert len(result["samples"][0]["generated"]) == 2


def test_a_corrupt_best_checkpoint_falls_back_to_the_last_in_one_line(copy_of, tmp_path,
                                                                     capsys):
    best = os.path.join(copy_of, "checkpoints", "best")
    step = max(int(s) for s in os.listdir(best))
    _flip_a_byte(os.path.join(best, str(step)))
    assert generate.main(["generate", f"--workdir={copy_of}", "--num_samples=1",
                          "--max_new_tokens=2", f"--output={tmp_path / 'o'}"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: best step {step}: ")
    assert "using the last checkpoint of step" in err[0]


def _flip_a_byte(folder: str) -> None:
    """Flips one byte of the largest file below `folder` (its arrays)."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs]
    path = max(files, key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


# ----------------------------------------------------------------------------- one line


def _one_line_error(argv, capsys) -> str:
    assert generate.main(["generate", *argv]) == generate.EXIT_USER_ERROR
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.mark.parametrize("flag,message", [
    ("--num_samples=0", "--num_samples=0: give at least 1"),
    ("--temperature=-0.5", "--temperature=-0.5: give 0 (greedy, argmax), a positive"),
    ("--temperature=nan", "--temperature=nan: give 0 (greedy, argmax), a positive"),
    ("--top_k=-1", "--top_k=-1: give 0"),
    ("--prompt_len=0", "--prompt_len=0: a prompt needs at least 1 token (the model has no "
                       "start token"),
    ("--prompt_len=-3", "a prompt needs at least 1 token"),
    (f"--prompt_len={MAX_LEN}", f"--prompt_len={MAX_LEN} leaves no room to generate: the "
                                f"run's max_length is {MAX_LEN}; give at most {MAX_LEN - 1}"),
    ("--prompt_len=500", "--prompt_len=500 leaves no room to generate"),
    ("--max_new_tokens=0", "--max_new_tokens=0: give at least 1"),
    ("--no_such_flag=1", "Unknown command line flag 'no_such_flag'"),
    ("--stop_token=xyz", "--stop_token=xyz: not a ListOps token; give one of"),
    ("--stop_token=id:999", "--stop_token=id:999: give id:N with 0 <= N < "),
])
def test_bad_flags_are_one_line(run, flag, message, capsys):
    assert message in _one_line_error([f"--workdir={run}", flag], capsys)


def test_bad_workdirs_are_one_line(tmp_path, capsys):
    assert "--workdir is required" in _one_line_error([], capsys)
    missing = str(tmp_path / "missing")
    line = _one_line_error([f"--workdir={missing}"], capsys)
    assert f"--workdir={missing}: no such folder" in line and "causal,pretrain" in line
    line = _one_line_error([f"--workdir={tmp_path}"], capsys)
    assert "holds no results.json and no readable checkpoint" in line


def test_a_run_without_checkpoints_is_one_line(copy_of, capsys):
    shutil.rmtree(os.path.join(copy_of, "checkpoints"))
    line = _one_line_error([f"--workdir={copy_of}"], capsys)
    assert "holds no checkpoints" in line


def test_every_checkpoint_corrupt_is_one_line(copy_of, capsys):
    for kind in ("best", "last"):
        folder = os.path.join(copy_of, "checkpoints", kind)
        for step in os.listdir(folder):
            _flip_a_byte(os.path.join(folder, step))
    line = _one_line_error([f"--workdir={copy_of}"], capsys)
    assert f"no checkpoint of {copy_of} can be used (best step" in line


@pytest.mark.parametrize("objective", ["classify", "mlm"])
def test_a_run_that_is_not_causal_lm_is_one_line(copy_of, objective, capsys):
    path = os.path.join(copy_of, "results.json")
    results = json.load(open(path))
    results["config"]["objective"] = objective
    results["config"]["causal"] = False
    json.dump(results, open(path, "w"))
    line = _one_line_error([f"--workdir={copy_of}"], capsys)
    assert f"is a run with objective {objective!r}; generation needs a causal_lm run" in line
    assert "--config=configs/listops.py:model=transformer,causal,pretrain" in line


@pytest.mark.parametrize("task", ["flipflop", "state_tracking", "niah", "mqar", "mad"])
def test_a_synthetic_tasks_run_points_at_a_setting_that_exists(task):
    """The synthetic tasks label positions and refuse `causal,pretrain`: the line used to
    suggest configs/flipflop.py:model=gla,causal,pretrain, which launch.py refuses. Now it
    names a language-model config that builds."""
    import ml_collections

    from configs import enwik8
    from lra.errors import ConfigError

    config = ml_collections.ConfigDict({"objective": "sequence_labels", "task": task,
                                        "model": "gla"})
    with pytest.raises(ConfigError) as e:
        generate.check_run(config, "/runs/x")
    assert f"configs/{task}.py has no causal,pretrain setting" in str(e.value)
    assert "--config=configs/enwik8.py:model=gla,mini" in str(e.value)
    assert enwik8.get_config("model=gla,mini").objective == "causal_lm"


def test_a_model_that_cannot_decode_is_one_line(run, monkeypatch, capsys):
    from models.decoding import DecodingError
    from models.pretrain import TokenPredictor

    def cannot(self):
        raise DecodingError("the 'sequential' stack has no decoding form")

    monkeypatch.setattr(TokenPredictor, "check_decodes", cannot)
    line = _one_line_error([f"--workdir={run}"], capsys)
    assert line == ("error: model 'transformer' cannot generate: the 'sequential' stack has "
                    "no decoding form")


# ----------------------------------------------------------------------------- text, pixels


def test_bytes_are_decoded_as_the_text_tasks_tokenizer_wrote_them():
    from lra.tasks.text import encode_bytes

    ids, mask = encode_bytes(["héllo <br />\tok".encode()], 40)
    assert samples_lib.tokens_to_text("text", ids[0][mask[0]]) == "héllo <br />\\tok"
    # enwik8's and text8's readers' ids (lra/tasks/enwik8.py), read back as their text.
    from lra.tasks import enwik8
    raw = "<page>Zürich</page>".encode()
    assert samples_lib.tokens_to_text("enwik8", enwik8.encode(raw, "enwik8")) == "<page>Zürich</page>"
    assert samples_lib.tokens_to_text("text8", enwik8.encode(b"the cat", "text8")) == "the cat"


def test_png_grid_size_and_cells():
    rows = [[np.full((32, 32), v, np.uint8) for v in (0, 100, 200)] for _ in range(2)]
    grid = samples_lib.png_grid(rows)
    # 32 pixels scaled by 3 (>= 96), 4-pixel white gaps around and between the cells.
    assert grid.shape == (2 * 96 + 3 * 4, 3 * 96 + 4 * 4)
    assert grid[4 + 96 + 4 + 10, 4 + 96 + 4 + 10] == 100  # row 2, column 2
    assert grid[0, 0] == 255


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """An Image causal_lm run (runlocal sizes, 1024 pixels, L1 head), 2 steps."""
    root = tmp_path_factory.mktemp("cifar")
    write_cifar(root, np.random.default_rng(0))
    config = image.get_config("model=transformer,runlocal,causal,pretrain")
    config.task_options.validation = "test"
    return _train(config, str(root), str(tmp_path_factory.mktemp("image_run")), 2)


def test_image_run_writes_a_png_grid_and_follows_the_parallel_forward(image_run, tmp_path):
    from PIL import Image

    result = generate.generate(image_run, num_samples=2, output=str(tmp_path))
    assert result["path"] == str(tmp_path / "samples.png")
    with Image.open(result["path"]) as png:
        assert png.size == (3 * 96 + 4 * 4, 2 * 96 + 3 * 4)  # (width, height)
        pixels = np.asarray(png)
    for k, s in enumerate(result["samples"]):
        # Half the image given, the other half generated, to the image's last pixel.
        assert len(s["prompt"]) == len(s["generated"]) == 512

        def cell(c):  # column c of row k, back at one pixel per image pixel
            return pixels[4 + k * 100:4 + k * 100 + 96:3, 4 + c * 100:4 + c * 100 + 96:3]

        original = np.concatenate([s["prompt"], s["original"]]).reshape(32, 32)
        np.testing.assert_array_equal(cell(0), original)
        assert np.all(cell(1)[16:] == samples_lib.BLANK)
        np.testing.assert_array_equal(cell(2)[16:], s["generated"].reshape(16, 32))
    s = result["samples"][0]
    expected, clear = _greedy_by_parallel_forward(
        _restored(image_run), s["prompt"], 8, max_len=1024, l1=True, vocab_size=256)
    assert clear >= 4 and list(s["generated"][:clear]) == expected[:clear]


def test_stop_token_ids_per_task():
    from lra.tasks.text import BYTE_OFFSET

    assert generate.token_id("text", 257, "\n", False) == ord("\n") + BYTE_OFFSET
    assert generate.token_id("enwik8", 257, "id:5", False) == 5
    assert generate.token_id("text8", 28, " ", False) == 27
    for task, token in (("text", "é"), ("text8", "A")):
        with pytest.raises(generate.FlagError, match="--stop_token="):
            generate.token_id(task, 257, token, False)
    with pytest.raises(generate.FlagError, match="end with their image"):
        generate.token_id("image", 256, "id:1", True)
