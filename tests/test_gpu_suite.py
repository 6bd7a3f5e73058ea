"""lra.gpu_suite: the dry run goes through every stage on CPU; complete stages are skipped
on a rerun; a stage that fails or runs out of time is recorded and the suite goes on; the
first call on a lent GPU plans the kernel tests, the 4K kernel table and one time-boxed
ListOps run within 8 minutes."""
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time

import tarfile
import zipfile

import pytest

from tests import tiers
from lra import gpu_suite
from lra.gpu import bench_stages, common, run_stages

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

STAGE_FILES = ["kernels_tests.md", "kernels.md", "transformer.md", "efficiency.md", "runs.md",
               "kernels_long.md"]


def _status(path):
    return gpu_suite.file_status(str(path))[0]


def _no_commands(*args, **kwargs):
    raise AssertionError(f"a command was run: {args}")


# Two minutes of CPU (seven stages, each a fresh process): the exhaustive tier. The default
# tier keeps the planning, skipping and failure tests below, which are quick.
@tiers.EXHAUSTIVE
def test_dry_run_writes_every_stage_and_a_rerun_skips_them(tmp_path, monkeypatch):
    """The whole dry run (every stage's command at tiny sizes, on CPU; the transformer run
    time-boxed, stopped and tested where it stopped), then: a rerun runs nothing; a stage
    marked partial resumes (a kernel length measured earlier is not measured again)."""
    out = tmp_path / "gpu"
    start = time.monotonic()
    assert gpu_suite.main(["--dry_run", f"--out={out}", f"--pack={tmp_path / 'back.tgz'}"]) == 0
    print(f"dry run: {time.monotonic() - start:.0f} s")
    for name in STAGE_FILES:
        text = (out / name).read_text()
        head = text.split("\n\n", 2)[1]  # the lines after the title
        assert head.startswith("device: cpu (cpu, 1 device) · jax "), head
        assert re.search(r"· \d{4}-\d\d-\d\d \d\d:\d\d UTC\n", head), head
        assert (f"suite: `python -m lra.gpu_suite --dry_run --out={out} "
                f"--pack={tmp_path / 'back.tgz'}`") in head
        assert re.search(r"^command: `python (-m (pytest|lra\.)|\S+/launch\.py )", head,
                         re.M), head
        assert "mode: dry run\nstatus: complete in " in head, head
    kernel_tests = (out / "kernels_tests.md").read_text()
    assert "| test_linear_attention.py | 1/1 passed | 1/1 passed | - |" in kernel_tests
    kernels = (out / "kernels.md").read_text()
    assert "### Linear attention" in kernels and "### Block-sparse" in kernels
    assert "| 64 | causal |" in kernels
    # The delta-rule section: the interpreted kernel, both XLA forms and the dense
    # reference timed (a number, not n/a), its TFLOP/s from the chunked algorithm's FLOPs.
    delta = kernels.split("### Delta rule")[1]
    row = re.search(r"^\| 64 \| gated_deltanet \|.*$", delta, re.M)
    assert row, kernels
    row = [c.strip() for c in row.group(0).strip("|").split("|")]
    assert len(row) == 22, row  # ... every dense impl, the Mosaic GPU form, the HBM floor
    assert all(re.fullmatch(r"[\d.]+", c) for c in row[2:8] + row[10:12]), row
    assert re.fullmatch(r"[\d.]+ \(flash\)", row[14]), row
    # Every dense implementation is timed in its own column (on CPU, XLA only).
    # Every dense implementation timed, ours (flash) and XLA's last.
    assert re.search(r"\| flash [\d.]+ / [\d.]+; (.*; )?xla [\d.]+ / [\d.]+ \|", kernels), kernels
    assert row[18:21] == ["n/a"] * 3, row  # no Mosaic GPU form off a GPU
    assert re.fullmatch(r"[\d.]+ / [\d.]+", row[21]), row  # MB: fwd / fwd+bwd
    assert "| 32 | causal |" in (out / "kernels_long.md").read_text()
    # The time-boxed run: stopped after its training time, tested at the step it reached.
    transformer = (out / "transformer.md").read_text()
    m = re.search(r"\| transformer \| time-boxed: trained \d+ s, stopped at step (\d+) and "
                  r"tested there \| (\d+) / 100000 \| [\d.]+ \| 36\.37 \|", transformer)
    assert m and m.group(1) == m.group(2), transformer
    assert "--config.num_train_steps=" + m.group(1) + "`" in transformer
    efficiency = (out / "efficiency.md").read_text()
    assert "## float32" in efficiency and "## bfloat16" in efficiency
    assert "measured at 128 too): linear (L^" in efficiency
    assert "| linear | " in efficiency.split("## bfloat16")[1]
    cells = (out / "efficiency.csv").read_text()
    assert ",128," in cells and ",bfloat16" in cells
    runs = (out / "runs.md").read_text()
    assert re.search(r"\| linear \| finished in \d+ s \| 2 / 2 \|", runs), runs
    assert list((out / "runs" / "listops" / "linear").glob("*/results.json"))
    summary = (out / "summary.md").read_text()
    assert summary.count("| complete in ") == 7, summary
    # No tiles tuned off a GPU (--tune refuses the interpreter): said, nothing merged.
    tune = (out / "tuning.md").read_text()
    assert "status: complete in " in tune and "nothing to tune here" in tune
    assert not (out / "tuning.json").exists()
    # What a call brings back: the results without checkpoints and generated data.
    with tarfile.open(tmp_path / "back.tgz") as tar:
        names = tar.getnames()
    assert "gpu/transformer.md" in names and "gpu/efficiency.csv" in names
    assert any(n.endswith("/results.json") for n in names)
    assert not [n for n in names if "/checkpoints" in n or n.startswith("gpu/data")]

    # Everything complete: nothing runs, the device is not even probed.
    before = {name: (out / name).read_text() for name in STAGE_FILES}
    monkeypatch.setattr(bench_stages, "run_command", _no_commands)
    monkeypatch.setattr(run_stages, "launch", _no_commands)
    monkeypatch.setattr(gpu_suite, "probe_device", _no_commands)
    assert gpu_suite.main(["--dry_run", f"--out={out}"]) == 0
    assert {name: (out / name).read_text() for name in STAGE_FILES} == before

    # kernels.md partial: the stage runs again, but its length is measured already.
    monkeypatch.setattr(gpu_suite, "probe_device", lambda: dict(H100, platform="cpu",
                                                                 kind="cpu"))
    partial = before["kernels.md"].replace("status: complete", "status: partial")
    (out / "kernels.md").write_text(partial)
    assert gpu_suite.main(["--dry_run", f"--out={out}"]) == 0
    assert "L=64 complete earlier" in (out / "kernels.md").read_text()
    assert _status(out / "kernels.md") == "complete"
    # Without that length's output kept, only bench_kernels runs (here a stand-in).
    (out / "kernels.md").write_text(partial)
    (out / "logs" / "kernels_L64.md").unlink()
    ran = []

    def fake(cmd, **kwargs):
        ran.append(cmd[2])
        return gpu_suite.Outcome(0, 1.0, BENCH_KERNELS_OUT, "")
    monkeypatch.setattr(bench_stages, "run_command", fake)
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


