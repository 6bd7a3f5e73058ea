"""The GPU suite's six stages (lra.gpu_suite plans them a call at a time): the native
kernel tests and their summary; lra.bench_kernels, a length per command, with the fraction
of the device's bf16 peak (kernels at 4K, kernels_long at 8K/16K); the time-boxed
full-size ListOps runs (transformer's, then the others', each trained until its deadline
and tested where it stopped); the efficiency passes of lra.benchmark with their tables and
the choice of the sub-quadratic variants. Each stage is a function
(suite, limit in seconds) -> StageResult that ends within its limit."""
from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time

from lra.gpu_common import (DRY, FULL, GRACE_S, LRA_VARIANTS, PASS_SHARES, REPO,
                            RUN_GRACE_S, SUBQUADRATIC_MAX_EXPONENT, Plan, StageResult, Suite,
                            _log, _size, _stop_group, bf16_peak_tflops, display, rel,
                            run_command, write_atomic)


# --- kernel_tests: pytest tests/kernels ------------------------------------------------


def stage_kernel_tests(suite: Suite, limit: float) -> StageResult:
    """pytest tests/kernels (-v: each outcome is a line, kept when the run is stopped)."""
    workers = suite.plan.kernel_tests_workers
    cmd = [sys.executable, "-m", "pytest", "tests/kernels", "-v", "-rfE", "--durations=15",
           "-p", "no:cacheprovider", "-m", "", "-k", suite.plan.kernel_tests_k,
           *(["-n", str(workers)] if workers else [])]
    # Several pytest workers share the one GPU: each takes memory as it needs it, not
    # jax's default 75% of the device at its start.
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"} if workers else {}
    outcome = run_command(cmd, timeout=limit - GRACE_S - 5, xla_flags=suite.plan.xla_flags,
                          log_path=os.path.join(suite.logs, "kernel_tests.log"), env=env)
    tests = parse_pytest(outcome.stdout)
    body = [f"Selection: `-m \"\" -k \"{suite.plan.kernel_tests_k}\"` (slow cases included; "
            "on an accelerator the Triton flavour runs compiled, on CPU interpreted)"
            + (f", in {workers} pytest-xdist workers sharing the device (memory taken as "
               "needed: XLA_PYTHON_CLIENT_PREALLOCATE=false)" if workers else "") + ". "
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


_OUTCOMES = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
_PYTEST_LINE = re.compile(rf"^(tests/\S+::\S+) ({_OUTCOMES})\b")
# pytest-xdist's -v: `[gw1] [ 12%] PASSED tests/kernels/test_x.py::test_y[a-b] `
_XDIST_LINE = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] ({_OUTCOMES}) (tests/\S+::\S+)")


def parse_pytest(stdout: str) -> dict[str, str]:
    """{test id: outcome} from `pytest -v` output, with or without pytest-xdist."""
    tests = {}
    for line in stdout.splitlines():
        m = _PYTEST_LINE.match(line)
        if m:
            tests[m.group(1)] = m.group(2)
            continue
        m = _XDIST_LINE.match(line)
        if m:
            tests[m.group(2)] = m.group(1)
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


# --- kernels: lra.bench_kernels --------------------------------------------------------


def stage_kernels(suite: Suite, limit: float) -> StageResult:
    """lra.bench_kernels at the first call's length (LRA's 4K), with the fraction of the
    device's bf16 peak."""
    return _bench_kernels(suite, limit, suite.plan.kernels_lengths, "kernels")


def stage_kernels_long(suite: Suite, limit: float) -> StageResult:
    """lra.bench_kernels at the longer lengths (8K, 16K)."""
    return _bench_kernels(suite, limit, suite.plan.kernels_long_lengths, "kernels_long",
                          suite.plan.kernels_long_args)


# A length is not started with less time than this (one length's three sections: about
# 45 compilations, seconds each).
KERNELS_MIN_S = 20


