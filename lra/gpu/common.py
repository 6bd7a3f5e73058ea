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

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# LRA's variants (Table 1) first, then the rest of the registry: when time runs out, the
# rows that can be set beside the paper are the ones measured.
LRA_VARIANTS = ["transformer", "local", "strided", "longformer", "linformer", "reformer",
                "sinkhorn", "synthesizer", "bigbird", "linear", "performer"]
# The order for the full-size runs: the baseline, then the fast families.
RUN_ORDER = ["transformer", "performer", "local", "linear", "linformer", "reformer",
             "sinkhorn", "synthesizer", "bigbird", "strided", "longformer"]

# A lent GPU gives 15 minutes of device time per session, its 1-2 minute start included,
# and at most 10 minutes per command: one call of the suite (`--budget_minutes`, default
# CALL_MINUTES) plans the stages that fit in its budget (`plan_call`), in STAGES' order,
# each with the seconds its Plan gives it (Plan.stage_seconds); a stage that does not fit
# waits for the next call. The first call on a fresh --out tunes the Triton kernels' tiles,
# runs the kernel tests and the 4K kernel table (450 s, the tuning stretched into the
# rest); the second the time-boxed full-size ListOps run of transformer and the efficiency
# table, then more runs (docs/gpu_suite.md).
CALL_MINUTES = 7.5
DRY_CALL_MINUTES = 14  # the dry run's stages, all in one call (DRY.stage_seconds)
# Seconds of a call that are not the suite's: installing the carried wheels, jax's first
# start in the probe, packing the results. A call's command ends within budget + this.
CALL_OVERHEAD_S = 30
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

# Seconds a stopped command gets between SIGTERM and SIGKILL; a run's launch.py saves a
# checkpoint then (the state of LRA's ListOps model: about 100 MB), so it gets more.
GRACE_S = 10
RUN_GRACE_S = 30


@dataclasses.dataclass(frozen=True)
class Plan:
    """The sizes of one mode: `FULL` on the accelerator, `DRY` on CPU."""
    name: str
    kernel_tests_k: str
    bench_kernels_args: tuple[str, ...]  # lra.bench_kernels' flags besides --lengths
    kernels_lengths: tuple[int, ...]  # the kernels stage (the first call's table)
    kernels_long_lengths: tuple[int, ...]  # the kernels_long stage
    bench_lengths: tuple[int, ...]
    long_lengths: tuple[int, ...]
    bf16_lengths: tuple[int, ...]
    bench_args: tuple[str, ...]  # sizes for lra.benchmark (none: the text config's own)
    run_models: tuple[str, ...]  # the runs stage's models (transformer has its own stage)
    run_config_arg: str
    run_overrides: tuple[str, ...]
    listops_args: tuple[str, ...]  # lra.tasks.listops flags besides --output_dir
    min_pass_s: float  # a benchmark pass or a run is not started with less time than this
    # Seconds each stage is planned with in a call (plan_call); a stage in `open_stages`
    # stretches: the call's spare seconds are shared among them in proportion to these.
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    open_stages: frozenset[str] = frozenset({"transformer", "efficiency", "runs"})
    kernel_tests_workers: int = 0  # pytest-xdist workers for the kernel tests (0: none)
    run_seconds: float = 0  # at most this per run in the runs stage (0: no cap)
    min_run_s: float = 0  # a run is not started with less (its start, some training, test)
    kernels_long_args: tuple[str, ...] = ()  # added to bench_kernels_args, kernels_long
    # Kept from a time-boxed run's limit for its test (a second launch.py: data, restore,
    # the cached compilations, the test split) after its training is stopped.
    test_reserve_s: float = 0
    max_train_s: float = 0  # a time-boxed run's training stops after this (0: its limit)
    transformer_overrides: tuple[str, ...] = ()  # after run_overrides, transformer stage
    bench_models: tuple[str, ...] | None = None  # None: every registered variant
    # The tune stage: lra.bench_kernels --tune per section at these lengths; with
    # merge_tuning, its table is merged into this checkout's models/kernels/tuning.json,
    # which the later stages' commands read (on CPU no section: --tune refuses there).
    tune_sections: tuple[str, ...] = ()
    tune_lengths: tuple[int, ...] = ()
    merge_tuning: bool = False
    bench_lra_only: bool = False  # with bench_models None: LRA's variants only
    xla_flags: str = ""  # added to XLA_FLAGS for every command


