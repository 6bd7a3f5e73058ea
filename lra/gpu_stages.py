"""The GPU suite's four stages (lra.gpu_suite runs them in order): the native kernel tests
and their summary, lra.bench_kernels with the fraction of the device's bf16 peak, the
efficiency passes of lra.benchmark with their tables and the choice of the sub-quadratic
variants, and the ListOps data and runs via lra.sweep. Each stage is a function
(suite, limit in seconds) -> StageResult."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

from lra.gpu_common import (DRY, FULL, LRA_VARIANTS, PASS_SHARES, REPO, RUN_GRACE_S,
                            SUBQUADRATIC_MAX_EXPONENT, Plan, StageResult, Suite, _log, _size,
                            bf16_peak_tflops, display, rel, run_command)


# --- kernel_tests: pytest tests/kernels ------------------------------------------------


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


# --- kernels: lra.bench_kernels --------------------------------------------------------


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


# --- efficiency: lra.benchmark ---------------------------------------------------------


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


# --- runs: ListOps via lra.sweep -------------------------------------------------------


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