def _bench_kernels(suite: Suite, limit: float, lengths: tuple[int, ...], name: str,
                   extra: tuple[str, ...] = ()) -> StageResult:
    """One lra.bench_kernels per length, shortest first, each length's whole output kept in
    <out>/logs/<name>_L<length>.md once it completes (a rerun runs only the lengths that
    lack one); the tables of every length merged, with the % of the bf16 peak."""
    start, outputs, commands, states = time.monotonic(), [], [], []
    for length in lengths:
        cmd = [sys.executable, "-m", "lra.bench_kernels", f"--lengths={length}",
               *suite.plan.bench_kernels_args, *extra]
        done = os.path.join(suite.logs, f"{name}_L{length}.md")
        stamp = f"command: {display(cmd)}\n"
        if os.path.exists(done):
            with open(done, encoding="utf-8") as f:
                text = f.read()
            if text.startswith(stamp):  # the same command: measured already
                outputs.append(text[len(stamp):])
                states.append(f"L={length} complete earlier")
                continue
        left = limit - (time.monotonic() - start) - GRACE_S - 5  # SIGTERM, then SIGKILL
        if left < min(KERNELS_MIN_S, limit / 2):
            states.append(f"L={length} not started: no time left")
            continue
        commands.append(display(cmd))
        _log(f"{name}: L={length} (limit {left:.0f} s): {display(cmd)}")
        outcome = run_command(cmd, timeout=left, xla_flags=suite.plan.xla_flags,
                              log_path=os.path.join(suite.logs, f"{name}.log"))
        outputs.append(outcome.stdout)
        if outcome.returncode == 0:
            write_atomic(done, stamp + outcome.stdout)
            states.append(f"L={length} {outcome.describe()}")
        else:
            states.append(f"L={length} {'partial' if outcome.timed_out else 'failed'}: "
                          f"{outcome.describe()}")
    bf16 = "--dtype=bfloat16" in suite.plan.bench_kernels_args
    peak = bf16_peak_tflops(suite.device["kind"]) if bf16 else None
    note = (f"% peak: TFLOP/s over {peak:g} TFLOP/s, the device's dense bf16 peak "
            "(NVIDIA's datasheet)." if peak else
            f"No % of peak: no bf16 peak known for {suite.device['kind']}"
            + ("" if bf16 else " (and the inputs are not bfloat16)") + ".")
    body = (f"Lengths {', '.join(map(str, lengths))}: " + "; ".join(states) + ".\n\n"
            f"{note}\n\n{with_peak_fraction(merge_bench_outputs(outputs), peak)}")
    status = ("failed" if any(": exit" in s for s in states)
              else "complete" if all("complete" in s or "done in" in s for s in states)
              else "partial")
    return StageResult(status, "; ".join(states), body, commands)


def merge_bench_outputs(outputs: list[str]) -> str:
    """lra.bench_kernels' outputs (one per length) as one: the first `device:` line, then
    each section once (its text from the first output that has it, its table's rows from
    every output, in order)."""
    head, sections = "", {}
    for text in outputs:
        section, table_lines = None, 0
        for line in text.splitlines():
            if line.startswith("### "):
                section = sections.setdefault(line, {"text": [], "table": [], "owner": text})
                table_lines = 0
            elif section is None:
                head = head or line.strip()
            elif line.startswith("|"):
                table_lines += 1
                if table_lines > 2 or section["owner"] is text:
                    section["table"].append(line)
            elif section["owner"] is text and line.strip():
                section["text"].append(line)
    parts = [head] if head else []
    for title, section in sections.items():
        lines = [title, ""]
        for t in section["text"]:
            lines += [t, ""]
        parts.append("\n".join(lines + section["table"]))
    return "\n\n".join(parts) + "\n"


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


# --- efficiency: lra.benchmark ---------------------------------------------------------