FULL = Plan(
    name="full",
    kernel_tests_k=KERNEL_TESTS_NATIVE,
    kernel_tests_workers=4,  # compiling is most of a test: 16 cores, one GPU shared
    bench_kernels_args=("--dtype=bfloat16",),
    kernels_lengths=(4096,),
    kernels_long_lengths=(8192, 16384),
    bench_lengths=(1024, 2048, 3072, 4096),  # LRA's Table 2 columns
    long_lengths=(8192, 16384),
    bf16_lengths=(1024, 2048, 3072, 4096),
    bench_args=(),
    run_models=tuple(m for m in RUN_ORDER if m != "transformer"),
    run_config_arg="",
    run_overrides=(),
    listops_args=(),  # LRA's 96k/2k/2k expressions of 500-2000 tokens
    min_pass_s=60,
    # LRA's ten and transformer (Table 2's rows). Measured on an H100 (results/gpu/,
    # 2026-11-28): a cell (a fresh process: jax's start, one compile, the timed steps)
    # takes 30-35 s, so every registered variant (47 x 4 lengths x 2 dtypes) would be
    # about 3.5 hours of device time; these 11 are about 25 minutes a dtype, resumable.
    bench_lra_only=True,
    # Measured before the tune stage: kernel_tests took 68 s on an
    # H200 (results/gpu/h200) before test_delta_rule.py (about 15 Triton compilations and
    # two tests of ListOps training steps through the config, like flash's 20 s ones on a
    # GPU; in 4 workers).
    # kernels: lra.bench_kernels at 4K bf16 took 95 s for its first three sections there;
    # the delta-rule section adds 12 compilations, Triton's delta-rule kernels the largest
    # (neither yet timed on a GPU), less the dense references it and the block-sparse
    # section now reuse from the linear section's: 160 s. What they leave goes to the
    # transformer run after them (an open stage). The second: efficiency and one
    # time-boxed run (150 + 240 s, the spare 60 s shared); kernels_long (8K, 16K) with a
    # bigger budget, or once the others are complete.
    # tune first (issue 70: the kernels stage then times the tuned tiles): the block-sparse
    # kernel's 12 candidates at 4K (its cuDNN goal), then linear's 12, decayed's and the
    # delta rule's 8 each, a compilation and a few calls each; a section not reached in
    # its time is tuned by the next call. The first call: tune 90 + kernel_tests 120 +
    # kernels 160 = 370 s, the spare 80 s to tune; transformer (170) waits for the second.
    tune_sections=("block_sparse", "linear", "decayed", "delta"),
    tune_lengths=(4096,),
    merge_tuning=True,
    stage_seconds={"tune": 90, "kernel_tests": 120, "kernels": 160, "transformer": 170,
                   "efficiency": 150, "runs": 240, "kernels_long": 150},
    # tune stretches: the first call's 80 spare seconds go to it (170 s for four kernels).
    open_stages=frozenset({"tune", "transformer", "efficiency", "runs"}),
    run_seconds=300,
    # About 60 s to read the data and compile, 60 s of training at least, the test.
    min_run_s=210,
    test_reserve_s=75,
)

