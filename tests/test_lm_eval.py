"""lra.lm_eval: every target of the split scored exactly once under each context; the three
contexts as forms of one computation (sliding at stride L - 1 is the window rows, the
stream read token by token over pieces of L tokens is the window rows' parallel forward),
through a configs/enwik8.py:runlocal run trained on real Wikipedia bytes; which variants
may stream; one-line errors."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from lra import lm_eval
from lra.errors import ConfigError, DataError

SLICE_DIR = os.path.join(os.path.dirname(__file__), "data", "enwik8_slice")


@pytest.mark.parametrize("num_tokens,length,stride", [
    (1200, 32, 16), (1200, 32, 31), (1200, 32, 1), (33, 32, 16), (20, 32, 16), (2, 32, 7),
    (1000, 17, 5)])
def test_sliding_windows_score_every_target_once(num_tokens, length, stride):
    starts, scored_from, ends = lm_eval.sliding_windows(num_tokens, length, stride)
    scored = np.concatenate([np.arange(a, e) for a, e in zip(scored_from, ends)])
    np.testing.assert_array_equal(scored, np.arange(1, num_tokens))
    assert np.all(ends - starts <= length)
    # After the first window a target sees at least L - stride tokens before it.
    assert np.all(scored_from[1:] - starts[1:] == length - stride)
    ids = np.arange(1, num_tokens + 1)
    _, _, weight = lm_eval.window_batches(ids, starts, scored_from, ends, length)
    assert weight.sum() == num_tokens - 1


def test_stride_out_of_range_is_one_line():
    with pytest.raises(lm_eval.FlagError, match="--stride=32"):
        lm_eval.sliding_windows(100, 32, 32)


@pytest.fixture(scope="module")
def gla_run(tmp_path_factory):
    from configs import enwik8 as config
    from lra import train

    workdir = str(tmp_path_factory.mktemp("gla_run"))
    c = config.get_config("model=gla,runlocal")
    c.data_dir = SLICE_DIR
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 6, 6, 6
    c.eval_lengths = "64"  # length extrapolation in bits per byte (lra.length_report)
    train.train_and_evaluate(c, workdir)
    return workdir


def test_contexts_agree_where_they_are_one_computation(gla_run):
    """The slice's test split: 1,200 bytes, 1,199 targets. Rows of L = 32 overlapping by
    one are 39; 39 streams read pieces of 32 tokens: the same rows, token by token."""
    saved = json.load(open(os.path.join(gla_run, "results.json")))
    window = lm_eval.evaluate_run(gla_run, contexts=("window",), quiet=True)
    assert window["contexts"]["window"]["targets"] == 1199
    np.testing.assert_allclose(window["contexts"]["window"]["bits_per_token"],
                               saved["test_bits_per_token"], rtol=1e-5)
    same = lm_eval.evaluate_run(gla_run, contexts=("sliding", "stream"), stride=31,
                                streams=39, quiet=True)["contexts"]
    assert same["stream"]["piece"] == 32 and same["stream"]["streams"] == 39
    for context in ("sliding", "stream"):
        np.testing.assert_allclose(same[context]["bits_per_token"],
                                   saved["test_bits_per_token"], rtol=1e-5, err_msg=context)
        np.testing.assert_allclose(same[context]["accuracy"], saved["test_accuracy"],
                                   atol=1e-6, err_msg=context)
    # The defaults see more context: a different number, every target still once.
    longer = lm_eval.evaluate_run(gla_run, contexts=("sliding", "stream"), streams=4,
                                  quiet=True)["contexts"]
    assert longer["sliding"]["stride"] == 16 and longer["sliding"]["targets"] == 1199
    assert longer["stream"]["piece"] == 301 and longer["stream"]["targets"] == 1199
    assert longer["stream"]["bits_per_token"] != pytest.approx(
        same["stream"]["bits_per_token"], rel=1e-6)
    written = json.load(open(os.path.join(gla_run, "lm_eval.json")))
    assert set(written["test"]) == {"window", "sliding", "stream"}  # merged
    assert written["model"] == "gla" and written["num_params"] == saved["num_params"]
    # The data it read, recorded: an excerpt, not the published zip.
    assert written["data"]["published"] is False and written["data"]["bytes"] < 10**8


def test_transformer_xl_segment_memory_streams_as_its_parallel_form():
    """Transformer-XL's memory carried token by token over pieces of L tokens equals its
    parallel form over the same rows (an untrained model of the runlocal config)."""
    from configs import enwik8 as config
    from lra import train
    from lra.tasks import enwik8
    import lra.tasks

    c = config.get_config("model=transformer_xl,runlocal")
    assert lm_eval.can_stream(c) is None
    model = train.build_model(c, lra.tasks.get("enwik8"))
    ids = enwik8.split_ids("enwik8", SLICE_DIR, "test")[:400]
    length = c.max_length
    streams = -(-(len(ids) - 1) // (length - 1))
    stream = lm_eval.score_stream(model, ids, streams)
    assert stream["piece"] == length
    starts = np.arange(0, len(ids) - 1, length - 1)
    ends = np.minimum(starts + length, len(ids))
    windows = lm_eval.score_windows(
        model, *lm_eval.window_batches(ids, starts, starts + 1, ends, length), batch=8)
    assert stream["targets"] == windows["targets"] == len(ids) - 1
    np.testing.assert_allclose(stream["bits"], windows["bits"], rtol=1e-5)


@pytest.mark.parametrize("arg,why", [
    ("model=transformer", "kv_cache"),
    ("model=linear", "pos_emb 'learned'"),
    ("model=linformer", "'none'"),
    ("model=gla,hybrid=transformer", "transformer's decoding form"),
])
def test_which_runs_cannot_stream(arg, why):
    from configs import enwik8 as config

    c = config.get_config(arg + ",runlocal")
    if "hybrid" in arg:
        c.num_layers = 2
        c.hybrid.layers = (1,)
    assert why in lm_eval.can_stream(c)


@pytest.mark.parametrize("arg", ["model=gla", "model=mamba2", "model=retnet", "model=s4d",
                                 "model=lru", "model=gated_deltanet"])
def test_recurrent_family_streams(arg):
    from configs import enwik8 as config

    assert lm_eval.can_stream(config.get_config(arg + ",runlocal")) is None


def test_errors_are_one_line(tmp_path, gla_run, capsys):
    assert lm_eval.main(["lm_eval"]) == 2
    assert "--workdir is required" in capsys.readouterr().err
    assert lm_eval.main(["lm_eval", f"--workdir={tmp_path}"]) == 2
    assert "no run (results.json)" in capsys.readouterr().err
    assert lm_eval.main(["lm_eval", f"--workdir={gla_run}", "--contexts=ring"]) == 2
    assert "choose among window, sliding, stream" in capsys.readouterr().err
    # Issue 74 probe 4: --stride=0 was silently the default stride.
    for flag in ("--stride=0", "--streams=0", "--batch=-1"):
        assert lm_eval.main(["lm_eval", f"--workdir={gla_run}", flag]) == 2
        assert "give a positive integer" in capsys.readouterr().err
    listops = tmp_path / "listops"
    listops.mkdir()
    (listops / "results.json").write_text(json.dumps(
        {"config": {"task": "listops", "objective": "causal_lm", "model": "gla"}}))
    with pytest.raises(ConfigError, match="evaluates enwik8 / text8 runs"):
        lm_eval.evaluate_run(str(listops))
    with pytest.raises(DataError, match="no enwik8 data in"):
        lm_eval.evaluate_run(gla_run, data_dir=str(tmp_path))


def test_the_length_report_of_a_language_model_is_bits_per_byte(gla_run, tmp_path):
    """Issue 72: accuracy against length, or bits per byte for enwik8. The run's own test
    is the point at its training length (32), its eval_lengths row at 64; the baseline is a
    uniform guess over the 256 bytes (8 bits), not a majority label."""
    from lra import length_report

    saved = json.load(open(os.path.join(gla_run, "results.json")))
    (row,) = saved["length_accuracy"]
    assert row["length"] == 64 and 0 < row["bits_per_token"] < 20
    assert length_report.main(["prog", gla_run], out=str(tmp_path / "lm")) == 0
    text = (tmp_path / "lm_lengths.md").read_text()
    assert "Test bits per byte (lower is better)" in text
    assert (f"| gla | {saved['num_params']:,} | {saved['test_bits_per_token']:.3f} (1) | "
            f"{row['bits_per_token']:.3f} (1) |") in text
    assert "| uniform over the tokens | - | 8.000 | 8.000 |" in text
    assert "majority label" not in text
    assert (tmp_path / "lm_lengths.png").stat().st_size > 0


def test_command_prints_the_table(gla_run, capsys):
    assert lm_eval.main(["lm_eval", f"--workdir={gla_run}",
                         "--contexts=window"]) == 0
    out = capsys.readouterr().out
    assert "| model | seeds | window | params |" in out and "| gla |" in out


PUBLISHED_DATA = {"file": "enwik8.zip", "bytes": 10**8, "sha256": "...", "published": True}
EXCERPT = {"file": "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
           "bytes": 6_089_746, "sha256": "...", "published": False}


def _fake(model, seed, bits, differences, num_layers=12, data=PUBLISHED_DATA):
    return {"model": model, "seed": seed, "task": "enwik8", "num_params": 1000,
            "num_layers": num_layers, "size_differences": differences,
            "test": {"window": {"bits_per_token": bits}}, "data": data}


def test_published_numbers_beside_full_size_runs_only():
    full = [_fake("transformer_xl", 0, 1.10, []), _fake("transformer_xl", 1, 1.12, [])]
    text = lm_eval.table(full, ["window"])
    # Each published row says how its source evaluated it (the 12-layer row: Transformer-XL's
    # run_enwik8_base.sh eval, not the 24-layer large script's).
    assert ("| transformer_xl | 0,1 | 1.110 ± 0.014 | 1,000 | 1.06 (Dai et al. 2019, 12 layers; "
            "evaluated: run_enwik8_base.sh eval (12 layers): tgt_len 80, mem_len 2,100, "
            "clamp_len 820, same_length) |") in text
    # The full-size config on the Wikipedia excerpt (gensim's 6 MB file) is not the
    # papers' experiment: never beside their numbers.
    excerpt = [_fake("transformer_xl", 0, 1.10, [], data=EXCERPT)]
    text = lm_eval.table(excerpt, ["window"])
    assert "| not compared |" in text and "1.06" not in text
    assert "not the published enwik8 zip" in text
    assert "| not compared |" in lm_eval.table([_fake("transformer_xl", 0, 1.1, [], data=None)],
                                               ["window"])
    mini = [_fake("transformer_xl", 0, 3.1, ["max_length 128 (full size: 512)"], 2)]
    text = lm_eval.table(mini, ["window"])
    assert "| not compared |" in text and "transformer_xl: max_length 128 (full size: 512)" in text
    assert "| - |" in lm_eval.table([_fake("gla", 0, 3.0, [])], ["window"])


def test_published_lm_numbers_name_their_sources():
    from lra.reporting import protocol
    from models import registry

    data = protocol.published()
    assert len(data["lm_results"]) >= 8
    for e in data["lm_results"]:
        assert e["model"] in registry.available() and e["task"] in ("enwik8", "text8")
        assert 0.9 < e["bits_per_token"] < 1.2 and e["num_layers"] in (12, 18, 24)
        assert data["sources"][e["source"]]["checked_against"] and e["eval_setting"]
    assert [e["bits_per_token"] for e, _ in protocol.published_lm("enwik8", "transformer_xl", 12)
            ] == [1.06]
    text = protocol.published_lm_markdown()
    assert "Adaptive-Span (large)" in text and "27b815fee821acce2c2d4104cc0720cb1dc74c37" in text
    assert "Dai et al." not in protocol.published_markdown()  # the LRA list keeps its sources


def test_reuse_reads_the_saved_contexts(gla_run, capsys, monkeypatch):
    lm_eval.evaluate_run(gla_run, contexts=("window",), quiet=True)
    assert lm_eval.saved_result(gla_run, "test", ["window"])["model"] == "gla"
    assert lm_eval.saved_result(gla_run, "val", ["window"]) is None  # never evaluated
    lm_eval.evaluate_run(gla_run, contexts=("sliding", "stream"), streams=4, quiet=True)
    assert lm_eval.saved_result(gla_run, "test", ["sliding", "stream"], None, 4)
    # Other settings than the saved ones are evaluated again, not read.
    assert lm_eval.saved_result(gla_run, "test", ["sliding"], stride=8) is None
    assert lm_eval.saved_result(gla_run, "test", ["stream"], streams=39) is None
    # A file from before lm_eval.json held max_length: the default stride from the config.
    path = os.path.join(gla_run, "lm_eval.json")
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    saved.pop("max_length")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(saved, f)
    assert lm_eval.saved_result(gla_run, "test", ["sliding", "stream"], None, 4)
    assert lm_eval.saved_result(gla_run, "test", ["sliding"], stride=8) is None
    monkeypatch.setattr(lm_eval, "evaluate_run", lambda *a, **k: pytest.fail("evaluated"))
    assert lm_eval.main(["lm_eval", f"--workdir={gla_run}", "--contexts=window",
                         "--reuse"]) == 0
    assert "| gla |" in capsys.readouterr().out


@pytest.mark.parametrize("arg,override", [
    ("model=performer", {"redraw_interval": 1}),  # a new draw every step: not the built one
    ("model=routing", {}),                        # centroids moved by their EMA
])
def test_window_scores_the_trained_state_beyond_params(tmp_path, arg, override):
    """A model whose trained state is more than its parameters (performer's random
    features, routing's k-means centroids) is scored with that state: the window number
    equals the training loop's test number, not a fresh draw's."""
    from configs import enwik8 as config
    from lra import train

    c = config.get_config(f"{arg},runlocal")
    c.data_dir = SLICE_DIR
    c.num_train_steps, c.eval_frequency, c.checkpoint_freq = 4, 4, 4
    c.model_hparams.update(override)
    train.train_and_evaluate(c, str(tmp_path))
    saved = json.load(open(tmp_path / "results.json"))
    window = lm_eval.evaluate_run(str(tmp_path), contexts=("window",), quiet=True)
    np.testing.assert_allclose(window["contexts"]["window"]["bits_per_token"],
                               saved["test_bits_per_token"], rtol=1e-5)
