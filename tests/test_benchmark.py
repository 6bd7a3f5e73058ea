"""The efficiency benchmark measures and tabulates (no assertions on speed)."""
import math

import pytest

import lra.tasks
from configs import state_tracking
from lra import benchmark
from lra.reporting import efficiency


def test_growth_exponent_recovers_power_law():
    lengths = [256, 512, 1024, 2048]
    assert math.isclose(benchmark.growth_exponent(lengths, [3 * l**2 for l in lengths]), 2.0)
    assert math.isclose(benchmark.growth_exponent(lengths, [l for l in lengths]), 1.0)
    assert benchmark.growth_exponent([256, 512], [1.0, None]) is None


def test_measure_and_table():
    rows = [benchmark.measure("transformer", l, batch_size=1, dim=16, num_heads=2, repeats=1)
            for l in (16, 32)]
    for r in rows:
        assert r["time_s"] > 0 and r["temp_bytes"] > 0
    rows.append({"model": "other", "length": 16, "time_s": rows[0]["time_s"] / 2,
                 "temp_bytes": rows[0]["temp_bytes"] // 4})
    rows.append({"model": "other", "length": 32, "error": "too long"})
    text = efficiency.table(rows, [16, 32])
    assert "| transformer |" in text
    assert "(vs materialised: 2.00x faster, 4.00x less mem)" in text
    assert "- (too long)" in text
    assert "faster than transformer[flash]" not in text  # no fused row measured


def test_fused_reference_row_ratios_and_break_even():
    """transformer[flash] (attention_impl=flash) is measured as a mixer, comes first, and
    every other row gets ratios against it before those against the materialised one; the
    break-even column is the length from which a row stays faster than the fused one."""
    fused = benchmark.measure(efficiency.FUSED, 32, batch_size=1, dim=16, num_heads=2,
                              repeats=1)
    assert fused["model"] == efficiency.FUSED and fused["time_s"] > 0
    rows = [dict(fused, length=l, time_s=t) for l, t in ((16, 1.0), (32, 2.0), (64, 4.0))]
    rows += [{"model": "transformer", "length": l, "time_s": t, "temp_bytes": 100}
             for l, t in ((16, 3.0), (32, 1.0), (64, 2.0))]
    rows += [{"model": "slow", "length": l, "time_s": 10.0, "temp_bytes": 10}
             for l in (16, 32, 64)]
    rows += [{"model": "quick", "length": l, "time_s": 0.1, "temp_bytes": 10}
             for l in (16, 32, 64)]
    text = efficiency.table(rows, [16, 32, 64])
    lines = text.splitlines()
    assert lines[2].startswith("| transformer[flash] |") and "(reference)" in lines[2]
    assert efficiency.break_even(rows, [16, 32, 64], "transformer") == "32"
    assert efficiency.break_even(rows, [16, 32, 64], "slow") == "not up to 64"
    assert efficiency.break_even(rows, [16, 32, 64], "quick") == "<= 16"
    quick = next(l for l in lines if l.startswith("| quick |"))
    assert "(vs fused: 10.00x faster" in quick and "; vs materialised: 30.00x faster" in quick


def test_measure_train_step_with_task_model():
    row = benchmark.measure_train_step("transformer", 32, task="listops", batch_size=2, dim=16,
                                       num_heads=2, num_layers=1, repeats=1)
    assert row["time_s"] > 0 and row["temp_bytes"] > 0
    dual = benchmark.measure_train_step("local", 32, task="retrieval", batch_size=2, dim=16,
                                        num_heads=2, num_layers=1, repeats=1)
    assert dual["time_s"] > 0


def test_a_task_with_a_label_per_position_times_its_own_rows(monkeypatch):
    """MQAR's step on its generator's rows (labels BxL, -100 where unlabelled), its head on
    the labelled positions only, as a run's: the classifier's random (B,) labels used to
    fail to broadcast against the BxL logits. State tracking pads short rows, as trained."""
    from lra.training import objectives

    slots = []
    real = objectives.label_slots
    monkeypatch.setattr(objectives, "label_slots",
                        lambda data, config: slots.append(real(data, config)) or slots[-1])
    row = benchmark.measure_train_step("gla", 64, task="mqar", batch_size=2, dim=16,
                                       num_heads=2, num_layers=1, repeats=1)
    assert row["time_s"] > 0 and slots == [4]  # 4 key-value pairs: 4 labelled positions
    batch = benchmark.generated_batch(state_tracking.get_config("runlocal"),
                                      lra.tasks.get("state_tracking"), 31)
    assert batch["targets"].shape == batch["inputs"].shape == (batch["inputs"].shape[0], 31)
    assert not batch["mask"].all()  # rows of 3..12 tokens, padded to 31


def test_eval_step_mode_times_the_tests_forward_pass(monkeypatch):
    """--mode=eval_step: the task's eval step, at its eval_batch_size (niah's runlocal: 32
    rows where it trains on 8), weights in and sums out; less temporary memory than the
    training step, which keeps activations for the backward pass."""
    sizes = []
    real = benchmark.generated_batch
    monkeypatch.setattr(benchmark, "generated_batch",
                        lambda config, *a: sizes.append(config.batch_size) or real(config, *a))
    train_row, eval_row = (benchmark.measure_train_step(
        "transformer", 48, task="niah", config_arg="runlocal", repeats=1, step=step)
        for step in ("train", "eval"))
    assert sizes == [8, 32]
    assert eval_row["time_s"] > 0 and eval_row["temp_bytes"] > 0
    per_row = [r["temp_bytes"] / n for r, n in zip((train_row, eval_row), sizes)]
    assert per_row[1] < per_row[0]


def test_memory_only_cells():
    rows = [benchmark.measure_train_step(m, 64, task="listops", batch_size=2, dim=16,
                                         num_heads=2, num_layers=1, repeats=0)
            for m in ("transformer", "linear")]
    assert all(r["time_s"] is None and r["temp_bytes"] > 0 for r in rows)
    text = efficiency.table(rows, [64])
    assert "ms" not in text and "x less mem)" in text and "faster" not in text


def test_config_arg_measures_that_config():
    """--config_arg=mini times the mini step: listops mini is 64 wide with 2 layers, the
    base config 512 wide with 4; only the length is the same."""
    mini, base = (benchmark.measure_train_step("transformer", 64, task="listops",
                                               repeats=0, config_arg=arg, batch_size=2)
                  for arg in ("mini", ""))
    assert 0 < mini["temp_bytes"] < base["temp_bytes"] / 4


def test_csv_round_trip_keeps_only_matching_settings(tmp_path):
    path = str(tmp_path / "cells.csv")
    settings = {"mode": "train_step", "task": "text", "dim": 0, "repeats": 0,
                "platform": "cpu"}
    benchmark.append_csv(path, {"model": "transformer", "length": 1024, "time_s": None,
                                "temp_bytes": 123}, settings)
    benchmark.append_csv(path, {"model": "linear", "length": 1024, "time_s": 0.5,
                                "temp_bytes": 7, "device_peak_bytes": 9}, settings)
    benchmark.append_csv(path, {"model": "local", "length": 1024, "error": "boom"}, settings)
    benchmark.append_csv(path, {"model": "fnet", "length": 1024, "time_s": 1.0,
                                "temp_bytes": 1}, {**settings, "dim": 64})
    done = benchmark.read_csv(path, settings)
    assert set(done) == {("transformer", 1024), ("linear", 1024)}  # errors are re-measured
    assert done[("transformer", 1024)] == {"model": "transformer", "length": 1024,
                                           "time_s": None, "temp_bytes": 123}
    assert done[("linear", 1024)]["device_peak_bytes"] == 9
    assert benchmark.read_csv(str(tmp_path / "none.csv"), settings) == {}


def test_program_resumes_from_its_csv(tmp_path):
    import subprocess
    import sys
    path = str(tmp_path / "cells.csv")
    cmd = [sys.executable, "-m", "lra.benchmark", "--models=linear", "--lengths=32",
           "--task=listops", "--batch_size=2", "--dim=16", "--num_heads=2", "--num_layers=1",
           "--repeats=0", f"--csv={path}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "| linear |" in first.stdout and "x less mem" in first.stdout
    assert "cpu, malloc on " in first.stdout  # the page size its times were measured with
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "reusing 3 cells" in second.stderr and "L=32" not in second.stderr  # no progress
    assert second.stdout.split("\n", 1)[1] == first.stdout.split("\n", 1)[1]


@pytest.mark.slow  # five processes: a minute on 2 CPU cores
def test_isolated_cells_match_in_process_cells(tmp_path):
    """--isolate=true measures each cell in a fresh process (the device peak needs it);
    the numbers are the in-process ones, and the CSV settings are the same, the impl
    measured included (linear has no blocksparse: it runs its own)."""
    import subprocess
    import sys
    base = [sys.executable, "-m", "lra.benchmark", "--models=linear", "--lengths=32,64",
            "--task=listops", "--batch_size=2", "--dim=16", "--num_heads=2",
            "--num_layers=1", "--repeats=0", "--attention_impl=blocksparse"]
    runs = {}
    for isolate in ("true", "false"):
        path = str(tmp_path / f"{isolate}.csv")
        proc = subprocess.run([*base, f"--isolate={isolate}", f"--csv={path}"],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[isolate] = benchmark.read_csv(path, {"mode": "train_step", "platform": "cpu"})
    # The fused reference, transformer and linear at 2 lengths.
    assert len(runs["true"]) == 6
    assert {(m, r["impl"]) for (m, _), r in runs["true"].items()} == {
        ("transformer[flash]", "flash"), ("transformer", "blocksparse"), ("linear", "dense")}
    assert runs["true"] == runs["false"]
    assert all(r["temp_bytes"] > 0 for r in runs["true"].values())


def test_isolated_cell_reports_a_dead_process(monkeypatch):
    import subprocess
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, -6, stdout="", stderr="RESOURCE_EXHAUSTED: out of memory\nAborted\n"))
    row = benchmark.isolated_cell("transformer", 4096, ["--mode=train_step"])
    assert row == {"model": "transformer", "length": 4096,
                   "error": "process died (exit -6): Aborted"}


def _flags(**overrides):
    """The program's flags, at tiny sizes, for calling `benchmark.main` in-process."""
    import types
    return types.SimpleNamespace(**{
        "mode": "train_step", "models": ["transformer"], "lengths": ["32"], "batch_size": 2,
        "dim": 16, "num_heads": 2, "num_layers": 1, "attention_impl": "dense", "repeats": 1,
        "task": "listops", "config_arg": "", "csv": None, "isolate": "false", "cell": None,
        "transformer_max_length": 0, "growth_check_length": 0, "max_growth": 1.4,
        "dtype": "float32", "override": [], **overrides})


def test_attention_impl_a_variant_lacks_runs_its_own(monkeypatch, capsys, tmp_path):
    """--attention_impl=blocksparse: transformer and pattern variants run it; linear
    (dense and pallas only) and attention-free fnet run their own, and the table says so."""
    path = str(tmp_path / "cells.csv")
    monkeypatch.setattr(benchmark, "FLAGS", _flags(
        models=["transformer", "local", "linear", "fnet"], attention_impl="blocksparse",
        csv=path))
    benchmark.main([])
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in out.splitlines() if line.startswith("| ") and "L=32" not in line}
    assert {m: cells[0] for m, cells in rows.items()} == {
        "transformer": "blocksparse", "transformer[flash]": "flash", "local": "blocksparse",
        "linear": "dense*", "fnet": "dense*"}
    assert all("ms" in cells[1] and "MiB" in cells[1] for cells in rows.values()), out
    assert "impl*: no attention_impl=blocksparse in linear, fnet;" in out
    done = benchmark.read_csv(path, {"attention_impl": "blocksparse"})
    assert {m: r["impl"] for (m, _), r in done.items()} == {
        "transformer": "blocksparse", "transformer[flash]": "flash", "local": "blocksparse",
        "linear": "dense", "fnet": "dense"}
    benchmark.main([])  # resumed from the CSV: nothing measured, the same table
    assert capsys.readouterr().out.split("\n", 1)[1] == out.split("\n", 1)[1]


def test_error_messages_are_not_cut_mid_word(monkeypatch):
    """A cell's error is the whole first line of the message (it was cut at 80 characters:
    "...; valid: d"); only a line over 300 characters is shortened, at a word boundary."""
    import subprocess
    message = ("attention_impl='blocksparse' is not available for kernelised attention; "
               "valid: dense, pallas")
    assert len(message) > 80

    def fail(*args, **kwargs):
        raise ValueError(message + "\nTraceback details")
    monkeypatch.setattr(benchmark, "FLAGS", _flags())
    monkeypatch.setattr(benchmark, "measure_train_step", fail)
    assert benchmark.measure_cell("linear", 32)["error"] == message
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, stdout="", stderr="Traceback ...\nValueError: " + message + "\n"))
    assert benchmark.isolated_cell("linear", 32, [])["error"] == (
        f"process died (exit 1): ValueError: {message}")
    assert efficiency.table([{"model": "linear", "length": 32, "error": message}], [32]) \
        .endswith(f"| linear | - ({message}) | - | - |")

    words = " ".join(f"word{i}" for i in range(200))
    short = benchmark.first_line(words, limit=100)
    assert short.endswith("...") and len(short) <= 103
    assert (short[:-3] + " ") == words[:len(short) - 2]  # ends at a word boundary
    assert benchmark.first_line("x" * 500, limit=100) == "x" * 500  # one word: whole


