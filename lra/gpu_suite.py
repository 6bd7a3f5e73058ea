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

This file is the flow (the stage list, main); the stages are in lra/gpu_stages.py, the plan,
running commands, the device probe and the files' headers in lra/gpu_common.py.
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

from lra.gpu_common import (DRY, FULL, GRACE_S, SHARES, StageResult, Suite, _log, _stop_group,
                            display, file_status, probe_device, write_atomic)
from lra.gpu_stages import (stage_efficiency, stage_kernel_tests, stage_kernels, stage_runs,
                            start_listops_generator)
# Re-exported: tests and users reach these as gpu_suite.X (to stand in for one, patch the
# module that calls it: gpu_stages.run_command, not gpu_suite.run_command).
from lra.gpu_common import REPO, RUN_ORDER, Outcome, run_command  # noqa: F401
from lra.gpu_stages import ratio_table, subquadratic  # noqa: F401


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