def test_first_call_fits_a_lent_gpu(tmp_path, capsys):
    """A lent GPU gives 15 minutes a session (start included), 10 a command: the default
    call tunes the Triton kernels' tiles (stretched into the spare), runs the kernel tests
    and the 4K kernel table, planned within 8 minutes with the wheels' install and the
    packing; the next call is the time-boxed full-size transformer run and the efficiency
    table."""
    first = common.plan_call(gpu_suite.STAGE_NAMES, 60 * common.CALL_MINUTES, common.FULL)
    assert first == [("tune", 170), ("kernel_tests", 120), ("kernels", 160)]
    # The efficiency table's rows on a device: LRA's Table 2 (a cell is 30-35 s of an H100).
    assert bench_stages.bench_models(common.FULL) == common.LRA_VARIANTS
    assert sum(s for _, s in first) + common.CALL_OVERHEAD_S <= 8 * 60
    # Each stage's limit as the call goes: the last stage gets what the others leave.
    assert [common.stage_limit(first, i, left, common.FULL)
            for i, left in ((0, 450), (1, 300), (2, 180))] == [170, 120, 180]
    assert gpu_suite.main([f"--out={tmp_path}", "--plan"]) == 0
    assert capsys.readouterr().out == (
        f"full, --out={tmp_path}: this call (450 s): tune 170 s, kernel_tests 120 s, "
        "kernels 160 s; next call: transformer, efficiency, runs, kernels_long\n")
    for stage in gpu_suite.STAGES[:3]:
        (tmp_path / stage.filename).write_text("mode: full\nstatus: complete in 1 s\n")
    assert gpu_suite.main([f"--out={tmp_path}", "--plan"]) == 0
    assert capsys.readouterr().out == (
        f"full, --out={tmp_path}: this call (450 s): transformer 239 s, efficiency 211 s; "
        "next call: runs, kernels_long\n")
    # A session's rest after the first call (4 minutes): the transformer run alone.
    assert common.plan_call(["transformer", "efficiency", "runs", "kernels_long"], 240,
                            common.FULL) == [("transformer", 240)]
    assert common.plan_call(["runs"], 100, common.FULL) == []


