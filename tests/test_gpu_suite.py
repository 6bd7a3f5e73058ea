"""lra.gpu_suite: the dry run goes through every stage on CPU; complete stages are skipped
on a rerun; a stage that fails or runs out of time is recorded and the suite goes on."""
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from lra import gpu_stages, gpu_suite

H100 = {"kind": "NVIDIA H100 80GB HBM3", "platform": "gpu", "count": 1, "jax": "0.11.0",
        "jaxlib": "0.11.0"}

# lra.bench_kernels' output for one linear-attention row (13 columns), as on a GPU.
BENCH_KERNELS_OUT = """device: NVIDIA H100 80GB HBM3, jax 0.11.0, B=8 H=16 D=64 bfloat16

### Linear attention

| L | mode | Pallas fwd ms | Pallas fwd+bwd ms | TFLOP/s fwd | TFLOP/s fwd+bwd | XLA fwd ms \
| XLA fwd+bwd ms | vs XLA fwd | vs XLA fwd+bwd | dense fwd+bwd ms | vs dense fwd \
| vs dense fwd+bwd |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
| 4096 | causal | 0.50 | 1.50 | 494.7 | n/a | 1.00 | 3.00 | 2.00x | 2.00x | 2.00 (cudnn) \
| 1.00x | 1.33x |
"""

STAGE_FILES = ["kernels_tests.md", "kernels.md", "efficiency.md", "runs.md"]


def _status(path):
    return gpu_suite.file_status(str(path))[0]


def _no_commands(*args, **kwargs):
    raise AssertionError(f"a command was run: {args}")


def test_dry_run_writes_every_stage_and_a_rerun_skips_them(tmp_path, monkeypatch):
    """The whole dry run (every stage's command at tiny sizes, on CPU), then: a rerun runs
    nothing; a stage marked partial is the only one run again."""
    out = tmp_path / "gpu"
    start = time.monotonic()
    assert gpu_suite.main(["--dry_run", f"--out={out}"]) == 0
    print(f"dry run: {time.monotonic() - start:.0f} s")
    for name in STAGE_FILES:
        text = (out / name).read_text()
        head = text.split("\n\n", 2)[1]  # the lines after the title
        assert head.startswith("device: cpu (cpu, 1 device) · jax "), head
        assert re.search(r"· \d{4}-\d\d-\d\d \d\d:\d\d UTC\n", head), head
        assert f"suite: `python -m lra.gpu_suite --dry_run --out={out}`" in head
        assert re.search(r"^command: `python -m (pytest|lra\.)", head, re.M), head
        assert "mode: dry run\nstatus: complete in " in head, head
    kernel_tests = (out / "kernels_tests.md").read_text()
    assert "| test_linear_attention.py | 1/1 passed | 1/1 passed | - |" in kernel_tests
    kernels = (out / "kernels.md").read_text()
    assert "### Linear attention" in kernels and "### Block-sparse" in kernels
    assert "| 64 | causal |" in kernels
    # Every dense implementation is timed in its own column (on CPU, XLA only).
    assert re.search(r"\| xla [\d.]+ / [\d.]+ \|\n", kernels), kernels
    efficiency = (out / "efficiency.md").read_text()
    assert "## float32" in efficiency and "## bfloat16" in efficiency
    assert "measured at 128 too): linear (L^" in efficiency
    assert "| linear | " in efficiency.split("## bfloat16")[1]
    cells = (out / "efficiency.csv").read_text()
    assert ",128," in cells and ",bfloat16" in cells
    runs = (out / "runs.md").read_text()
    assert "| transformer | finished | 2 |" in runs
    assert list((out / "runs" / "listops" / "transformer").glob("*/results.json"))
    summary = (out / "summary.md").read_text()
    assert summary.count("| complete in ") == 4, summary

    # Everything complete: nothing runs, the device is not even probed.
    before = {name: (out / name).read_text() for name in STAGE_FILES}
    monkeypatch.setattr(gpu_stages, "run_command", _no_commands)
    monkeypatch.setattr(gpu_suite, "probe_device", _no_commands)
    assert gpu_suite.main(["--dry_run", f"--out={out}"]) == 0
    assert {name: (out / name).read_text() for name in STAGE_FILES} == before

    # kernels.md partial: only bench_kernels runs again (here a stand-in for it).
    (out / "kernels.md").write_text(before["kernels.md"].replace("status: complete",
                                                                 "status: partial"))
    ran = []

    def fake(cmd, **kwargs):
        ran.append(cmd[2])
        return gpu_suite.Outcome(0, 1.0, BENCH_KERNELS_OUT, "")
    monkeypatch.setattr(gpu_stages, "run_command", fake)
    monkeypatch.setattr(gpu_suite, "probe_device", lambda: dict(H100, platform="cpu",
                                                                 kind="cpu"))
    assert gpu_suite.main(["--dry_run", f"--out={out}"]) == 0
    assert ran == ["lra.bench_kernels"]
    assert _status(out / "kernels.md") == "complete"
    assert all((out / n).read_text() == before[n] for n in STAGE_FILES if n != "kernels.md")

    # A dry run never stands in for a full run: at full size, both stages run.
    ran.clear()
    monkeypatch.setattr(gpu_suite, "probe_device", lambda: H100)
    gpu_suite.main([f"--out={out}", "--stages=kernel_tests,kernels"])
    assert ran == ["pytest", "lra.bench_kernels"]
    assert "mode: full" in (out / "kernels.md").read_text()


