r"""Everything an accelerator should measure, from one command, in order of value.

  python -m lra.gpu_suite --out=results/gpu [--budget_minutes=25]          (make gpu-results)
  python -m lra.gpu_suite --dry_run      # the same path at tiny sizes on CPU (under a minute)

Stages (`--stages`, default all, in this order; each writes its file into --out as it
finishes, and a stage that crashes or runs out of time says so in its file while the suite
goes on to the next):

  1. kernel_tests  `pytest tests/kernels` natively (Triton kernels compiled, not
                   interpreted; float32 and bfloat16, slow cases included) -> kernels_tests.md
  2. kernels       `lra.bench_kernels`: causal/full linear attention and block-sparse
                   attention against their XLA paths and jax.nn.dot_product_attention
                   (cuDNN, XLA) at 4K-16K, with TFLOP/s and the fraction of the device's
                   bf16 peak -> kernels.md
  3. efficiency    `lra.benchmark` (one training step of LRA's text model) for every
                   variant at 1K-4K in float32; 8K and 16K for the variants whose memory
                   grew at most L^1.5 over 1K-4K; then a bfloat16 pass at 1K-4K if time is
                   left -> efficiency.md, efficiency.csv (the benchmark's resumable CSV)
  4. runs          full-size ListOps runs with the time left (transformer, then performer,
                   local, linear and LRA's other variants), via `lra.sweep` into
                   <out>/runs/ -> runs.md (each run its own results.json). data/listops is
                   generated in the background at the start if missing.

Every file begins with the device (jax.devices()[0].device_kind), the jax version, the date,
the suite's command and each command the stage ran; `status:` says complete, partial (out
of time: run again to continue), failed or running (the suite was stopped). summary.md lists
the stages. Logs (each command's whole output) go to <out>/logs/.

Time: --budget_minutes is shared out as the stages start, each getting its share of what is
left (SHARES), so time a stage does not use goes to the later ones; each command runs in its
own process group and is stopped (SIGTERM, then SIGKILL) at its stage's limit. What was
done survives: bench_kernels' rows as they are printed, the benchmark's CSV cell by cell,
the runs' checkpoints (launch.py saves on SIGTERM).

Running again with the same --out skips the stages whose file says complete (for the same
mode: a dry run never stands in for a full one) and resumes the others: the benchmark
measures only the cells its CSV lacks, the sweep resumes unfinished runs. --force runs
every stage again (the CSV and finished runs are still reused; delete them to measure
afresh).

--dry_run: the same code path at tiny sizes, meant for CPU (the Pallas kernels interpreted):
two kernel tests (-k), bench_kernels at L=64, the benchmark for transformer and linear at
L=32/64 (and 128) with 16-wide one-layer models (compile and memory only), one `runlocal`
ListOps run of 2 steps on a generated tiny set. Default --out: workdirs/gpu_suite_dry_run.

Exit status: 0 unless a stage failed (running out of time is not a failure: run again);
2 for a usage error, or when jax sees only a CPU at full size.

The suite's own process never touches the accelerator (the device is probed in a
subprocess): the commands it starts need all of the device's memory.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from typing import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# LRA's variants (Table 1) first, then the rest of the registry: when time runs out, the
# rows that can be set beside the paper are the ones measured.
LRA_VARIANTS = ["transformer", "local", "strided", "longformer", "linformer", "reformer",
                "sinkhorn", "synthesizer", "bigbird", "linear", "performer"]
# The order for the full-size runs: the baseline, then the fast families.
RUN_ORDER = ["transformer", "performer", "local", "linear", "linformer", "reformer",
             "sinkhorn", "synthesizer", "bigbird", "strided", "longformer"]

# Share of the time left that each stage gets when it starts (renormalised over the stages
# still to run, so an early finish passes its time on).
SHARES = {"kernel_tests": 0.12, "kernels": 0.15, "efficiency": 0.45, "runs": 0.28}
# The efficiency stage's passes, likewise within the stage's time.
PASS_SHARES = {"float32": 0.65, "long": 0.15, "bfloat16": 0.20}

# A variant goes on to 8K/16K when its compiled memory grew at most this fast over 1K-4K
# (XLA's temporary bytes: the same on any device, unlike timings at small L).
SUBQUADRATIC_MAX_EXPONENT = 1.5

# Dense bfloat16 tensor-core peaks (TFLOP/s, without structured sparsity) from NVIDIA's
# datasheets, matched against jax's device_kind in this order (the NVL and PCIe H100s are
# slower than the SXM part, whose name is the bare "H100 80GB HBM3").
BF16_PEAK_TFLOPS = (("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4),
                    ("H200", 989.4), ("A100", 312.0))

# Kernel tests left out on the accelerator: the Mosaic (TPU) flavour runs interpreted
# anywhere but a TPU, so it measures nothing there; test_sharded_kernels needs 4 devices
# of jax's default backend, which --xla_force_host_platform_device_count gives on CPU only
# (a one-GPU machine has one).
KERNEL_TESTS_NATIVE = "not mosaic and not sharded"

# Seconds a stopped command gets between SIGTERM and SIGKILL; the runs stage's launch.py
# saves a checkpoint then, so it gets more.
GRACE_S = 10
RUN_GRACE_S = 60


@dataclasses.dataclass(frozen=True)
class Plan:
    """The sizes of one mode: `FULL` on the accelerator, `DRY` on CPU."""
    name: str
    kernel_tests_k: str
    bench_kernels_args: tuple[str, ...]
    bench_lengths: tuple[int, ...]
    long_lengths: tuple[int, ...]
    bf16_lengths: tuple[int, ...]
    bench_args: tuple[str, ...]  # sizes for lra.benchmark (none: the text config's own)
    run_models: tuple[str, ...]
    run_config_arg: str
    run_overrides: tuple[str, ...]
    listops_args: tuple[str, ...]  # lra.tasks.listops flags besides --output_dir
    min_pass_s: float  # a benchmark pass or a run is not started with less time than this
    bench_models: tuple[str, ...] | None = None  # None: every registered variant
    xla_flags: str = ""  # added to XLA_FLAGS for every command


FULL = Plan(
    name="full",
    kernel_tests_k=KERNEL_TESTS_NATIVE,
    bench_kernels_args=("--lengths=4096,8192,16384", "--dtype=bfloat16"),
    bench_lengths=(1024, 2048, 3072, 4096),  # LRA's Table 2 columns
    long_lengths=(8192, 16384),
    bf16_lengths=(1024, 2048, 3072, 4096),
    bench_args=(),
    run_models=tuple(RUN_ORDER),
    run_config_arg="",
    run_overrides=(),
    listops_args=(),  # LRA's 96k/2k/2k expressions of 500-2000 tokens
    min_pass_s=60,
)

DRY = Plan(
    name="dry run",
    # The Triton flavour in both dtypes (interpreted on CPU).
    kernel_tests_k="linear_attention and (triton-float32-causal or triton-bfloat16-causal)",
    bench_kernels_args=("--lengths=64", "--batch_size=1", "--num_heads=1", "--head_dim=16",
                        "--repeats=1", "--modes=causal", "--densities=1.0,0.5",
                        "--block_size=16", "--dtype=float32", "--interpret"),
    bench_lengths=(32, 64),
    long_lengths=(128,),
    bf16_lengths=(64,),
    # --repeats=0: compile and report memory only; the timed path is the benchmark's own
    # (tests/test_benchmark.py), and compiling is most of a tiny cell's cost on CPU.
    bench_args=("--batch_size=2", "--dim=16", "--num_heads=2", "--num_layers=1",
                "--repeats=0"),
    run_models=("transformer",),
    run_config_arg="runlocal",
    run_overrides=("num_train_steps=2", "eval_frequency=2", "num_eval_steps=1",
                   "checkpoint_freq=2", "max_length=48"),
    # tests/conftest.py's tiny set: generated in well under a second.
    listops_args=("--num_train_samples=256", "--num_valid_samples=64",
                  "--num_test_samples=64", "--min_length=5", "--max_length=40",
                  "--max_depth=3", "--max_args=4"),
    min_pass_s=0,
    bench_models=("transformer", "linear"),
    # The dry run checks the plumbing, not speed: XLA's backend optimisation is most of a
    # tiny program's compile time on CPU (a runlocal run: 12 s with it, 7 s without).
    xla_flags="--xla_backend_optimization_level=0",
)


def _log(message: str) -> None:
    print(f"gpu_suite {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def rel(path: str) -> str:
    """`path` from the repository root when it is inside it, else whole."""
    inside = os.path.commonpath([REPO, os.path.abspath(path)]) == REPO
    return os.path.relpath(path, REPO) if inside else path


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def display(cmd: list[str]) -> str:
    """`cmd` as a shell line, with this interpreter shown as `python`."""
    return shlex.join(["python" if c == sys.executable else c for c in cmd])


# --- running commands ------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    returncode: int | None  # None: stopped at its time limit
    seconds: float
    stdout: str
    last_error_line: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def describe(self) -> str:
        if self.timed_out:
            return f"stopped at its time limit after {self.seconds:.0f} s"
        if self.returncode:
            why = f": {self.last_error_line}" if self.last_error_line else ""
            return f"exit {self.returncode} after {self.seconds:.0f} s{why}"
        return f"done in {self.seconds:.0f} s"


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies aside: an orphan's parent may
    be slow to reap it)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    if not os.path.isdir("/proc"):
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _, group = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            return True
    return False


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the command's whole process group (the benchmark's cell processes, the
    sweep's launch.py, which then saves a checkpoint), then SIGKILL to whatever is left
    after `grace` seconds; returns when the group is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()  # reaps the leader, which is ours
            if not _group_alive(proc.pid):
                return
            time.sleep(0.2)


def run_command(cmd: list[str], *, timeout: float, log_path: str, grace: float = GRACE_S,
                xla_flags: str = "") -> Outcome:
    """Runs `cmd` in the repository, in a process group of its own, for at most `timeout`
    seconds. stderr is appended to `log_path`, stdout too and also returned (a stopped
    command's output so far included)."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    out_path = log_path + ".stdout"
    # Unbuffered: a command stopped at its limit has written what it printed.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    start = time.monotonic()
    with open(log_path, "ab") as log, open(out_path, "wb") as out:
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        log.write(f"==== {stamp} (limit {timeout:.0f} s): {display(cmd)}\n".encode())
        log.flush()
        offset = log.tell()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=log, env=env,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            _stop_group(proc, grace)
            returncode = None
        except BaseException:  # Ctrl-C or SIGTERM to the suite: leave nothing running
            _stop_group(proc, grace)
            raise
    with open(out_path, encoding="utf-8", errors="replace") as f:
        stdout = f.read()
    os.remove(out_path)
    with open(log_path, "rb") as log:
        log.seek(offset)
        errors = [l.strip() for l in log.read().decode("utf-8", "replace").splitlines()
                  if l.strip()]
    with open(log_path, "ab") as log:  # the stdout after its stderr, for the record
        log.write(stdout.encode())
    return Outcome(returncode, time.monotonic() - start, stdout,
                   errors[-1][:300] if errors else "")


# --- the device and the files' headers --------------------------------------------------

_PROBE = ("import json, jax, jaxlib; d = jax.devices()\n"
          "print(json.dumps({'kind': d[0].device_kind, 'platform': d[0].platform, "
          "'count': len(d), 'jax': jax.__version__, 'jaxlib': jaxlib.__version__}))")


def probe_device() -> dict:
    """The device as jax sees it, asked in a subprocess (this process must not claim the
    accelerator's memory); a RuntimeError says why when jax cannot start."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"jax did not start (exit {proc.returncode}): {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bf16_peak_tflops(device_kind: str) -> float | None:
    for name, peak in BF16_PEAK_TFLOPS:
        if name in device_kind:
            return peak
    return None


STATUS_RE = re.compile(r"^status: (\S+)", re.M)
MODE_RE = re.compile(r"^mode: (.+)$", re.M)


def file_status(path: str) -> tuple[str | None, str | None]:
    """(status, mode) from a stage file's header; (None, None) if there is no file."""
    if not os.path.exists(path):
        return None, None
    with open(path, encoding="utf-8") as f:
        text = f.read(4000)
    status, mode = STATUS_RE.search(text), MODE_RE.search(text)
    return (status.group(1) if status else None), (mode.group(1).strip() if mode else None)


def write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# --- the suite ---------------------------------------------------------------------------


@dataclasses.dataclass
class StageResult:
    status: str  # complete | partial | failed
    detail: str  # one line after the status
    body: str
    commands: list[str]


@dataclasses.dataclass
class Suite:
    out: str
    plan: Plan
    device: dict
    command: str
    deadline: float  # time.monotonic() by which everything must be done
    generator: subprocess.Popen | None = None
    data_dir: str = ""  # the ListOps folder the runs read ("" before it is known)

    @property
    def logs(self) -> str:
        return os.path.join(self.out, "logs")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def header(self, title: str, commands: list[str], status: str) -> str:
        d = self.device
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        lines = [f"# {title}", "",
                 f"device: {d['kind']} ({d['platform']}, {d['count']} device"
                 f"{'s' if d['count'] != 1 else ''}) · jax {d['jax']} (jaxlib {d['jaxlib']})"
                 f" · {date}",
                 f"suite: `{self.command}`"]
        lines += [f"command: `{c}`" for c in commands]
        if commands and self.plan.xla_flags:
            lines.append(f"environment: XLA_FLAGS += `{self.plan.xla_flags}`")
        lines += [f"mode: {self.plan.name}", f"status: {status}", ""]
        return "\n".join(lines) + "\n"


def stage_kernel_tests(suite: Suite, limit: float) -> StageResult:
    """pytest tests/kernels (-v: each outcome is a line, kept when the run is stopped)."""
    cmd = [sys.executable, "-m", "pytest", "tests/kernels", "-v", "-rfE", "--durations=15",
           "-p", "no:cacheprovider", "-m", "", "-k", suite.plan.kernel_tests_k]
    outcome = run_command(cmd, timeout=limit, xla_flags=suite.plan.xla_flags,
                          log_path=os.path.join(suite.logs, "kernel_tests.log"))
    tests = parse_pytest(outcome.stdout)
    body = [f"Selection: `-m \"\" -k \"{suite.plan.kernel_tests_k}\"` (slow cases included; "
            "on an accelerator the Triton flavour runs compiled, on CPU interpreted). "
            "Left out on an accelerator: the Mosaic flavour (interpreted off-TPU) and "
            "test_sharded_kernels (4 devices of the default backend: CPU only).", ""]
    body += kernel_tests_summary(tests, outcome.stdout)
    # pytest: 0 all passed, 1 some failed (a result: the stage is done); other codes mean
    # it could not run the tests (usage, collection, internal error).
    if outcome.timed_out:
        return StageResult("partial", outcome.describe() + f" ({len(tests)} tests ran)",
                           "\n".join(body), [display(cmd)])
    if outcome.returncode in (0, 1):
        failed = sum(o in ("FAILED", "ERROR") for o in tests.values())
        return StageResult("complete", f"{outcome.describe()}; {failed} failed",
                           "\n".join(body), [display(cmd)])
    return StageResult("failed", outcome.describe(), "\n".join(body), [display(cmd)])


_PYTEST_LINE = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def parse_pytest(stdout: str) -> dict[str, str]:
    """{test id: outcome} from `pytest -v` output."""
    tests = {}
    for line in stdout.splitlines():
        m = _PYTEST_LINE.match(line)
        if m:
            tests[m.group(1)] = m.group(2)
    return tests


def _dtype_of(test_id: str) -> str:
    params = test_id.partition("[")[2]
    if "bfloat16" in params or "bf16" in params:
        return "bfloat16"
    if "float32" in params or "f32" in params:
        return "float32"
    return "other"


def kernel_tests_summary(tests: dict[str, str], stdout: str) -> list[str]:
    """Markdown: outcomes per file and dtype, the failures with their messages, the
    slowest tests."""
    counts: dict[str, int] = {}
    for outcome in tests.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    lines = [", ".join(f"{n} {o.lower()}" for o, n in sorted(counts.items()))
             or "no test outcome was reported", ""]
    if tests:
        dtypes = ("float32", "bfloat16", "other")
        lines += ["| file | " + " | ".join(dtypes) + " |", "|---|---|---|---|"]
        files = sorted({t.split("::")[0] for t in tests})
        for name in files:
            cells = []
            for dtype in dtypes:
                mine = [o for t, o in tests.items()
                        if t.startswith(name + "::") and _dtype_of(t) == dtype]
                passed = sum(o in ("PASSED", "XFAIL") for o in mine)
                skipped = sum(o == "SKIPPED" for o in mine)
                cells.append(f"{passed}/{len(mine)} passed" + (f", {skipped} skipped"
                                                               if skipped else "")
                             if mine else "-")
            lines.append(f"| {os.path.basename(name)} | " + " | ".join(cells) + " |")
        lines.append("")
    failures = [l for l in stdout.splitlines() if l.startswith(("FAILED ", "ERROR "))]
    if failures:
        lines += ["Failures:", ""] + [f"- `{l}`" for l in failures] + [""]
    durations = stdout.partition("slowest 15 durations")[2].split("\n=", 1)[0].strip("= \n")
    if durations:
        lines += ["Slowest:", "", "```", durations, "```", ""]
    return lines


def stage_kernels(suite: Suite, limit: float) -> StageResult:
    """lra.bench_kernels' tables, with the fraction of the device's bf16 peak."""
    cmd = [sys.executable, "-m", "lra.bench_kernels", *suite.plan.bench_kernels_args]
    outcome = run_command(cmd, timeout=limit, xla_flags=suite.plan.xla_flags,
                          log_path=os.path.join(suite.logs, "kernels.log"))
    bf16 = "--dtype=bfloat16" in suite.plan.bench_kernels_args
    peak = bf16_peak_tflops(suite.device["kind"]) if bf16 else None
    note = (f"% peak: TFLOP/s over {peak:g} TFLOP/s, the device's dense bf16 peak "
            "(NVIDIA's datasheet)." if peak else
            f"No % of peak: no bf16 peak known for {suite.device['kind']}"
            + ("" if bf16 else " (and the inputs are not bfloat16)") + ".")
    body = f"{note}\n\n{with_peak_fraction(outcome.stdout, peak)}"
    status = ("complete" if outcome.returncode == 0
              else "partial" if outcome.timed_out else "failed")
    return StageResult(status, outcome.describe(), body, [display(cmd)])


def with_peak_fraction(markdown: str, peak: float | None) -> str:
    """bench_kernels' tables with two columns more: TFLOP/s fwd and fwd+bwd as % of
    `peak` (unchanged without a peak)."""
    if not peak:
        return markdown
    out, columns = [], None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            columns = None
            out.append(line)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if columns is None and "TFLOP/s fwd" in cells:
            columns = [cells.index("TFLOP/s fwd"), cells.index("TFLOP/s fwd+bwd")]
            out.append(line + " % peak fwd | % peak fwd+bwd |")
        elif columns is not None and set(line) <= set("|-"):
            out.append(line + "---|---|")
        elif columns is not None:
            extra = []
            for i in columns:
                try:
                    extra.append(f"{100 * float(cells[i]) / peak:.1f}%")
                except (ValueError, IndexError):
                    extra.append("n/a")
            out.append(line + f" {extra[0]} | {extra[1]} |")
        else:
            out.append(line)
    return "\n".join(out)


def bench_models(plan: Plan) -> list[str]:
    if plan.bench_models is not None:
        return list(plan.bench_models)
    from models import registry

    names = registry.available()
    return ([m for m in LRA_VARIANTS if m in names]
            + [m for m in names if m not in LRA_VARIANTS])


def read_cells(path: str, dtype: str) -> list[dict]:
    """The CSV's cells of one dtype, errors included (the last line of a cell wins),
    without the `transformer` cells skipped above --transformer_max_length."""
    if not os.path.exists(path):
        return []
    cells = {}
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            if rec.get("dtype") != dtype or rec.get("error") == "skipped":
                continue
            row = {"model": rec["model"], "length": int(rec["length"]),
                   "time_s": float(rec["time_s"]) if rec["time_s"] else None,
                   "temp_bytes": int(rec["temp_bytes"]) if rec["temp_bytes"] else None,
                   "impl": rec["impl"] or "dense"}
            if rec["device_peak_bytes"]:
                row["device_peak_bytes"] = int(rec["device_peak_bytes"])
            if rec["error"]:
                row = {"model": rec["model"], "length": int(rec["length"]),
                       "error": rec["error"]}
            cells[(row["model"], row["length"])] = row
    return list(cells.values())


def subquadratic(rows: list[dict], lengths: tuple[int, ...]) -> dict[str, float | None]:
    """{model: growth exponent of its compiled memory over `lengths`} for every model
    measured there (None: fewer than two cells measured)."""
    from lra.benchmark import growth_exponent

    by = {(r["model"], r["length"]): r for r in rows if "error" not in r}
    models = list(dict.fromkeys(r["model"] for r in rows))
    return {m: growth_exponent(list(lengths), [by.get((m, l), {}).get("temp_bytes")
                                               for l in lengths]) for m in models}


def ratio_table(rows: list[dict], lengths: list[int]) -> str:
    """Markdown in LRA's Table 2 form: steps/s and memory per model and L, each with its
    ratio to transformer at the same L (memory: the device's peak where measured, else
    XLA's compiled temporary memory, marked `temp`)."""
    by = {(r["model"], r["length"]): r for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    lines = ["| model | " + " | ".join(f"L={l}" for l in lengths) + " |",
             "|---|" + "---|" * len(lengths)]

    def memory(r):
        if r.get("device_peak_bytes"):
            return r["device_peak_bytes"], ""
        return r.get("temp_bytes"), " temp"

    for m in models:
        cells = []
        for l in lengths:
            r, base = by.get((m, l)), by.get(("transformer", l))
            if r is None or "error" in r:
                cells.append("-" if r is None else "error")
                continue
            parts = []
            if r["time_s"]:
                speed = f"{1 / r['time_s']:.2f} steps/s"
                if base and "error" not in base and base["time_s"] and m != "transformer":
                    speed += f" ({base['time_s'] / r['time_s']:.2f}x)"
                parts.append(speed)
            mem, kind = memory(r)
            if mem:
                text = f"{_size(mem)}{kind}"
                base_mem = memory(base)[0] if base and "error" not in base else None
                if base_mem and m != "transformer":
                    text += f" ({mem / base_mem:.2f}x)"
                parts.append(text)
            cells.append(", ".join(parts) or "-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def stage_efficiency(suite: Suite, limit: float) -> StageResult:
    """Three lra.benchmark passes into one CSV (float32 1K-4K; 8K/16K for the
    sub-quadratic variants; bfloat16 1K-4K), then the tables from the CSV, so a pass
    stopped at its limit still shows every cell it measured."""
    from lra import benchmark

    plan = suite.plan
    csv_path = os.path.join(suite.out, "efficiency.csv")
    log_path = os.path.join(suite.logs, "efficiency.log")
    base = [sys.executable, "-m", "lra.benchmark", f"--csv={csv_path}", *plan.bench_args]
    short = ",".join(map(str, plan.bench_lengths))
    models = bench_models(plan)
    start, passes, commands = time.monotonic(), [], []

    def run_pass(name: str, cmd: list[str]) -> None:
        later = [n for n in PASS_SHARES if n not in [p[0] for p in passes]]
        left = limit - (time.monotonic() - start)
        share = left * PASS_SHARES[name] / sum(PASS_SHARES[n] for n in later)
        if left < plan.min_pass_s:
            passes.append((name, "partial", "not started: no time left"))
            return
        _log(f"efficiency: {name} pass (limit {share:.0f} s): {display(cmd)}")
        commands.append(display(cmd))
        outcome = run_command(cmd, timeout=share, log_path=log_path,
                              xla_flags=plan.xla_flags)
        status = ("complete" if outcome.returncode == 0
                  else "partial" if outcome.timed_out else "failed")
        passes.append((name, status, outcome.describe()))

    run_pass("float32", [*base, f"--models={','.join(models)}", f"--lengths={short}",
                         "--dtype=float32"])
    exponents = subquadratic(read_cells(csv_path, "float32"), plan.bench_lengths)
    # transformer is the quadratic reference whatever its exponent at small sizes.
    chosen = [m for m in models if m != "transformer" and exponents.get(m) is not None
              and exponents[m] <= SUBQUADRATIC_MAX_EXPONENT]
    if chosen:  # transformer is prepended by the benchmark; skipped above the short lengths
        run_pass("long", [*base, f"--models={','.join(chosen)}",
                          f"--lengths={','.join(map(str, plan.long_lengths))}",
                          f"--transformer_max_length={max(plan.bench_lengths)}",
                          "--dtype=float32"])
    else:
        passes.append(("long", "complete", "no variant's memory grew at most "
                       f"L^{SUBQUADRATIC_MAX_EXPONENT} over {short}"))
    run_pass("bfloat16", [*base, f"--models={','.join(models)}",
                          f"--lengths={','.join(map(str, plan.bf16_lengths))}",
                          "--dtype=bfloat16"])

    sizes = " ".join(plan.bench_args) or "the text config's sizes (LRA's: emb 256, 4 layers)"
    body = ["One training step (forward, backward, optimizer update) of the text task's "
            f"model at {sizes}, on random tokens of length L; each cell in a fresh "
            "process on an accelerator (the device's peak memory is per process). "
            "Ratios are to transformer at the same L in the same run: LRA's Table 2 "
            "reports the same quantities (steps/s and peak memory, text task, TPU v3).",
            "", "| pass | status |", "|---|---|"]
    body += [f"| {name} | {status}: {detail} |" for name, status, detail in passes]
    body += ["", f"Sub-quadratic (compiled memory grew at most L^{SUBQUADRATIC_MAX_EXPONENT}"
             f" over L={short}; measured at {','.join(map(str, plan.long_lengths))} too): "
             + (", ".join(f"{m} (L^{exponents[m]:.2f})" for m in chosen) or "none") + ".",
             "Not: " + (", ".join(_exponent_note(m, e) for m, e in exponents.items()
                                  if m not in chosen) or "none") + "."]
    for dtype in ("float32", "bfloat16"):
        rows = read_cells(csv_path, dtype)
        body += ["", f"## {dtype}", ""]
        if not rows:
            body.append("No cell measured.")
            continue
        lengths = sorted({r["length"] for r in rows})
        body += ["Steps/s and memory (ratios to transformer: speed-up, memory fraction):",
                 "", ratio_table(rows, lengths), "",
                 "The benchmark's table (time per step, XLA's temporary memory, the "
                 "device's peak, growth exponents):", "",
                 benchmark.table(rows, lengths)]
    states = [status for _, status, _ in passes]
    status = ("complete" if all(s == "complete" for s in states)
              else "failed" if "failed" in states else "partial")
    detail = "; ".join(f"{name} {status}" for name, status, _ in passes)
    return StageResult(status, detail, "\n".join(body), commands)


def _exponent_note(model: str, exponent: float | None) -> str:
    if model == "transformer":
        return "transformer (the quadratic reference)"
    return f"{model} ({'too few cells' if exponent is None else f'L^{exponent:.2f}'})"


def listops_dir(suite: Suite) -> str:
    """The ListOps folder the runs read: the config's data_dir (data/listops for the full
    runs), or, for the dry run, a tiny set of the suite's own under --out."""
    if suite.plan is DRY:
        return os.path.join(suite.out, "data", "listops")
    from lra import sweep

    config = sweep.expected_config("listops", suite.plan.run_models[0], 0,
                                   suite.plan.run_config_arg, list(suite.plan.run_overrides))
    path = str(config["data_dir"])
    return path if os.path.isabs(path) else os.path.join(REPO, path)


def run_overrides(suite: Suite) -> list[str]:
    extra = [f"data_dir={suite.data_dir}"] if suite.plan is DRY else []
    return [*suite.plan.run_overrides, *extra]


def start_listops_generator(suite: Suite) -> None:
    """Generates the runs' ListOps set in the background if it is missing (two minutes
    on one core for LRA's 96k expressions, while the first stages use the device), into
    <folder>.partial, renamed when complete: a stopped generator never leaves a folder
    that looks like data."""
    suite.data_dir = listops_dir(suite)
    if os.path.isfile(os.path.join(suite.data_dir, "basic_train.tsv")):
        return
    partial = suite.data_dir + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    os.makedirs(suite.logs, exist_ok=True)
    cmd = [sys.executable, "-m", "lra.tasks.listops", f"--output_dir={partial}",
           *suite.plan.listops_args]
    _log(f"ListOps data missing in {suite.data_dir}: generating in the background: "
         f"{display(cmd)}")
    with open(os.path.join(suite.logs, "listops_data.log"), "ab") as log:
        suite.generator = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log,
                                           start_new_session=True)


def wait_for_listops(suite: Suite, limit: float) -> str | None:
    """None once the ListOps set is in place; else why the runs cannot start."""
    if suite.generator is not None:
        try:
            code = suite.generator.wait(timeout=max(limit, 1))
        except subprocess.TimeoutExpired:
            return (f"the ListOps set was still being generated at the stage's limit "
                    f"({os.path.join(suite.logs, 'listops_data.log')}); run again")
        suite.generator = None
        if code:
            return (f"generating the ListOps set failed (exit {code}, see "
                    f"{os.path.join(suite.logs, 'listops_data.log')})")
        os.replace(suite.data_dir + ".partial", suite.data_dir)
    from lra import sweep

    config = sweep.expected_config("listops", suite.plan.run_models[0], 0,
                                   suite.plan.run_config_arg, run_overrides(suite))
    return sweep.missing_data("listops", config)


def stage_runs(suite: Suite, limit: float) -> StageResult:
    """One lra.sweep per model, in RUN_ORDER, while time is left; stopped at the stage's
    limit with SIGTERM (launch.py saves a checkpoint: the next suite run resumes it)."""
    from lra import sweep

    plan, start = suite.plan, time.monotonic()
    sweep_dir = os.path.join(suite.out, "runs")
    overrides = run_overrides(suite)
    missing = wait_for_listops(suite, limit - RUN_GRACE_S)
    if missing:
        return StageResult("partial", missing.split(";")[0], missing + "\n", [])
    commands, states = [], {}
    for model in plan.run_models:
        left = limit - (time.monotonic() - start) - RUN_GRACE_S
        if left < plan.min_pass_s or left <= 0:
            states[model] = "not started: no time left"
            continue
        cmd = [sys.executable, "-m", "lra.sweep", "--task=listops", f"--models={model}",
               "--seeds=0", f"--sweep_dir={sweep_dir}", f"--config_arg={plan.run_config_arg}",
               *[f"--override={o}" for o in overrides]]
        _log(f"runs: {model} (limit {left:.0f} s): {display(cmd)}")
        commands.append(display(cmd))
        outcome = run_command(cmd, timeout=left, grace=RUN_GRACE_S, xla_flags=plan.xla_flags,
                              log_path=os.path.join(suite.logs, "runs.log"))
        said = [l for l in outcome.stdout.splitlines() if l.startswith("[")]
        states[model] = (f"stopped at the suite's limit after {outcome.seconds:.0f} s "
                         "(SIGTERM: launch.py saves a checkpoint; run the suite again to "
                         "resume)"
                         if outcome.timed_out else
                         said[-1].split(": ", 1)[-1] if said else outcome.describe())
    rows = []
    published = _published_listops()
    for model in plan.run_models:
        workdir = sweep.run_dir(sweep_dir, "listops", model, 0, overrides)
        rows.append(_run_row(model, workdir, states.get(model, ""), published.get(model)))
    finished = sum(os.path.exists(os.path.join(sweep.run_dir(sweep_dir, "listops", m, 0,
                                                             overrides), "results.json"))
                   for m in plan.run_models)
    size = ("its full size (LRA's: length 2000, 5000 steps)" if plan is FULL
            else f"`{plan.run_config_arg}` with {', '.join(plan.run_overrides)}")
    body = [f"ListOps at {size}, seed 0, from `{rel(suite.data_dir)}`; each run's "
            f"results.json in its folder under {rel(sweep_dir)}/. "
            f"Table 1: `python -m lra.report {rel(sweep_dir)}`.", "",
            "| model | state | steps | test acc | LRA (published) | best val acc | "
            "steps/s | input wait | device peak | folder |",
            "|---|---|---|---|---|---|---|---|---|---|", *rows]
    status = "complete" if finished == len(plan.run_models) else "partial"
    return StageResult(status, f"{finished} of {len(plan.run_models)} runs finished",
                       "\n".join(body), commands)


def _published_listops() -> dict[str, float]:
    """LRA's (Tay et al. 2021) ListOps accuracy per registry name."""
    with open(os.path.join(REPO, "lra", "published_results.json")) as f:
        results = json.load(f)["results"]
    return {r["model"]: r["accuracy"]["listops"] for r in results
            if r["source"] == "tay2021" and r["accuracy"].get("listops") is not None}


def _run_row(model: str, workdir: str, state: str, published: float | None) -> str:
    path = os.path.join(workdir, "results.json")
    folder = rel(workdir)
    pub = f"{published:.2f}" if published is not None else "-"
    if not os.path.exists(path):
        progress = _last_step(os.path.join(workdir, "log.txt"))
        state = state or "not started"
        return (f"| {model} | {state}{'; ' + progress if progress else ''} | - | - | {pub} | "
                f"- | - | - | - | {folder} |")
    with open(path) as f:
        r = json.load(f)
    peak = r.get("device_peak_bytes")
    wait = r.get("input_wait_fraction")
    return (f"| {model} | finished | {r.get('steps')} | {100 * r['test_accuracy']:.2f} | "
            f"{pub} | {100 * r['best_eval_accuracy']:.2f} | "
            f"{r.get('train_steps_per_sec') or 0:.2f} | "
            f"{'-' if wait is None else f'{100 * wait:.0f}%'} | "
            f"{_size(peak) if peak else '-'} | {folder} |")


def _last_step(log_path: str) -> str:
    """'step 1200/5000' from a run's last progress line, or ''."""
    if not os.path.exists(log_path):
        return ""
    with open(log_path, errors="replace") as f:
        steps = re.findall(r"^step\s+(\d+/\d+)", f.read(), re.M)
    return f"reached step {steps[-1]}" if steps else ""


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    filename: str
    title: str
    run: Callable[[Suite, float], StageResult]


STAGES = [
    Stage("kernel_tests", "kernels_tests.md",
          "Kernel tests, natively (Triton kernels compiled; float32 and bfloat16)",
          stage_kernel_tests),
    Stage("kernels", "kernels.md",
          "Pallas kernels against their XLA paths and dense attention (lra.bench_kernels)",
          stage_kernels),
    Stage("efficiency", "efficiency.md",
          "Efficiency: one training step of every variant (lra.benchmark, LRA's Table 2)",
          stage_efficiency),
    Stage("runs", "runs.md", "Full-size ListOps runs in the time left (lra.sweep)",
          stage_runs),
]


def write_summary(suite: Suite, started: float) -> None:
    lines = [f"# GPU suite: {suite.device['kind']}", "",
             f"jax {suite.device['jax']} · suite `{suite.command}` · mode {suite.plan.name}"
             f" · {time.monotonic() - started:.0f} s this run", "",
             "| stage | file | status |", "|---|---|---|"]
    for stage in STAGES:
        path = os.path.join(suite.out, stage.filename)
        status = "-"
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                m = re.search(r"^status: (.+)$", f.read(4000), re.M)
            status = m.group(1) if m else "?"
        lines.append(f"| {stage.name} | {stage.filename} | {status} |")
    write_atomic(os.path.join(suite.out, "summary.md"), "\n".join(lines) + "\n")


def run_stage(suite: Suite, stage: Stage, limit: float) -> str:
    """Runs one stage into its file; returns its status. An exception in the stage's own
    code is recorded like a failed command: the suite goes on."""
    path = os.path.join(suite.out, stage.filename)
    write_atomic(path, suite.header(stage.title, [], f"running (since "
                                    f"{time.strftime('%H:%M:%S')}, limit {limit:.0f} s)"))
    start = time.monotonic()
    try:
        result = stage.run(suite, limit)
    except Exception as e:  # noqa: BLE001  (a bug in one stage must not cost the others)
        first = str(e).splitlines()[0] if str(e) else ""
        result = StageResult("failed", f"{type(e).__name__}: {first}",
                             "```\n" + traceback.format_exc() + "```\n", [])
    took = time.monotonic() - start
    status = f"{result.status} in {took:.0f} s ({result.detail})"
    write_atomic(path, suite.header(stage.title, result.commands, status)
                 + result.body.rstrip() + "\n")
    _log(f"{stage.name}: {status} -> {path}")
    return result.status


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lra.gpu_suite",
        description="Kernel tests, kernel benchmark, efficiency table and full-size ListOps "
                    "runs on an accelerator, in one command (see the module docstring).")
    parser.add_argument("--out", default=None, help="Folder for the results (default "
                        "results/gpu; with --dry_run workdirs/gpu_suite_dry_run).")
    parser.add_argument("--budget_minutes", type=float, default=None,
                        help="Wall time for the whole suite (default 25; dry run 5).")
    parser.add_argument("--dry_run", action="store_true", help="Tiny sizes, for CPU.")
    parser.add_argument("--force", action="store_true",
                        help="Run the stages whose file says complete again.")
    parser.add_argument("--stages", default=",".join(s.name for s in STAGES),
                        help="Comma list of stages to run, from: "
                             + ", ".join(s.name for s in STAGES))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    plan = DRY if args.dry_run else FULL
    names = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [n for n in names if n not in SHARES]
    if unknown or not names:
        print(f"error: --stages={args.stages}: unknown stage {unknown[0] if unknown else ''!r}"
              f"; give a comma list of {', '.join(s.name for s in STAGES)}", file=sys.stderr)
        return 2
    budget = args.budget_minutes if args.budget_minutes is not None else (
        5 if args.dry_run else 25)
    if budget <= 0:
        print(f"error: --budget_minutes={budget:g} must be > 0", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out or ("workdirs/gpu_suite_dry_run" if args.dry_run
                                       else "results/gpu"))
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        print(f"error: cannot write --out={out}: {e.strerror or e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    selected = [s for s in STAGES if s.name in names]
    todo = [s for s in selected if args.force
            or file_status(os.path.join(out, s.filename)) != ("complete", plan.name)]
    for stage in selected:
        if stage not in todo:
            _log(f"{stage.name}: complete in {os.path.join(out, stage.filename)}, skipped "
                 "(--force runs it again)")
    if not todo:
        _log("every stage is complete")
        return 0
    try:
        device = probe_device()
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
        print(f"error: {e}; check `python -c 'import jax; print(jax.devices())'`",
              file=sys.stderr)
        return 2
    if device["platform"] == "cpu" and not args.dry_run:
        print(f"error: jax sees no accelerator (devices: {device['count']} x "
              f"{device['kind']}, jax {device['jax']}); the full sizes would take hours on "
              "CPU: install jax for the accelerator, or use --dry_run", file=sys.stderr)
        return 2
    suite = Suite(out=out, plan=plan, device=device,
                  command=display([sys.executable, "-m", "lra.gpu_suite", *argv]),
                  deadline=started + 60 * budget)
    _log(f"{device['kind']} ({device['platform']}), jax {device['jax']}; {plan.name}; "
         f"{budget:g} min for {', '.join(s.name for s in todo)} -> {out}")
    # SIGTERM (a scheduler's stop) unwinds like Ctrl-C: the running command's group is
    # stopped and the stage file keeps saying `running`.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    statuses = []
    try:
        if any(s.name == "runs" for s in todo):
            start_listops_generator(suite)
        for i, stage in enumerate(todo):
            later = todo[i:]
            limit = suite.left() * SHARES[stage.name] / sum(SHARES[s.name] for s in later)
            _log(f"stage {i + 1}/{len(todo)} {stage.name} (limit {limit:.0f} s)")
            statuses.append(run_stage(suite, stage, limit))
            write_summary(suite, started)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if suite.generator is not None and suite.generator.poll() is None:
            _stop_group(suite.generator, GRACE_S)
    _log(f"done in {time.monotonic() - started:.0f} s: "
         + ", ".join(f"{s.name} {st}" for s, st in zip(todo, statuses))
         + f"; {os.path.join(out, 'summary.md')}")
    # Out of time (partial) is what a budget means: run again to continue. A failed stage
    # (a crash, a command that could not run) is an error.
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