DRY = Plan(
    name="dry run",
    # The Triton flavour in both dtypes (interpreted on CPU).
    kernel_tests_k="linear_attention and (triton-float32-causal or triton-bfloat16-causal)",
    # Every section, each through one case where a case is mostly compile time (on 2 busy
    # cores: a decay kind 3.5 s, a delta rule 10 s): the plumbing, not the speed.
    bench_kernels_args=("--batch_size=1", "--num_heads=1", "--head_dim=16",
                        "--repeats=1", "--modes=causal", "--densities=1.0,0.5",
                        "--decays=scalar", "--delta_rules=gated_deltanet",
                        "--block_size=16", "--dtype=float32", "--interpret"),
    kernels_lengths=(64,),
    kernels_long_lengths=(32,),
    kernels_long_args=("--sections=linear",),
    bench_lengths=(32, 64),
    long_lengths=(128,),
    bf16_lengths=(64,),
    # --repeats=0: compile and report memory only; the timed path is the benchmark's own
    # (tests/test_benchmark.py), and compiling is most of a tiny cell's cost on CPU.
    bench_args=("--batch_size=2", "--dim=16", "--num_heads=2", "--num_layers=1",
                "--repeats=0"),
    run_models=("linear",),
    run_config_arg="runlocal",
    run_overrides=("num_train_steps=2", "eval_frequency=2", "num_eval_steps=1",
                   "checkpoint_freq=2", "max_length=48"),
    # tests/conftest.py's tiny set: generated in well under a second.
    listops_args=("--num_train_samples=256", "--num_valid_samples=64",
                  "--num_test_samples=64", "--min_length=5", "--max_length=40",
                  "--max_depth=3", "--max_args=4"),
    min_pass_s=0,
    # Limits only (every stage in one call): on 2 busy cores the dry run takes 1-4 minutes;
    # the transformer stage's run is time-boxed by max_train_s, not by its limit.
    stage_seconds={"tune": 30, "kernel_tests": 120, "kernels": 120, "transformer": 150,
                   "efficiency": 180, "runs": 120, "kernels_long": 120},
    test_reserve_s=20,
    # The transformer stage's run is time-boxed as on a GPU: more steps than its training
    # time allows, stopped (SIGTERM, a checkpoint), then tested at the step it reached.
    max_train_s=4,
    transformer_overrides=("num_train_steps=100000", "eval_frequency=20",
                           "checkpoint_freq=100000", "log_every_steps=20"),
    bench_models=("transformer", "linear"),
    # The dry run checks the plumbing, not speed: XLA's backend optimisation is most of a
    # tiny program's compile time on CPU (a runlocal run: 12 s with it, 7 s without).
    xla_flags="--xla_backend_optimization_level=0",
)


def plan_call(names: list[str], budget_s: float, plan: Plan) -> list[tuple[str, float]]:
    """The stages of `names` (in that order: the stages not complete yet) that one call of
    `budget_s` seconds runs, each with its planned seconds: in order, every stage whose
    seconds fit in what the stages before it left (one that does not fit waits for the
    next call, a later one that fits still runs). The spare seconds are shared among the
    planned open stages (Plan.open_stages) in proportion to their seconds; without one, the
    last planned stage gets them. The planned seconds add up to `budget_s` when any stage
    fits."""
    planned, left = [], budget_s
    for name in names:
        seconds = plan.stage_seconds[name]
        if seconds <= left:
            planned.append([name, float(seconds)])
            left -= seconds
    if not planned:
        return []
    stretch = [p for p in planned if p[0] in plan.open_stages] or [planned[-1]]
    weight = sum(p[1] for p in stretch)
    for p in stretch:
        p[1] += left * p[1] / weight
    return [(name, seconds) for name, seconds in planned]


