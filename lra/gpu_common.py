"""The GPU suite's shared parts (lra.gpu_suite runs them): the plan of each mode (`Plan`,
`FULL`, `DRY` and the suite's constants), running a command in its own process group
within a time limit (`run_command`), the device probe and the stage files' headers and
status, and the `Suite` and `StageResult` the stages take and return."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

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