def bench_models(plan: Plan) -> list[str]:
    if plan.bench_models is not None:
        return list(plan.bench_models)
    from models import registry

    names = registry.available()
    return ([m for m in LRA_VARIANTS if m in names]
            + ([] if plan.bench_lra_only else [m for m in names if m not in LRA_VARIANTS]))


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
        outcome = run_command(cmd, timeout=share - GRACE_S - 5, log_path=log_path,
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


# --- transformer, runs: full-size ListOps runs, time-boxed ------------------------------
#
# A lent GPU gives minutes, LRA's ListOps run is 5000 steps: each run here trains for the
# time its stage gives it and is then tested where it stopped. The run is launch.py in
# <out>/runs/listops/<model>/seed0 (lra.sweep's folder for it, so `lra.report` reads it);
# at its training deadline it gets SIGTERM, on which launch.py saves a checkpoint at the
# next step; a second launch.py in the same folder with --config.num_train_steps=<that
# step> resumes there, trains no step, and tests the best-on-validation weights: its
# results.json says `steps` (done) and the tables set them beside the config's (LRA's
# 5000). The learning-rate schedule (LRA's rsqrt decay) does not depend on
# num_train_steps, so these are the first steps of the 5000-step run, and running the
# stage again where the checkpoints are (--force) trains on from them.


def listops_dir(suite: Suite) -> str:
    """The ListOps folder the runs read: the config's data_dir (data/listops for the full
    runs), or, for the dry run, a tiny set of the suite's own under --out."""
    if suite.plan is DRY:
        return os.path.join(suite.out, "data", "listops")
    from lra import sweep

    config = sweep.expected_config("listops", "transformer", 0, suite.plan.run_config_arg,
                                   list(suite.plan.run_overrides))
    path = str(config["data_dir"])
    return path if os.path.isabs(path) else os.path.join(REPO, path)


def run_overrides(suite: Suite) -> list[str]:
    extra = [f"data_dir={suite.data_dir}"] if suite.plan is DRY else []
    return [*suite.plan.run_overrides, *extra]


def transformer_overrides(suite: Suite) -> list[str]:
    return [*run_overrides(suite), *suite.plan.transformer_overrides]


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


def wait_for_listops(suite: Suite, limit: float, model: str,
                     overrides: list[str]) -> str | None:
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
        _log(f"ListOps data generated -> {suite.data_dir}")
    from lra import sweep

    config = sweep.expected_config("listops", model, 0, suite.plan.run_config_arg, overrides)
    return sweep.missing_data("listops", config)


@dataclasses.dataclass
class RunReport:
    """What one time-boxed run did: `state` (one line for the tables), its commands, and
    whether it ended with a tested result (`tested`) or failed (`failed`)."""
    state: str
    commands: list[str]
    tested: bool = False
    failed: bool = False


def last_checkpoint(workdir: str) -> int | None:
    """The newest step in <workdir>/checkpoints/last (orbax's folders named by step;
    one being written has another name), or None."""
    last = os.path.join(workdir, "checkpoints", "last")
    steps = [int(n) for n in os.listdir(last) if n.isdigit()] if os.path.isdir(last) else []
    return max(steps, default=None)


def _training_started(log_path: str, offset: int) -> bool:
    with open(log_path, "rb") as f:
        f.seek(offset)
        return re.search(rb"^Training ", f.read(), re.M) is not None


def launch(cmd: list[str], workdir: str, *, deadline: float, max_train_s: float = 0,
           grace: float = RUN_GRACE_S, xla_flags: str = "") -> tuple[int | None, float | None]:
    """Runs one launch.py (stdout appended to <workdir>/log.txt, stderr to stderr.txt, as
    lra.sweep does) until it ends, or until `deadline` (time.monotonic()) or `max_train_s`
    seconds after its training began (its `Training ...` line), whichever is first: then
    SIGTERM to its process group (launch.py saves a checkpoint) and SIGKILL `grace`
    seconds later. Returns (exit code, None when stopped; seconds from the `Training` line to the
    end, None when it never printed it)."""
    os.makedirs(workdir, exist_ok=True)
    log_path = os.path.join(workdir, "log.txt")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    with open(log_path, "ab") as out, open(os.path.join(workdir, "stderr.txt"), "ab") as err:
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        err.write(f"==== {stamp}: {display(cmd)}\n".encode())
        err.flush()
        offset = out.tell()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err, env=env,
                                start_new_session=True)
        trained_from, returncode = None, None
        try:
            while True:
                returncode = proc.poll()
                now = time.monotonic()
                if returncode is not None:
                    break
                if trained_from is None and _training_started(log_path, offset):
                    trained_from = now
                stop_at = deadline
                if max_train_s and trained_from is not None:
                    stop_at = min(stop_at, trained_from + max_train_s)
                if now >= stop_at:
                    _stop_group(proc, grace)
                    returncode = None
                    break
                time.sleep(0.25)
        except BaseException:  # Ctrl-C or SIGTERM to the suite: leave nothing running
            _stop_group(proc, grace)
            raise
    if trained_from is None and _training_started(log_path, offset):
        trained_from = now
    return returncode, (None if trained_from is None else time.monotonic() - trained_from)


def _error_line(workdir: str) -> str:
    path = os.path.join(workdir, "stderr.txt")
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read().rsplit("==== ", 1)[-1]
    # JAX's note about the frames it filtered follows the exception: not the reason.
    lines = [l.strip() for l in text.splitlines()[1:] if l.strip()
             and not l.startswith("For simplicity, JAX has removed") and set(l.strip()) != {"-"}]
    return lines[-1][:300] if lines else "no error output"