def test_failing_stage_is_recorded_and_the_suite_goes_on(tmp_path, monkeypatch):
    """A stage whose code raises is `failed` with its traceback in its file; a command
    stopped at its limit leaves its stage `partial` with what it printed; the next stage
    runs; the exit code is 1; a rerun runs both again. kernels.md gets the % of the H100's
    bf16 peak."""
    def boom(suite, limit):
        raise RuntimeError("boom in the kernel tests")
    stages = [dataclasses.replace(s, run=boom) if s.name == "kernel_tests" else s
              for s in gpu_suite.STAGES]
    monkeypatch.setattr(gpu_suite, "STAGES", stages)
    monkeypatch.setattr(gpu_suite, "probe_device", lambda: H100)
    monkeypatch.setattr(gpu_stages, "run_command", lambda cmd, **kw: gpu_suite.Outcome(
        None, 42.0, BENCH_KERNELS_OUT, ""))
    out = tmp_path / "gpu"
    assert gpu_suite.main([f"--out={out}", "--stages=kernel_tests,kernels"]) == 1
    failed = (out / "kernels_tests.md").read_text()
    assert "device: NVIDIA H100 80GB HBM3 (gpu, 1 device) · jax 0.11.0" in failed
    assert "status: failed in 0 s (RuntimeError: boom in the kernel tests)" in failed
    assert "Traceback (most recent call last)" in failed
    kernels = (out / "kernels.md").read_text()
    assert "status: partial in " in kernels
    assert "stopped at its time limit after 42 s" in kernels
    assert "TFLOP/s over 989.4 TFLOP/s" in kernels
    assert "| % peak fwd | % peak fwd+bwd |" in kernels
    assert "| 1.00x | 1.33x | 50.0% | n/a |" in kernels
    summary = (out / "summary.md").read_text()
    assert "| kernel_tests | kernels_tests.md | failed" in summary
    assert "| kernels | kernels.md | partial" in summary
    assert "| efficiency | efficiency.md | - |" in summary

    monkeypatch.setattr(gpu_suite, "STAGES", [
        dataclasses.replace(s, run=lambda suite, limit: gpu_suite.StageResult(
            "complete", "fine", "", [])) for s in stages])
    assert gpu_suite.main([f"--out={out}", "--stages=kernel_tests,kernels"]) == 0
    assert _status(out / "kernels_tests.md") == _status(out / "kernels.md") == "complete"