def stage_limit(planned: list[tuple[str, float]], i: int, left: float, plan: Plan) -> float:
    """Seconds for planned stage i when `left` seconds of the call remain: its planned
    seconds, plus (or minus) what the stages before it left over (or overran), shared
    like plan_call's spare among it and the open stages after it."""
    later = planned[i:]
    spare = left - sum(s for _, s in later)
    stretch = [(n, s) for n, s in later if n in plan.open_stages] or [later[-1]]
    name, seconds = planned[i]
    if name not in [n for n, _ in stretch]:
        return max(seconds + min(spare, 0), 0)
    return max(seconds + spare * seconds / sum(s for _, s in stretch), 0)


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
                xla_flags: str = "", env: dict[str, str] | None = None) -> Outcome:
    """Runs `cmd` in the repository, in a process group of its own, for at most `timeout`
    seconds (then SIGTERM, and SIGKILL `grace` seconds later). stderr is appended to
    `log_path`, stdout too and also returned (a stopped command's output so far
    included). `env`: variables added to this process's."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    out_path = log_path + ".stdout"
    # Unbuffered: a command stopped at its limit has written what it printed.
    env = dict(os.environ, **(env or {}), PYTHONUNBUFFERED="1")
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


# --- the wheels a GPU image lacks ---------------------------------------------------------

# The Python packages of the lent GPU machines' image (Python 3.12) that the suite's
# commands, or the wheels carried for it, need; from the device tool's package list of
# that image (2026-11-17), which lists 190 packages. `make gpu-wheels` carries the rest.
GPU_IMAGE_PACKAGES = (
    "absl-py", "chex", "cloudpickle", "etils", "flax", "fsspec", "hypothesis", "jax",
    "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "matplotlib", "ml-dtypes", "msgpack",
    "numpy", "opt-einsum", "optax", "orbax-checkpoint", "packaging", "pillow", "protobuf",
    "psutil", "pytest", "pytest-xdist", "pyyaml", "scipy", "tensorstore", "triton",
    "typing-extensions", "zipp")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_requirements(folder: str) -> tuple[dict[str, list[str]], list[str]]:
    """({carried package: its versions}, the names its wheels require) for the wheels in
    `folder` (Requires-Dist without extras, environment markers evaluated for Linux and
    CPython 3.12)."""
    import glob
    import zipfile

    try:
        from packaging.markers import Marker
    except ImportError:  # pip vendors it; without it, every marker counts as true
        Marker = None  # noqa: N806
    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "extra": ""}
    carried, needs = {}, set()
    for path in sorted(glob.glob(os.path.join(folder, "*.whl"))):
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            text = z.read(meta).decode("utf-8", "replace")
        fields = dict(re.findall(r"^(Name|Version): (.+)$", text, re.M))
        carried.setdefault(_normal(fields["Name"]), []).append(fields["Version"].strip())
        for req in re.findall(r"^Requires-Dist: (.+)$", text, re.M):
            spec, _, marker = req.partition(";")
            if "extra" in marker:
                continue
            if marker.strip() and Marker is not None and not Marker(marker).evaluate(env):
                continue
            needs.add(_normal(re.match(r"[A-Za-z0-9_.-]+", spec.strip()).group(0)))
    return carried, sorted(needs)


def check_wheels(folder: str) -> int:
    """Prints what `folder` carries and where each of its requirements comes from; 1 when
    a requirement is neither carried nor in GPU_IMAGE_PACKAGES, or a package is carried
    in two versions (pip would refuse the install), else 0."""
    carried, needs = wheel_requirements(folder)
    image = {_normal(p) for p in GPU_IMAGE_PACKAGES}
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
               if f.endswith(".whl"))
    print(f"{folder}: " + ", ".join(f"{n} {'/'.join(v)}" for n, v in sorted(carried.items()))
          + f" ({size / 2**20:.1f} MiB)")
    from_image = [n for n in needs if n not in carried and n in image]
    missing = [n for n in needs if n not in carried and n not in image]
    twice = [n for n, v in carried.items() if len(v) > 1]
    print("their requirements that the GPU image has: " + (", ".join(from_image) or "none"))
    if missing:
        print("error: required but neither carried nor in the GPU image: " + ", ".join(missing))
    if twice:
        print("error: carried in more than one version: " + ", ".join(twice))
    return 1 if missing or twice or not carried else 0


# --- the device and the files' headers --------------------------------------------------

# What the suite's commands import besides jax that a GPU image may lack (the wheels
# `make gpu-wheels` carries): the probe names those that do not import.
NEEDED_MODULES = ("ml_collections", "grain", "tensorboardX", "flax", "optax", "orbax.checkpoint",
                  "absl", "pytest")

_PROBE = ("import importlib, json, jax, jaxlib; d = jax.devices()\n"
          "missing = []\n"
          f"for name in {NEEDED_MODULES!r}:\n"
          "    try:\n"
          "        importlib.import_module(name)\n"
          "    except Exception as e:\n"
          "        missing.append(f'{name} ({type(e).__name__}: {str(e)[:80]})')\n"
          "print(json.dumps({'kind': d[0].device_kind, 'platform': d[0].platform, "
          "'count': len(d), 'jax': jax.__version__, 'jaxlib': jaxlib.__version__, "
          "'missing': missing}))")


def probe_device() -> dict:
    """The device as jax sees it, asked in a subprocess (this process must not claim the
    accelerator's memory); a RuntimeError says why when jax cannot start."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"jax did not start (exit {proc.returncode}): {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# HBM bandwidth (GB/s) from NVIDIA's datasheets, matched like the peaks above.
HBM_GBPS = (("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0), ("H200", 4800.0),
            ("A100-SXM4-80GB", 2039.0), ("A100", 1555.0))


def hbm_gbps(device_kind: str) -> float | None:
    for name, gbps in HBM_GBPS:
        if name in device_kind:
            return gbps
    return None


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