def planned_steps(suite: Suite, model: str, overrides: list[str]) -> int:
    from lra import sweep

    return int(sweep.expected_config("listops", model, 0, suite.plan.run_config_arg,
                                     overrides)["num_train_steps"])


def timed_run(suite: Suite, model: str, limit: float, overrides: list[str],
              max_train_s: float = 0) -> RunReport:
    """One ListOps run of `model` within `limit` seconds: training until the run's own end
    or its deadline (limit less the test's reserve), then, if stopped, its test at the
    step its checkpoint holds (see the section's comment)."""
    from lra import sweep

    plan, start = suite.plan, time.monotonic()
    workdir = sweep.run_dir(os.path.join(suite.out, "runs"), "listops", model, 0, overrides)
    results = os.path.join(workdir, "results.json")
    before = os.path.getmtime(results) if os.path.exists(results) else None

    def tested() -> bool:
        return os.path.exists(results) and os.path.getmtime(results) != before

    cmd = sweep.command("listops", model, 0, plan.run_config_arg, workdir, overrides)
    # The test gets its reserve, and stopping the training (a checkpoint: seconds) 15 s.
    train_deadline = start + limit - plan.test_reserve_s - 15
    _log(f"{model}: training until {train_deadline - start:.0f} s from now"
         + (f" or {max_train_s:g} s of training" if max_train_s else "")
         + f": {display(cmd)}")
    code, trained = launch(cmd, workdir, deadline=train_deadline, max_train_s=max_train_s,
                           xla_flags=plan.xla_flags)
    commands = [display(cmd)]
    if code == 0 and tested():
        return RunReport(f"finished in {time.monotonic() - start:.0f} s", commands,
                         tested=True)
    if code is not None and code != 143:  # 143: it saved and stopped on a SIGTERM
        return RunReport(f"FAILED: exit {code}: {_error_line(workdir)}", commands,
                         failed=True)
    step = last_checkpoint(workdir)
    if step is None:
        return RunReport(f"stopped after {time.monotonic() - start:.0f} s before its first "
                         "checkpoint (reading the data and compiling took the time)", commands)
    test = [*cmd, f"--config.num_train_steps={step}"]
    commands.append(display(test))
    _log(f"{model}: stopped; testing at step {step}: {display(test)}")
    code, _ = launch(test, workdir, deadline=start + limit - GRACE_S - 5, grace=GRACE_S,
                     xla_flags=plan.xla_flags)
    what = (f"time-boxed: trained {trained:.0f} s" if trained is not None else "time-boxed")
    if code == 0 and tested():
        return RunReport(f"{what}, stopped at step {step} and tested there", commands,
                         tested=True)
    if code is None:
        return RunReport(f"{what} to step {step}; its test ran out of time (run again)",
                         commands)
    return RunReport(f"{what} to step {step}; its test FAILED: exit {code}: "
                     f"{_error_line(workdir)}", commands, failed=True)