def test_bad_lengths_are_one_line_errors(monkeypatch, capsys):
    """--lengths=0, negative or non-integer: a one-line error before anything compiles
    (0 used to be measured, each cell failing with an unrelated message)."""
    import subprocess
    import sys
    for bad in (["0"], ["-8"], ["1.5"], ["abc"], ["64", "0"], []):
        monkeypatch.setattr(benchmark, "FLAGS", _flags(lengths=bad))
        monkeypatch.setattr(benchmark, "measure_cell", lambda *a: pytest.fail("measured"))
        with pytest.raises(SystemExit) as exit_info:
            benchmark.main([])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --lengths") and "\n" not in err, err
        if bad:
            assert repr(bad[-1]) in err and "positive integer" in err
    assert benchmark.parse_lengths(["64", "32", "64"]) == [64, 32]
    proc = subprocess.run([sys.executable, "-m", "lra.benchmark", "--lengths=0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("error: --lengths: '0' is not a positive integer; give a "
                                   "comma list of sequence lengths, e.g. --lengths=1024,2048")


def test_dtype_reaches_the_training_step():
    """--dtype=bfloat16 reaches the compiled step: another program (its temporary memory
    differs from float32's; on CPU the casts make it larger; compile only)."""
    rows = {d: benchmark.measure_train_step("transformer", 128, task="listops", batch_size=4,
                                            dim=64, num_heads=2, num_layers=1, repeats=0,
                                            dtype=d)
            for d in ("float32", "bfloat16")}
    assert rows["bfloat16"]["temp_bytes"] != rows["float32"]["temp_bytes"], rows


def test_growth_check_skips_only_the_steep_models():
    """--growth_check_length: a model whose time or memory grew faster than L^max_growth up
    to that length is not measured beyond it (the reason in its cell); others are."""
    def cell(model, length, time_s, temp):
        return {"model": model, "length": length, "time_s": time_s, "temp_bytes": temp}
    rows = [cell("quadratic", 1024, 1.0, 100), cell("quadratic", 2048, 4.0, 400),
            cell("linear", 1024, 1.0, 100), cell("linear", 2048, 2.1, 190),
            cell("steep_memory", 1024, 1.0, 100), cell("steep_memory", 2048, 2.0, 400),
            {"model": "broken", "length": 1024, "error": "boom"}]
    assert benchmark.too_steep("quadratic", rows, 2048, 1.4) == (
        "skipped: time grew as L^2.00 up to L=2048")
    assert benchmark.too_steep("linear", rows, 2048, 1.4) is None
    assert "memory grew as L^2.00" in benchmark.too_steep("steep_memory", rows, 2048, 1.4)
    assert "fewer than 2 cells" in benchmark.too_steep("broken", rows, 2048, 1.4)
    assert benchmark.too_steep("quadratic", rows, 2048, 2.1) is None


def test_lra_comparison_and_growth_goal_verdicts():
    def cell(model, length, time_s, temp):
        return {"model": model, "length": length, "time_s": time_s, "temp_bytes": temp}
    rows = [cell("transformer", 4096, 10.0, 1000), cell("linear", 4096, 1.0, 50),
            cell("performer", 4096, 5.0, 50), cell("local", 4096, 1.0, 50),
            cell("linear", 16384, 4.4, 210), cell("performer", 16384, 40.0, 200),
            {"model": "local", "length": 16384, "error": "skipped: ..."}]
    text = efficiency.lra_comparison(rows)
    # LRA at 4K: linear 7.8 / 1.4 = 5.6x faster, 9.48 / 1.03 = 9.2x less memory.
    assert "| linear | 5.6x | 10.00x | 9.2x | 20.00x | yes |" in text
    assert "| performer | 5.7x | 2.00x | 8.9x | 20.00x | no (speed) |" in text
    assert "| sinkhorn |" not in text  # not measured
    goal = efficiency.growth_goal(rows, [4096, 16384])
    assert "| linear | L^1.07 | L^1.04 | yes |" in goal
    assert "| performer | L^1.50 | L^1.00 | no (time) |" in goal
    assert "| local |" not in goal  # not measured at the longest length


def test_fused_reference_without_dropout_where_the_backend_has_none(monkeypatch):
    """cuDNN and splash refuse attention-weight dropout: the fused reference cell is then
    measured at attention_dropout_rate=0 and its impl says so (on the H200 every bf16
    reference cell was that refusal); a refusal elsewhere stays the cell's error."""
    from models.kernels import flash_attention as fa
    chunked, rates = fa._chunked, []

    def no_dropout(q, k, v, *, dropout_rate, **kw):  # the CPU form, refusing as cuDNN does
        rates.append(dropout_rate)
        if dropout_rate:
            fa._refuse("cudnn", dropout_rate)
        return chunked(q, k, v, dropout_rate=dropout_rate, **kw)
    monkeypatch.setitem(fa._FORMS, "chunked", no_dropout)
    monkeypatch.setattr(benchmark, "FLAGS", _flags())  # ListOps: attention dropout 0.1
    row = benchmark.measure_cell(efficiency.FUSED, 32)
    assert "error" not in row and row["time_s"] > 0, row
    assert row["impl"] == benchmark.FUSED_NO_DROPOUT and rates[0] == 0.1 and rates[-1] == 0
    monkeypatch.setattr(benchmark, "FLAGS", _flags(attention_impl="flash"))
    assert "no attention-weight dropout" in benchmark.measure_cell("local", 32)["error"]


def test_a_variants_own_refusal_is_reported_not_the_implementation():
    """loglinear_mamba2 at fla's 15 levels refuses max_len over 16384: a cell asked with
    attention_impl=blocksparse reports that, not "has one implementation"."""
    import configs.text
    import lra.tasks
    config = configs.text.get_config("model=loglinear_mamba2,runlocal")
    config.max_length = 16384  # + the CLS slot: 16385 positions
    benchmark.apply_overrides(config, ["model_hparams.num_levels=15"])
    with pytest.raises(ValueError, match="16384.*num_levels=16"):
        benchmark.build_model_with_impl(config, lra.tasks.get("text"), "blocksparse")


def test_overrides_reach_the_models_that_take_them():
    """--override: a model_hparams field only for the variants whose builder takes it (one
    the presets leave at its default included: fox's forget_gate), any other field for
    every model; a field the config lacks is refused."""
    from configs import listops
    from lra.errors import ConfigError

    fox, transformer = (listops.get_config(f"model={m},mini") for m in ("fox", "transformer"))
    assert "forget_gate" not in fox.model_hparams
    for config in (fox, transformer):
        benchmark.apply_overrides(config, ["model_hparams.forget_gate=false", "num_layers=1",
                                           "block.ffn=False"])
        assert config.num_layers == 1 and config.block.ffn is False
    assert fox.model_hparams.forget_gate is False
    assert "forget_gate" not in transformer.model_hparams  # the reference takes none
    assert benchmark.takes_override("fox", "model_hparams.forget_gate=0")
    assert not benchmark.takes_override(efficiency.FUSED, "model_hparams.forget_gate=0")
    with pytest.raises(ConfigError, match="no field 'not_a_field'"):
        benchmark.apply_overrides(fox, ["not_a_field=1"])
    with pytest.raises(ConfigError, match="forget_gate.*bool"):
        benchmark.apply_overrides(listops.get_config("model=fox,mini"),
                                  ["model_hparams.forget_gate=3"])
    # It reaches the built model: fox without its gate has fewer parameters' memory.
    with_gate, without = (benchmark.measure_train_step(
        "fox", 32, task="listops", repeats=0, config_arg="mini", batch_size=2,
        overrides=o) for o in ((), ("model_hparams.forget_gate=False",)))
    assert with_gate["temp_bytes"] != without["temp_bytes"]


def test_override_flags_are_checked_and_recorded(monkeypatch, capsys, tmp_path):
    """An override no measured model takes is one line before anything compiles; one
    that applies is in the table's header and the CSV's settings (a CSV written before
    the column existed is still read)."""
    monkeypatch.setattr(benchmark, "FLAGS", _flags(
        models=["linear"], override=["model_hparams.forget_gate=False"]))
    monkeypatch.setattr(benchmark, "measure_cell", lambda *a: pytest.fail("measured"))
    with pytest.raises(SystemExit):
        benchmark.main([])
    assert "none of linear takes 'forget_gate'" in capsys.readouterr().err
    monkeypatch.setattr(benchmark, "FLAGS", _flags(models=["fox"], override=["emb=3"]))
    with pytest.raises(SystemExit):
        benchmark.main([])
    assert "the config has no field 'emb'" in capsys.readouterr().err
    monkeypatch.undo()
    path = str(tmp_path / "cells.csv")
    monkeypatch.setattr(benchmark, "FLAGS", _flags(
        models=["fox"], override=["model_hparams.forget_gate=False"], repeats=0, csv=path))
    benchmark.main([])
    assert "with model_hparams.forget_gate=False" in capsys.readouterr().out
    settings = {"mode": "train_step", "overrides": "model_hparams.forget_gate=False"}
    assert set(benchmark.read_csv(path, settings)) == {
        ("transformer[flash]", 32), ("transformer", 32), ("fox", 32)}
    assert benchmark.read_csv(path, {**settings, "overrides": ""}) == {}
    old = tmp_path / "old.csv"  # no overrides column: cells measured without any
    with open(path) as f:
        lines = f.read().splitlines()
    old.write_text("\n".join(line.rsplit(",", 1)[0] for line in lines) + "\n")
    assert len(benchmark.read_csv(str(old), {"mode": "train_step", "overrides": ""})) == 3