def test_run_command_stops_the_whole_process_group(tmp_path):
    """At its limit a command and what it started (the benchmark's cell processes, the
    sweep's launch.py) are stopped; its output so far is returned and logged."""
    script = ("import subprocess, time; "
              "p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); "
              "time.sleep(60)")
    log = tmp_path / "logs" / "x.log"
    outcome = gpu_suite.run_command([sys.executable, "-c", script], timeout=2,
                                    log_path=str(log), grace=1)
    assert outcome.timed_out and outcome.describe().startswith("stopped at its time limit")
    child = int(outcome.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break  # dead, waiting for its parent's reaper
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the command's child {child} still runs")
    assert "(limit 2 s)" in log.read_text() and str(child) in log.read_text()
    ok = gpu_suite.run_command([sys.executable, "-c", "import sys; print('out'); "
                                "print('bad thing', file=sys.stderr); sys.exit(3)"],
                               timeout=60, log_path=str(log))
    assert (ok.returncode, ok.stdout, ok.last_error_line) == (3, "out\n", "bad thing")
    assert ok.describe().startswith("exit 3 after") and ok.describe().endswith(": bad thing")


def test_one_line_refusals(tmp_path, monkeypatch, capsys):
    """Full size on a CPU-only jax, an unknown stage, a bad budget: exit 2, one line."""
    monkeypatch.setattr(gpu_suite, "probe_device", lambda: dict(H100, platform="cpu",
                                                                 kind="cpu"))
    monkeypatch.setattr(gpu_stages, "run_command", _no_commands)
    for argv, start in (([], "error: jax sees no accelerator"),
                        (["--stages=kernels,bench"], "error: --stages=kernels,bench: "
                                                     "unknown stage 'bench'"),
                        (["--budget_minutes=0"], "error: --budget_minutes=0 must be > 0")):
        assert gpu_suite.main([f"--out={tmp_path}", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(start) and "\n" not in err, err
    assert not list(tmp_path.glob("*.md"))


def test_ratio_table_and_subquadratic_choice():
    """LRA's Table 2 form: steps/s and the device's peak, each with its ratio to
    transformer; without a device peak, XLA's temporary memory (marked temp)."""
    gib = 2**30
    rows = [{"model": "transformer", "length": 1024, "time_s": 0.1, "temp_bytes": 4 * gib,
             "device_peak_bytes": 8 * gib},
            {"model": "linear", "length": 1024, "time_s": 0.05, "temp_bytes": gib,
             "device_peak_bytes": 2 * gib},
            {"model": "linear", "length": 8192, "time_s": 0.2, "temp_bytes": 3 * 2**20},
            {"model": "local", "length": 1024, "error": "out of memory"}]
    text = gpu_suite.ratio_table(rows, [1024, 8192])
    assert "| transformer | 10.00 steps/s, 8.00 GiB | - |" in text
    assert ("| linear | 20.00 steps/s (2.00x), 2.00 GiB (0.25x) | 5.00 steps/s, 3.0 MiB "
            "temp |") in text
    assert "| local | error | - |" in text
    growth = gpu_suite.subquadratic(
        [{"model": m, "length": l, "time_s": 1.0, "temp_bytes": l ** e}
         for m, e in (("transformer", 2), ("linear", 1)) for l in (1024, 2048, 4096)],
        (1024, 2048, 4096))
    assert growth == pytest.approx({"transformer": 2.0, "linear": 1.0})


def test_cli_dry_run_help_and_wheels_target():
    """`python -m lra.gpu_suite --help` works without touching jax; the Makefile's
    gpu-wheels asks pip for Python 3.12 binary wheels of what the GPU image lacks."""
    proc = subprocess.run([sys.executable, "-m", "lra.gpu_suite", "--help"],
                          capture_output=True, text=True, timeout=120, cwd=gpu_suite.REPO)
    assert proc.returncode == 0 and "--dry_run" in proc.stdout and "--budget_minutes" in \
        proc.stdout
    if shutil.which("make") is None:
        pytest.skip("no make")
    dry = subprocess.run(["make", "-n", "gpu-wheels", "gpu-results"], capture_output=True,
                         text=True, timeout=60, cwd=gpu_suite.REPO)
    assert dry.returncode == 0, dry.stderr
    assert "--python-version 3.12" in dry.stdout and "--only-binary=:all:" in dry.stdout
    assert "-d .gpu-wheels" in dry.stdout
    assert "python3 -m lra.gpu_suite --out=results/gpu --budget_minutes=25" in dry.stdout
    with open(os.path.join(gpu_suite.REPO, ".gitignore")) as f:
        assert "/.gpu-wheels/" in f.read().split()


def test_full_plan_with_stand_in_commands(tmp_path, monkeypatch, listops_dir):
    """The full-size plan's own path (every variant in LRA's order, the 8K/16K choice,
    three benchmark passes, the runs in the issue's order), with stand-ins for the
    commands: a float32 pass stopped at its limit keeps its cells and the stage goes on;
    a run stopped at the limit, one finished and one failed are each reported."""
    from lra import benchmark, sweep

    calls = []

    def fake(cmd, **kwargs):
        args = dict(a[2:].split("=", 1) for a in cmd[3:] if a.startswith("--") and "=" in a)
        calls.append((cmd[2], args))
        if cmd[2] == "lra.benchmark":
            models = ["transformer", *[m for m in args["models"].split(",")
                                       if m != "transformer"]]
            stopped = args["dtype"] == "float32" and "transformer_max_length" not in args
            for m in models[:3] if stopped else models:
                for l in map(int, args["lengths"].split(",")):
                    if m == "transformer" and l > int(args.get("transformer_max_length", l)):
                        continue
                    power = {"transformer": 2.0, "strided": 1.7}.get(m, 1.0)
                    benchmark.append_csv(args["csv"], {
                        "model": m, "length": l, "time_s": l ** power / 1e7,
                        "temp_bytes": int(l ** power), "device_peak_bytes": int(2 * l ** power),
                        "impl": "dense"}, {"mode": "train_step", "dtype": args["dtype"],
                                           "platform": "gpu"})
            return gpu_suite.Outcome(None if stopped else 0, 5.0, "", "")
        model = args["models"]
        workdir = sweep.run_dir(args["sweep_dir"], "listops", model, 0)
        os.makedirs(workdir, exist_ok=True)
        if model == "transformer":
            with open(os.path.join(workdir, "results.json"), "w") as f:
                f.write('{"steps": 5000, "test_accuracy": 0.3712, "best_eval_accuracy": 0.38,'
                        ' "train_steps_per_sec": 21.5, "input_wait_fraction": 0.02,'
                        ' "device_peak_bytes": 6442450944}')
            return gpu_suite.Outcome(0, 300.0, "[1/1] listops transformer seed 0: done in "
                                     "300 s\n", "")
        if model == "performer":
            with open(os.path.join(workdir, "log.txt"), "w") as f:
                f.write("step   1200/5000 | loss 2.1\n")
            return gpu_suite.Outcome(None, 200.0, "", "")
        return gpu_suite.Outcome(1, 3.0, f"[1/1] listops {model} seed 0: FAILED after 3 s: "
                                 "boom (whole stderr: x)\n", "")

    monkeypatch.setattr(gpu_suite, "probe_device", lambda: H100)
    monkeypatch.setattr(gpu_stages, "run_command", fake)
    monkeypatch.setattr(gpu_stages, "listops_dir", lambda suite: listops_dir)
    monkeypatch.setattr(sweep, "missing_data", lambda task, config: None)
    out = tmp_path / "gpu"
    assert gpu_suite.main([f"--out={out}", "--stages=efficiency,runs"]) == 0

    benches = [args for name, args in calls if name == "lra.benchmark"]
    assert [(a["dtype"], a["lengths"]) for a in benches] == [
        ("float32", "1024,2048,3072,4096"), ("float32", "8192,16384"),
        ("bfloat16", "1024,2048,3072,4096")]
    assert benches[0]["models"].startswith("transformer,local,strided,longformer,linformer")
    assert benches[1]["models"] == "local"  # measured, linear in L; strided grew L^1.7
    assert benches[1]["transformer_max_length"] == "4096"
    efficiency = (out / "efficiency.md").read_text()
    assert "status: partial in " in efficiency
    assert "| float32 | partial: stopped at its time limit after 5 s |" in efficiency
    assert "measured at 8192,16384 too): local (L^1.00)." in efficiency
    assert "strided (L^1.70)" in efficiency and "transformer (the quadratic reference)" in \
        efficiency
    f32 = efficiency.split("## float32")[1].split("## bfloat16")[0]
    assert "| L=1024 | L=2048 | L=3072 | L=4096 | L=8192 | L=16384 |" in f32
    assert "(peak " in f32 and "x faster" in f32 and "MiB (0." in f32
    assert "| longformer |" not in f32  # not measured before the stop: no row
    assert "| longformer |" in efficiency.split("## bfloat16")[1]

    assert [args["models"] for name, args in calls if name == "lra.sweep"] == \
        gpu_suite.RUN_ORDER
    runs = (out / "runs.md").read_text()
    assert "status: partial in " in runs and "(1 of 11 runs finished)" in runs
    assert "| transformer | finished | 5000 | 37.12 | 36.37 | 38.00 | 21.50 | 2% | 6.00 GiB |" \
        in runs
    assert ("| performer | stopped at the suite's limit after 200 s (SIGTERM: launch.py saves "
            "a checkpoint; run the suite again to resume); reached step 1200/5000 |") in runs
    assert "| local | FAILED after 3 s: boom (whole stderr: x) |" in runs
    assert "mode: full" in runs and f"Table 1: `python -m lra.report {out}/runs`" in runs