def _runs_table(suite: Suite, models: list[str], overrides_of, states: dict[str, str]) -> list[str]:
    from lra import sweep

    published = _published_listops()
    rows = ["| model | state | steps done / planned | test acc | LRA (published, 5000 "
            "steps) | best val acc (step) | steps/s | input wait | device peak | folder |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for model in models:
        overrides = overrides_of(model)
        workdir = sweep.run_dir(os.path.join(suite.out, "runs"), "listops", model, 0,
                                overrides)
        rows.append(_run_row(model, workdir, states.get(model, ""), published.get(model),
                             planned_steps(suite, model, overrides)))
    return rows


def stage_transformer(suite: Suite, limit: float) -> StageResult:
    """One full-size ListOps run of transformer, trained for the time the stage has and
    tested where it stopped, beside LRA's 36.37."""
    from lra import sweep

    start, plan = time.monotonic(), suite.plan
    overrides = transformer_overrides(suite)
    missing = wait_for_listops(suite, limit - plan.test_reserve_s - 75,
                               "transformer", overrides)
    if missing:
        return StageResult("partial", missing.split(";")[0], missing + "\n", [])
    report = timed_run(suite, "transformer", limit - (time.monotonic() - start), overrides,
                       plan.max_train_s)
    total = planned_steps(suite, "transformer", overrides)
    size = ("LRA's full size (length 2000, batch 32, 4 layers of width 512; LRA trains "
            f"{total} steps)" if plan is FULL
            else f"`{plan.run_config_arg}` with {', '.join(sweep.normalized_overrides(overrides))}")
    body = [f"ListOps at {size}, seed 0, from `{rel(suite.data_dir)}`, trained for the "
            "time this stage had and tested with its best-on-validation weights where it "
            f"stopped: `steps done / planned` says how far it got of the {total}. LRA's "
            "published accuracy is after all of them. Run the stage again where its "
            "checkpoints are (`--stages=transformer --force`) to train on from there.", "",
            *_runs_table(suite, ["transformer"], lambda m: overrides,
                         {"transformer": report.state}), ""]
    status = "failed" if report.failed else "complete" if report.tested else "partial"
    return StageResult(status, report.state, "\n".join(body), report.commands)


def stage_runs(suite: Suite, limit: float) -> StageResult:
    """A time-boxed run per model (Plan.run_models, the issue's order after transformer,
    at most Plan.run_seconds each) while time is left; a model with a results.json is
    done (its test accuracy, at the steps it reached)."""
    from lra import sweep

    plan, start = suite.plan, time.monotonic()
    overrides = run_overrides(suite)
    missing = wait_for_listops(suite, limit - plan.test_reserve_s - 75,
                               plan.run_models[0], overrides)
    if missing:
        return StageResult("partial", missing.split(";")[0], missing + "\n", [])
    commands, states, failed = [], {}, False
    for model in plan.run_models:
        workdir = sweep.run_dir(os.path.join(suite.out, "runs"), "listops", model, 0,
                                overrides)
        if os.path.exists(os.path.join(workdir, "results.json")):
            continue
        left = limit - (time.monotonic() - start)
        need = max(plan.min_run_s, plan.test_reserve_s + 15)
        if left < need or left <= 0:
            states[model] = "not started: no time left (next call)"
            continue
        report = timed_run(suite, model, min(left, plan.run_seconds or left), overrides,
                           plan.max_train_s)
        states[model] = report.state
        commands += report.commands
        failed = failed or report.failed
    finished = sum(os.path.exists(os.path.join(sweep.run_dir(
        os.path.join(suite.out, "runs"), "listops", m, 0, overrides), "results.json"))
        for m in plan.run_models)
    size = ("LRA's full size (length 2000, 5000 steps planned)" if plan is FULL
            else f"`{plan.run_config_arg}` with {', '.join(plan.run_overrides)}")
    sweep_dir = os.path.join(suite.out, "runs")
    each = (f"at most {plan.run_seconds:g} s" if plan.run_seconds else "the time left")
    body = [f"ListOps at {size}, seed 0, from `{rel(suite.data_dir)}`; each run trained for "
            f"{each} (training, then its test where it stopped: `steps done / planned`); "
            f"each run's results.json in its folder under {rel(sweep_dir)}/. Table 1: "
            f"`python -m lra.report {rel(sweep_dir)}`."]
    body += ["", *_runs_table(suite, list(plan.run_models), lambda m: overrides, states)]
    status = ("failed" if failed else "complete" if finished == len(plan.run_models)
              else "partial")
    return StageResult(status, f"{finished} of {len(plan.run_models)} runs tested",
                       "\n".join(body), commands)


def _published_listops() -> dict[str, float]:
    """LRA's (Tay et al. 2021) ListOps accuracy per registry name."""
    with open(os.path.join(REPO, "lra", "published_results.json")) as f:
        results = json.load(f)["results"]
    return {r["model"]: r["accuracy"]["listops"] for r in results
            if r["source"] == "tay2021" and r["accuracy"].get("listops") is not None}


def _run_row(model: str, workdir: str, state: str, published: float | None,
             planned: int) -> str:
    path = os.path.join(workdir, "results.json")
    folder = rel(workdir)
    pub = f"{published:.2f}" if published is not None else "-"
    if not os.path.exists(path):
        progress = _last_step(os.path.join(workdir, "log.txt"))
        state = state or "not started"
        return (f"| {model} | {state}{'; ' + progress if progress else ''} | - / {planned} | "
                f"- | {pub} | - | - | - | - | {folder} |")
    with open(path) as f:
        r = json.load(f)
    peak = r.get("device_peak_bytes")
    wait = r.get("input_wait_fraction")
    steps = r.get("steps")
    state = state or ("tested earlier" if steps is not None and steps < planned
                      else "finished earlier")
    return (f"| {model} | {state} | {steps} / {planned} | {100 * r['test_accuracy']:.2f} | "
            f"{pub} | {100 * r['best_eval_accuracy']:.2f} ({r.get('best_step', '-')}) | "
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
