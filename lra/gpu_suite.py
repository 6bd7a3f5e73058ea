r"""Everything an accelerator should measure, a call at a time, in order of value.

  python -m lra.gpu_suite [--out=results/gpu] [--budget_minutes=7.5] [--pack=PATH]
  python -m lra.gpu_suite --plan         # what the next call runs (nothing is run)
  python -m lra.gpu_suite --dry_run      # the same path at tiny sizes on CPU

A lent GPU gives 15 minutes of device time per session (its 1-2 minute start included)
and at most 10 minutes per command. So the suite runs in calls: each call plans the stages
that fit in --budget_minutes (default 7.5: the command ends within 8 minutes, wheels
installed), in this order, each with the seconds the plan gives it (lra.gpu.common.FULL's
stage_seconds); a stage that does not fit waits for the next call. The next call (the same
command, the same --out) skips the stages whose file says complete and plans the rest:

  0. tune (90 s)    `lra.bench_kernels --tune` at 4K (bfloat16), a kernel per command
                   (block-sparse, linear, decayed, delta rule): each Triton kernel's
                   fastest tile x num_warps x num_stages -> tuning.md, tuning.json, merged
                   into the checkout's models/kernels/tuning.json for the stages after it
                   (and at the start of every later call); commit it from there
  1. kernel_tests (120 s)  `pytest tests/kernels` natively (Triton kernels compiled, not
                   interpreted; float32 and bfloat16, slow cases included; 4 xdist
                   workers) -> kernels_tests.md
  2. kernels (160 s) `lra.bench_kernels` at L=4096 (bfloat16): linear, decayed linear and
                   block-sparse attention and the delta rule (deltanet, gated_deltanet)
                   against their XLA paths and jax.nn.dot_product_attention (cuDNN and
                   XLA), with TFLOP/s and the fraction of the device's bf16 peak
                   -> kernels.md
  3. transformer (170 s, stretches) one ListOps run of `transformer` at LRA's full size,
                   trained for the time the stage has, stopped (SIGTERM: a checkpoint) and
                   tested where it stopped, its test accuracy beside LRA's 36.37 and its
                   steps beside LRA's 5000 -> transformer.md
     (the first call: tune, kernel_tests and kernels, 370 s; transformer waits)
  4. efficiency (150 s, stretches) `lra.benchmark` (one training step of LRA's text
                   model) for LRA's ten and transformer at 1K-4K in float32; 8K and 16K for the
                   variants whose memory grew at most L^1.5 over 1K-4K; then a bfloat16
                   pass -> efficiency.md, efficiency.csv (the benchmark's resumable CSV)
  5. runs (240 s, stretches) time-boxed full-size ListOps runs of the other variants
                   (performer, local, linear, then LRA's others), at most 300 s each,
                   each tested where it stopped -> runs.md
     (the second call at 7.5 minutes: transformer, efficiency and a run's start)
  6. kernels_long (150 s) `lra.bench_kernels` at 8K and 16K -> kernels_long.md

data/listops is generated in the background at the start of a call that runs stages 3 or
5, when missing (about two minutes of one core, while the first stages use the device).
The seconds of a stage that finishes early go to the stretching stages after it.

Every file begins with the device (jax.devices()[0].device_kind), the jax version, the date,
the suite's command and each command the stage ran; `status:` says complete, partial (out
of time: the next call continues), failed or running (the suite was stopped). summary.md
lists the stages and this call's plan. Logs (each command's whole output) go to
<out>/logs/, each run's log.txt and stderr.txt to its folder under <out>/runs/.

Time: each command runs in its own process group and is stopped (SIGTERM, then SIGKILL) at
its stage's limit; nothing is left running when a call returns. What was done survives:
bench_kernels' lengths as each completes, the benchmark's CSV cell by cell, the runs'
results.json (and checkpoints, git-ignored, on the machine that trained them).
--force runs complete stages again (the CSV and the runs are still reused: a run with
a checkpoint trains on from it).

--pack=PATH writes --out without the checkpoints as a .tar.gz at the end: what a call on a
lent machine brings back (unpack it into results/ here before the next call, so that the
next call, on whatever machine, skips what is complete).

--dry_run: the same code path at tiny sizes, meant for CPU (the Pallas kernels interpreted),
every stage in one call: two kernel tests (-k), bench_kernels at L=64 (every section, one
decay kind and gated_deltanet only) and 32 (linear), the benchmark
for transformer and linear at L=32/64 (and 128) with 16-wide one-layer models (compile and
memory only), a `runlocal` ListOps transformer time-boxed at 4 s of training and tested
where it stopped, and a 2-step `linear` run, on a generated tiny set. Default --out:
workdirs/gpu_suite_dry_run.

Exit status: 0 unless a stage failed (running out of time is not a failure: run again);
2 for a usage error, when jax sees only a CPU at full size, or when a module the commands
need does not import (the wheels `make gpu-wheels` carries).

The suite's own process never touches the accelerator (the device is probed in a
subprocess): the commands it starts need all of the device's memory.

This file is the flow (the stage list, main); the stages are in lra/gpu/bench_stages.py
(kernel tests, kernels, efficiency) and lra/gpu/run_stages.py (the ListOps runs), the
plans, running commands, the device probe and the files' headers in lra/gpu/common.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from typing import Callable

from lra.gpu.common import (CALL_MINUTES, DRY, DRY_CALL_MINUTES, FULL, GRACE_S, REPO,
                            StageResult, Suite, _log, _stop_group, display, file_status,
                            plan_call, probe_device, stage_limit, write_atomic)
from lra.gpu.bench_stages import (merge_tuning, stage_efficiency, stage_kernel_tests,
                                  stage_kernels, stage_kernels_long, stage_tune)
from lra.gpu.run_stages import stage_runs, stage_transformer, start_listops_generator
# Re-exported: tests and users reach these as gpu_suite.X (to stand in for one, patch the
# module that calls it: lra.gpu.bench_stages.run_command, not gpu_suite.run_command).
from lra.gpu.common import RUN_ORDER, Outcome, run_command  # noqa: F401
from lra.gpu.bench_stages import ratio_table, subquadratic  # noqa: F401


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    filename: str
    title: str
    run: Callable[[Suite, float], StageResult]


STAGES = [
    Stage("tune", "tuning.md",
          "Triton tiles and launch parameters tuned on this device (lra.bench_kernels --tune)",
          stage_tune),
    Stage("kernel_tests", "kernels_tests.md",
          "Kernel tests, natively (Triton kernels compiled; float32 and bfloat16)",
          stage_kernel_tests),
    Stage("kernels", "kernels.md",
          "Pallas kernels against their XLA paths and dense attention (lra.bench_kernels)",
          stage_kernels),
    Stage("transformer", "transformer.md",
          "One full-size ListOps run of transformer, time-boxed, beside LRA's accuracy",
          stage_transformer),
    Stage("efficiency", "efficiency.md",
          "Efficiency: one training step of LRA's ten variants (lra.benchmark, LRA's Table 2)",
          stage_efficiency),
    Stage("runs", "runs.md", "Full-size ListOps runs of the other variants, time-boxed",
          stage_runs),
    Stage("kernels_long", "kernels_long.md",
          "Pallas kernels at the longer lengths (lra.bench_kernels)", stage_kernels_long),
]
STAGE_NAMES = [s.name for s in STAGES]

# Stages that read the ListOps set (generated in the background at the call's start).
NEEDS_LISTOPS = ("transformer", "runs")


def write_summary(suite: Suite, started: float, planned: list[tuple[str, float]],
                  budget_s: float) -> None:
    lines = [f"# GPU suite: {suite.device['kind']}", "",
             f"jax {suite.device['jax']} · suite `{suite.command}` · mode {suite.plan.name}"
             f" · {time.monotonic() - started:.0f} s this call of {budget_s:.0f} s", "",
             "| stage | file | this call | status |", "|---|---|---|---|"]
    seconds = dict(planned)
    for stage in STAGES:
        path = os.path.join(suite.out, stage.filename)
        status = "-"
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                m = re.search(r"^status: (.+)$", f.read(4000), re.M)
            status = m.group(1) if m else "?"
        when = f"planned {seconds[stage.name]:.0f} s" if stage.name in seconds else "-"
        lines.append(f"| {stage.name} | {stage.filename} | {when} | {status} |")
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
    status = f"{result.status} in {took:.0f} s of {limit:.0f} s ({result.detail})"
    write_atomic(path, suite.header(stage.title, result.commands, status)
                 + result.body.rstrip() + "\n")
    _log(f"{stage.name}: {status} -> {path}")
    return result.status


def describe_plan(planned: list[tuple[str, float]], waiting: list[str],
                  budget_s: float) -> str:
    """One line: the stages of this call with their seconds, and those left for the next."""
    this = ", ".join(f"{n} {s:.0f} s" for n, s in planned) or "nothing fits"
    return (f"this call ({budget_s:.0f} s): {this}"
            + (f"; next call: {', '.join(waiting)}" if waiting else ""))


def pack(out: str, path: str) -> None:
    """<out> as a .tar.gz at `path` (the folder's name at its root), without the runs'
    checkpoints and the dry run's generated data: what a call brings back."""
    import tarfile

    def keep(info: tarfile.TarInfo):
        parts = info.name.split("/")
        if "checkpoints" in parts or parts[1:3] == ["data", "listops"] or \
                parts[1:2] == ["data"] and len(parts) == 2 or info.name.endswith(".partial"):
            return None
        return info

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tarfile.open(path + ".tmp", "w:gz") as tar:
        tar.add(out, arcname=os.path.basename(out.rstrip("/")), filter=keep)
    os.replace(path + ".tmp", path)
    _log(f"packed {out} (without checkpoints) into {path} "
         f"({os.path.getsize(path) / 2**20:.1f} MiB)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lra.gpu_suite",
        description="Kernel tests, kernel benchmark, a time-boxed full-size ListOps run, "
                    "the efficiency table and more runs on an accelerator, a call at a time "
                    "(see the module docstring).")
    parser.add_argument("--out", default=None, help="Folder for the results (default "
                        "results/gpu; with --dry_run workdirs/gpu_suite_dry_run).")
    parser.add_argument("--budget_minutes", type=float, default=None,
                        help=f"Wall time for this call's stages (default {CALL_MINUTES:g}: "
                        "the first call tunes the kernels' tiles, runs the kernel tests and "
                        f"the 4K kernel table; dry run {DRY_CALL_MINUTES:g}).")
    parser.add_argument("--dry_run", action="store_true", help="Tiny sizes, for CPU.")
    parser.add_argument("--force", action="store_true",
                        help="Run the stages whose file says complete again.")
    parser.add_argument("--stages", default=",".join(STAGE_NAMES),
                        help="Comma list of stages to run, from: " + ", ".join(STAGE_NAMES))
    parser.add_argument("--plan", action="store_true",
                        help="Print what this call would run, and the seconds each stage "
                        "is given, then stop (nothing is run, the device is not probed).")
    parser.add_argument("--pack", default=None, metavar="PATH",
                        help="At the end (also after a failure), write --out without the "
                        "runs' checkpoints as a .tar.gz at PATH (what a call brings back).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    plan = DRY if args.dry_run else FULL
    names = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [n for n in names if n not in STAGE_NAMES]
    if unknown or not names:
        print(f"error: --stages={args.stages}: unknown stage {unknown[0] if unknown else ''!r}"
              f"; give a comma list of {', '.join(STAGE_NAMES)}", file=sys.stderr)
        return 2
    budget = args.budget_minutes if args.budget_minutes is not None else (
        DRY_CALL_MINUTES if args.dry_run else CALL_MINUTES)
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
    planned = plan_call([s.name for s in todo], 60 * budget, plan)
    waiting = [s.name for s in todo if s.name not in dict(planned)]
    line = describe_plan(planned, waiting, 60 * budget)
    if args.plan:
        print(f"{plan.name}, --out={out}: " + (line if todo else "every stage is complete"))
        return 0
    try:
        return _run_call(args, argv, plan, out, started, budget, todo, planned, line)
    finally:
        if args.pack:
            try:
                pack(out, os.path.abspath(args.pack))
            except OSError as e:  # what was measured stays in --out
                _log(f"error: could not pack {out} into {args.pack}: {e}")


def _run_call(args, argv, plan, out, started, budget, todo, planned, line) -> int:
    if not todo:
        _log("every stage is complete")
        return 0
    if not planned:
        _log(f"no stage fits in {budget:g} minutes ({line}); give a bigger --budget_minutes")
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
    if device.get("missing"):
        print(f"error: cannot import {', '.join(device['missing'])} (the runs and the "
              "benchmark need them): carry the wheels `make gpu-wheels` makes and install "
              "them first (docs/gpu_suite.md)", file=sys.stderr)
        return 2
    # One XLA compilation cache for every command of the suite, kept between calls where
    # the machine is (git-ignored): a run's test reuses its training's compilations.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                          os.path.join(REPO, "workdirs", "gpu_suite_xla_cache"))
    suite = Suite(out=out, plan=plan, device=device,
                  command=display([sys.executable, "-m", "lra.gpu_suite", *argv]),
                  deadline=started + 60 * budget)
    _log(f"{device['kind']} ({device['platform']}), jax {device['jax']}; {plan.name}; "
         f"{line} -> {out}")
    # SIGTERM (a scheduler's stop) unwinds like Ctrl-C: the running command's group is
    # stopped and the stage file keeps saying `running`.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stages = {s.name: s for s in STAGES}
    statuses = []
    # An earlier call's tuned tiles (a fresh machine's checkout has the committed table):
    # this call's kernels run with them.
    merge_tuning(suite)
    try:
        if any(name in NEEDS_LISTOPS for name, _ in planned):
            start_listops_generator(suite)
        for i, (name, _) in enumerate(planned):
            limit = stage_limit(planned, i, suite.left(), plan)
            _log(f"stage {i + 1}/{len(planned)} {name} (limit {limit:.0f} s)")
            statuses.append(run_stage(suite, stages[name], limit))
            write_summary(suite, started, planned, 60 * budget)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if suite.generator is not None and suite.generator.poll() is None:
            _stop_group(suite.generator, GRACE_S)
    _log(f"done in {time.monotonic() - started:.0f} s: "
         + ", ".join(f"{name} {st}" for (name, _), st in zip(planned, statuses))
         + f"; {os.path.join(out, 'summary.md')}")
    # Out of time (partial) is what a budget means: run again to continue. A failed stage
    # (a crash, a command that could not run) is an error.
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