def test_tune_stage_tunes_a_kernel_a_command_and_merges_the_table(tmp_path, monkeypatch):
    """The tune stage with a stand-in for lra.bench_kernels --tune: a section per command,
    block-sparse first, each writing its entry into <out>/tuning.json; the entries merged
    into the checkout's table (here a copy) and shown; a section that did not complete is
    tuned by the next call, one that did is not tuned again."""
    from models.kernels import tuning

    table = tmp_path / "checkout_tuning.json"
    table.write_text(open(tuning.TABLE).read())
    monkeypatch.setattr(tuning, "TABLE", str(table))
    ran = []

    def fake(cmd, **kwargs):
        args = dict(a[2:].split("=", 1) for a in cmd[3:] if "=" in a)
        ran.append(args["sections"])
        if args["sections"] == "decayed":  # stopped at its limit
            return gpu_suite.Outcome(None, 5.0, "", "")
        kernel = "block_sparse" if args["sections"] == "block_sparse" else args["sections"]
        tile = "block" if kernel == "block_sparse" else "chunk"
        tuning.write([{"kernel": kernel, "device": "NVIDIA H100 80GB HBM3",
                       "dtype": "bfloat16", "head_dim": 64, "length": 4096, tile: 128,
                       "num_warps": 8, "num_stages": 2, "fwd_bwd_ms": 1.5, "candidates": 12,
                       "source": "measured 2026-12-05 jax 0.11.2"}], args["tune_table"])
        return gpu_suite.Outcome(0, 5.0, "tuned\n", "")

    monkeypatch.setattr(bench_stages, "run_command", fake)
    monkeypatch.setattr(gpu_suite, "probe_device", lambda: H100)
    out = tmp_path / "gpu"
    assert gpu_suite.main([f"--out={out}", "--stages=tune"]) == 0
    assert ran == ["block_sparse", "linear", "decayed", "delta"]
    text = (out / "tuning.md").read_text()
    assert "status: partial in " in text and "decayed partial: " in text
    assert "| block_sparse | NVIDIA H100 80GB HBM3 | bfloat16 | 64 | 4096 | 128 | 8 | 2 |" \
        in text
    # Measured entries replace the committed defaults of their key; decayed's stays.
    merged = {e["kernel"]: e["source"] for e in tuning.load(str(table))
              if e["device"] == "NVIDIA H100 80GB HBM3" and e["length"] == 4096}
    assert merged["delta"].startswith("measured") and merged["decayed"].startswith("default")
    ran.clear()
    assert gpu_suite.main([f"--out={out}", "--stages=tune"]) == 0
    assert ran == ["decayed"]


def test_wheels_check(tmp_path, capsys):
    """check_wheels names what the carried wheels need from the GPU image, and refuses a
    requirement neither carried nor there, and a package carried twice."""
    def wheel(name, version, *requires):
        meta = f"Name: {name}\nVersion: {version}\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires)
        with zipfile.ZipFile(tmp_path / f"{name}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    wheel("grain", "0.2.18", "absl-py", "array-record>=0.8.1; sys_platform != \"win32\"",
          "etils[epath,epy]", "portpicker", "windows-only; sys_platform == \"win32\"",
          "pytype; extra == \"testing\"")
    wheel("array_record", "0.8.6", "absl-py")
    wheel("portpicker", "1.6.0", "psutil")
    assert common.check_wheels(str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "array-record 0.8.6, grain 0.2.18, portpicker 1.6.0" in out
    assert "their requirements that the GPU image has: absl-py, etils, psutil\n" in out
    wheel("tensorboardX", "2.6.5", "numpy", "not-in-the-image")
    wheel("portpicker", "1.5.0", "psutil")
    assert common.check_wheels(str(tmp_path)) == 1
    out = capsys.readouterr().out
    assert "error: required but neither carried nor in the GPU image: not-in-the-image" in out
    assert "error: carried in more than one version: portpicker" in out


def test_launch_stops_a_run_after_its_training_time(tmp_path):
    """A time-boxed run gets SIGTERM `max_train_s` seconds after its `Training` line (or
    at its deadline, whichever is first), and its output is kept in the run's folder."""
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
              "time.sleep(0.5); print('Training x: steps 0..5000', flush=True)\n"
              "time.sleep(60)\n")
    start = time.monotonic()
    code, trained = run_stages.launch([sys.executable, "-c", script], str(tmp_path),
                                      deadline=start + 30, max_train_s=1)
    assert code is None and 0.9 < trained < 5 and time.monotonic() - start < 10
    assert "Training x" in (tmp_path / "log.txt").read_text()
    assert "==== " in (tmp_path / "stderr.txt").read_text()
    code, trained = run_stages.launch([sys.executable, "-c", "print('no training')"],
                                      str(tmp_path), deadline=time.monotonic() + 30)
    assert (code, trained) == (0, None)


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
    monkeypatch.setattr(bench_stages, "run_command", lambda cmd, **kw: gpu_suite.Outcome(
        None, 42.0, BENCH_KERNELS_OUT, ""))
    out = tmp_path / "gpu"
    assert gpu_suite.main([f"--out={out}", "--stages=kernel_tests,kernels"]) == 1
    failed = (out / "kernels_tests.md").read_text()
    assert "device: NVIDIA H100 80GB HBM3 (gpu, 1 device) · jax 0.11.0" in failed
    assert "status: failed in 0 s of 120 s (RuntimeError: boom in the kernel tests)" in failed
    assert "Traceback (most recent call last)" in failed
    kernels = (out / "kernels.md").read_text()
    assert "status: partial in " in kernels
    assert "stopped at its time limit after 42 s" in kernels
    assert "TFLOP/s over 989.4 TFLOP/s" in kernels
    assert "| % peak fwd | % peak fwd+bwd |" in kernels
    assert "| 1.00x | 1.33x | 50.0% | n/a |" in kernels
    summary = (out / "summary.md").read_text()
    assert "| kernel_tests | kernels_tests.md | planned 120 s | failed" in summary
    assert "| kernels | kernels.md | planned 330 s | partial" in summary  # the spare
    assert "| efficiency | efficiency.md | - | - |" in summary

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
    monkeypatch.setattr(bench_stages, "run_command", _no_commands)
    for argv, start in (([], "error: jax sees no accelerator"),
                        (["--stages=kernels,bench"], "error: --stages=kernels,bench: "
                                                     "unknown stage 'bench'"),
                        (["--budget_minutes=0"], "error: --budget_minutes=0 must be > 0")):
        assert gpu_suite.main([f"--out={tmp_path}", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(start) and "\n" not in err, err
    assert not list(tmp_path.glob("*.md"))


def test_kernel_test_outcomes_with_and_without_xdist():
    """The kernel tests' outcomes are read from `pytest -v`, one process or several
    (pytest-xdist's `[gw0] [ 50%] PASSED tests/...` lines, as on the GPU)."""
    out = ("tests/kernels/test_a.py::test_x[triton-float32] PASSED     [ 50%]\n"
           "[gw1] [ 50%] PASSED tests/kernels/test_b.py::test_y[triton-bfloat16-causal] \n"
           "[gw0] [100%] FAILED tests/kernels/test_b.py::test_z[f32] \n")
    assert bench_stages.parse_pytest(out) == {
        "tests/kernels/test_a.py::test_x[triton-float32]": "PASSED",
        "tests/kernels/test_b.py::test_y[triton-bfloat16-causal]": "PASSED",
        "tests/kernels/test_b.py::test_z[f32]": "FAILED"}


def test_delta_rule_flops_are_the_chunked_algorithms():
    """lra.bench_kernels' delta-rule FLOPs (its docstring's count) at C = K = V = 64: the
    forward 40 x 64^2 a position, the UT inverse 60% of it, forward+backward 2.75x; a
    ragged tail counts as a whole chunk."""
    from lra.bench_kernels import delta_flops

    fwd = delta_flops(2, 3, 4096, 64, 64, 64)
    assert fwd == 2 * 3 * 4096 * 40 * 64 ** 2
    assert 4 * 64 ** 3 * 6 * (4096 // 64) * 6 == 0.6 * fwd
    assert delta_flops(2, 3, 4096, 64, 64, 64, backward=True) == 2.75 * fwd
    assert delta_flops(1, 1, 65, 64, 64, 64) == 2 * delta_flops(1, 1, 64, 64, 64, 64)


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
    assert ("| linear | 20.00 steps/s (2.00x materialised), 2.00 GiB (0.25x materialised) "
            "| 5.00 steps/s, 3.0 MiB temp |") in text
    assert "| local | error | - |" in text
    growth = gpu_suite.subquadratic(
        [{"model": m, "length": l, "time_s": 1.0, "temp_bytes": l ** e}
         for m, e in (("transformer", 2), ("linear", 1)) for l in (1024, 2048, 4096)],
        (1024, 2048, 4096))
    assert growth == pytest.approx({"transformer": 2.0, "linear": 1.0})


def test_cli_dry_run_help_and_wheels_target():
    """`python -m lra.gpu_suite --help` works without touching jax; the Makefile's
    gpu-wheels asks pip for Python 3.12 binary wheels of what the GPU image lacks (the
    five, without their dependencies, then checks them)."""
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
    assert "python3 -m lra.gpu_suite \\\n    --out=results/gpu --budget_minutes=7.5" in dry.stdout
    for wheel in ("ml_collections==", "grain==", "tensorboardX==", "array_record==",
                  "portpicker=="):
        assert wheel in dry.stdout
    assert "--no-deps" in dry.stdout and "check_wheels" in dry.stdout
    with open(os.path.join(gpu_suite.REPO, ".gitignore")) as f:
        assert "/.gpu-wheels/" in f.read().split()


def test_full_plan_with_stand_in_commands(tmp_path, monkeypatch, listops_dir):
    """The full-size plan's own path (every variant in LRA's order, the 8K/16K choice,
    three benchmark passes, the transformer run and the runs in the issue's order), with
    stand-ins for the commands: a float32 pass stopped at its limit keeps its cells and the
    stage goes on; a run stopped at its deadline is tested at its checkpoint's step, one
    stopped before its first checkpoint, one finished and one failed are each reported."""
    from lra import benchmark
    from lra.runs import plan

    calls, launches = [], []

    def fake(cmd, **kwargs):
        args = dict(a[2:].split("=", 1) for a in cmd[3:] if a.startswith("--") and "=" in a)
        calls.append((cmd[2], args))
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

    def fake_launch(cmd, workdir, *, deadline, max_train_s=0, grace=0, xla_flags=""):
        model = re.search(r":model=(\w+)", " ".join(cmd)).group(1)
        steps = [a.split("=")[1] for a in cmd if a.startswith("--config.num_train_steps=")]
        launches.append((model, steps, deadline - time.monotonic()))
        os.makedirs(workdir, exist_ok=True)

        def results(n):
            with open(os.path.join(workdir, "results.json"), "w") as f:
                f.write(f'{{"steps": {n}, "test_accuracy": 0.3712, "best_eval_accuracy": 0.38,'
                        ' "best_step": 1200, "train_steps_per_sec": 11.5,'
                        ' "input_wait_fraction": 0.02, "device_peak_bytes": 6442450944}')
        if model == "transformer" and not steps:  # stopped at its deadline: a checkpoint
            os.makedirs(os.path.join(workdir, "checkpoints", "last", "1234"))
            os.makedirs(os.path.join(workdir, "checkpoints", "last", "1300.orbax-tmp"))
            return None, 120.0
        if model == "transformer":  # the test at step 1234
            results(1234)
            return 0, None
        if model == "performer":  # stopped while compiling
            with open(os.path.join(workdir, "stderr.txt"), "w") as f:
                f.write("==== x\n")
            return None, None
        if model == "local":
            with open(os.path.join(workdir, "stderr.txt"), "w") as f:
                f.write("==== x\nerror: boom\n")
            return 1, None
        results(5000)
        return 0, 300.0

    monkeypatch.setattr(gpu_suite, "probe_device", lambda: H100)
    monkeypatch.setattr(bench_stages, "run_command", fake)
    monkeypatch.setattr(run_stages, "launch", fake_launch)
    monkeypatch.setattr(run_stages, "listops_dir", lambda suite: listops_dir)
    monkeypatch.setattr(plan, "missing_data", lambda task, config: None)
    out = tmp_path / "gpu"
    assert gpu_suite.main([f"--out={out}", "--stages=transformer,efficiency,runs",
                           "--budget_minutes=60"]) == 1  # local failed

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

    # transformer: trained to its deadline, then tested at the checkpoint's step.
    assert launches[:2] == [("transformer", [], launches[0][2]),
                            ("transformer", ["1234"], launches[1][2])]
    transformer = (out / "transformer.md").read_text()
    assert "status: complete in " in transformer
    assert ("| transformer | time-boxed: trained 120 s, stopped at step 1234 and tested there "
            "| 1234 / 5000 | 37.12 | 36.37 | 38.00 (1200) | 11.50 | 2% | 6.00 GiB |") in \
        transformer
    assert "--config.num_train_steps=1234`" in transformer
    assert "LRA's full size (length 2000, batch 32, 4 layers of width 512; LRA trains " \
        "5000 steps)" in transformer

    assert [m for m, steps, _ in launches[2:]] == gpu_suite.RUN_ORDER[1:]
    # Each run's training deadline: its 300 s less the test's reserve and the stop's 15 s.
    assert all(200 < left <= 300 - 75 - 15 for _, _, left in launches[2:])
    runs = (out / "runs.md").read_text()
    assert "status: failed in " in runs and "(8 of 10 runs tested)" in runs
    assert ("| performer | stopped after 0 s before its first checkpoint (reading the data and "
            "compiling took the time) | - / 5000 |") in runs
    assert "| local | FAILED: exit 1: error: boom | - / 5000 |" in runs
    assert "| linear | finished in 0 s | 5000 / 5000 | 37.12 | 16.13 |" in runs
    assert "mode: full" in runs and f"Table 1: `python -m lra.report {out}/runs`" in runs

    # The next call: runs already tested are done; the failed and stopped ones run again.
    launches.clear()
    assert gpu_suite.main([f"--out={out}", "--stages=runs", "--budget_minutes=60"]) == 1
    assert [m for m, _, _ in launches] == ["performer", "local"]


def test_bandwidth_fraction_of_the_hbm_floor():
    """bench_kernels' HBM floor column over the device's bandwidth (an H100's 3350 GB/s):
    100 MB take 0.0299 ms, so a 0.05 ms forward is at 59.7% of the floor; without a
    bandwidth the table is unchanged; a row without numbers gets n/a."""
    table = ("| L | Pallas fwd ms | Pallas fwd+bwd ms | HBM floor MB fwd / fwd+bwd |\n"
             "|---|---|---|---|\n"
             "| 4096 | 0.05 | 0.15 | 100.0 / 300.0 |\n"
             "| 8192 | n/a | n/a | 200.0 / 600.0 |")
    gbps = common.hbm_gbps(H100["kind"])
    assert gbps == 3350.0 and common.hbm_gbps("NVIDIA H200") == 4800.0
    out = bench_stages.with_bandwidth_fraction(table, gbps).splitlines()
    assert out[0].endswith("| % HBM floor fwd | % HBM floor fwd+bwd |")
    assert out[1].endswith("|---|---|")
    assert out[2].endswith("| 59.7% | 59.7% |") and out[3].endswith("| n/a | n/a |")
    assert bench_stages.with_bandwidth_fraction(table, None) == table
