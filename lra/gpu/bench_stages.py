"""The GPU suite's measuring stages (lra.gpu_suite plans them a call at a time): the native
kernel tests and their summary; lra.bench_kernels, a length per command, with the fraction
of the device's bf16 peak (kernels at 4K, kernels_long at 8K/16K); the efficiency passes
of lra.benchmark with their tables and the choice of the sub-quadratic variants. The
time-boxed ListOps runs are lra/gpu/run_stages.py's. Each stage is a function
(suite, limit in seconds) -> StageResult that ends within its limit; the commands it
measures run as processes (`python -m lra.bench_kernels`, `python -m lra.benchmark`)."""
from __future__ import annotations

import csv
import os
import re
import sys
import time

from lra.gpu.common import (GRACE_S, LRA_VARIANTS, PASS_SHARES, SUBQUADRATIC_MAX_EXPONENT,
                            Plan, StageResult, Suite, _log, _size, bf16_peak_tflops, display,
                            hbm_gbps, run_command, write_atomic)


# --- tune: lra.bench_kernels --tune ----------------------------------------------------

TUNE_MIN_S = 20  # a section is not started with less (its candidates' compilations)


def tuning_table(suite: Suite) -> str:
    return os.path.join(suite.out, "tuning.json")


def merge_tuning(suite: Suite) -> int:
    """<out>/tuning.json's entries into this checkout's models/kernels/tuning.json (the
    table every later command reads), when the plan says so; how many were merged."""
    from models.kernels import tuning

    table = tuning_table(suite)
    if not suite.plan.merge_tuning or not os.path.exists(table):
        return 0
    entries = tuning.load(table)
    tuning.write(entries, tuning.TABLE)
    _log(f"tune: {len(entries)} measured entries of {table} merged into {tuning.TABLE}")
    return len(entries)


def stage_tune(suite: Suite, limit: float) -> StageResult:
    """lra.bench_kernels --tune, a section per command (block-sparse first), into
    <out>/tuning.json, merged into the checkout's table for the stages after it. A
    section's output is kept in <out>/logs/tune_<section>.md once it completes (a rerun
    tunes only the others)."""
    from lra.gpu import kernel_tuning
    from models.kernels import tuning

    if not suite.plan.tune_sections:
        return StageResult("complete", "nothing to tune here: --tune times compiled GPU "
                           "kernels, and this plan runs none", "", [])
    start, commands, states, done_all = time.monotonic(), [], [], True
    lengths = ",".join(map(str, suite.plan.tune_lengths))
    os.makedirs(suite.logs, exist_ok=True)
    for section in suite.plan.tune_sections:
        cmd = [sys.executable, "-m", "lra.bench_kernels", "--tune", f"--sections={section}",
               f"--lengths={lengths}", f"--tune_table={tuning_table(suite)}",
               *suite.plan.bench_kernels_args]
        done = os.path.join(suite.logs, f"tune_{section}.md")
        stamp = f"command: {display(cmd)}\n"
        if os.path.exists(done):
            with open(done, encoding="utf-8") as f:
                if f.read().startswith(stamp):  # the same command: tuned already
                    states.append(f"{section} complete earlier")
                    continue
        left = limit - (time.monotonic() - start) - GRACE_S - 5
        if left < min(TUNE_MIN_S, limit / 2):
            states.append(f"{section} not started: no time left")
            done_all = False
            continue
        commands.append(display(cmd))
        _log(f"tune: {section} (limit {left:.0f} s): {display(cmd)}")
        outcome = run_command(cmd, timeout=left, xla_flags=suite.plan.xla_flags,
                              log_path=os.path.join(suite.logs, "tune.log"))
        if outcome.returncode == 0:
            write_atomic(done, stamp + outcome.stdout)
            states.append(f"{section} {outcome.describe()}")
        else:
            done_all = False
            states.append(f"{section} {'partial' if outcome.timed_out else 'failed'}: "
                          f"{outcome.describe()}")
    merged = merge_tuning(suite)
    entries = tuning.load(tuning_table(suite))
    body = ("The fastest tile x num_warps x num_stages of each Triton kernel at each length "
            "(causal forward+backward, the benchmark's B, H, D), measured here; merged into "
            f"models/kernels/tuning.json for this call's later stages ({merged} entries). "
            "Commit it: `python -c 'from models.kernels import tuning; tuning.write("
            "tuning.load(\"<this folder>/tuning.json\"))'`.\n\n"
            + (kernel_tuning.markdown(entries) if entries else "No entry yet.") + "\n")
    failed = any(" failed:" in s for s in states)
    status = "failed" if failed else "complete" if done_all else "partial"
    return StageResult(status, "; ".join(states), body, commands)


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
    gbps = hbm_gbps(suite.device["kind"])
    note = (f"% peak: TFLOP/s over {peak:g} TFLOP/s, the device's dense bf16 peak "
            "(NVIDIA's datasheet)." if peak else
            f"No % of peak: no bf16 peak known for {suite.device['kind']}"
            + ("" if bf16 else " (and the inputs are not bfloat16)") + ".")
    note += (f" % of the HBM floor: the floor's bytes at {gbps:g} GB/s (NVIDIA's datasheet) "
             "over the Pallas time (100% = bandwidth-bound)." if gbps else
             f" No % of the HBM floor: no bandwidth known for {suite.device['kind']}.")
    merged = with_peak_fraction(merge_bench_outputs(outputs), peak)
    body = (f"Lengths {', '.join(map(str, lengths))}: " + "; ".join(states) + ".\n\n"
            f"{note}\n\n{with_bandwidth_fraction(merged, gbps)}")
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


def _append_columns(markdown: str, wanted: list[str], names: list[str], values) -> str:
    """bench_kernels' tables whose header has every column of `wanted`, with `names`
    appended; each row's new cells are `values(cells, index)` (index: wanted -> its
    column)."""
    out, index = [], None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            index = None
            out.append(line)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if index is None and all(w in cells for w in wanted):
            index = {w: cells.index(w) for w in wanted}
            out.append(line + "".join(f" {n} |" for n in names))
        elif index is not None and set(line) <= set("|-"):
            out.append(line + "---|" * len(names))
        elif index is not None:
            out.append(line + "".join(f" {v} |" for v in values(cells, index)))
        else:
            out.append(line)
    return "\n".join(out)


def _percent(numerator, denominator) -> str:
    try:
        return f"{100 * numerator() / float(denominator()):.1f}%"
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return "n/a"


def with_bandwidth_fraction(markdown: str, gbps: float | None) -> str:
    """bench_kernels' tables with two columns more: the HBM floor's time at `gbps` over
    the Pallas fwd and fwd+bwd times, in % (unchanged without a bandwidth)."""
    if not gbps:
        return markdown
    floor = "HBM floor MB fwd / fwd+bwd"

    def values(cells, index):
        mb = cells[index[floor]].split("/")
        return [_percent(lambda i=i: float(mb[i]) * 1e6 / (gbps * 1e9) * 1e3,
                         lambda t=t: cells[index[t]])
                for i, t in enumerate(("Pallas fwd ms", "Pallas fwd+bwd ms"))]

    return _append_columns(markdown, [floor, "Pallas fwd ms", "Pallas fwd+bwd ms"],
                           ["% HBM floor fwd", "% HBM floor fwd+bwd"], values)


def with_peak_fraction(markdown: str, peak: float | None) -> str:
    """bench_kernels' tables with two columns more: TFLOP/s fwd and fwd+bwd as % of
    `peak` (unchanged without a peak)."""
    if not peak:
        return markdown

    def values(cells, index):
        return [_percent(lambda c=c: float(cells[index[c]]), lambda: peak)
                for c in ("TFLOP/s fwd", "TFLOP/s fwd+bwd")]

    return _append_columns(markdown, ["TFLOP/s fwd", "TFLOP/s fwd+bwd"],
                           ["% peak fwd", "% peak fwd+bwd"], values)


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
    from lra.reporting.efficiency import growth_exponent

    by = {(r["model"], r["length"]): r for r in rows if "error" not in r}
    models = list(dict.fromkeys(r["model"] for r in rows))
    return {m: growth_exponent(list(lengths), [by.get((m, l), {}).get("temp_bytes")
                                               for l in lengths]) for m in models}


def ratio_table(rows: list[dict], lengths: list[int]) -> str:
    """Markdown in LRA's Table 2 form: steps/s and memory per model and L, each with its
    ratios to the fused transformer (transformer[flash]) and the materialised one at the
    same L (speed-up; memory fraction: the device's peak where measured, else XLA's
    compiled temporary memory, marked `temp`)."""
    by = {(r["model"], r["length"]): r for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    lines = ["| model | " + " | ".join(f"L={l}" for l in lengths) + " |",
             "|---|" + "---|" * len(lengths)]

    def memory(r):
        if r.get("device_peak_bytes"):
            return r["device_peak_bytes"], ""
        return r.get("temp_bytes"), " temp"

    from lra.reporting.efficiency import REFERENCES

    def vs(value, base_value, m, ref):
        return (f"{value:.2f}x {'fused' if ref != 'transformer' else 'materialised'}"
                if base_value and m != ref else None)

    for m in models:
        cells = []
        for l in lengths:
            r = by.get((m, l))
            if r is None or "error" in r:
                cells.append("-" if r is None else "error")
                continue
            bases = [(ref, by.get((ref, l))) for ref in REFERENCES]
            bases = [(ref, b) for ref, b in bases if b and "error" not in b]
            parts = []
            if r["time_s"]:
                ratios = [vs(b["time_s"] / r["time_s"], b["time_s"], m, ref)
                          for ref, b in bases if b["time_s"]]
                ratios = [x for x in ratios if x]
                parts.append(f"{1 / r['time_s']:.2f} steps/s"
                             + (f" ({', '.join(ratios)})" if ratios else ""))
            mem, kind = memory(r)
            if mem:
                ratios = [vs(mem / memory(b)[0], memory(b)[0], m, ref)
                          for ref, b in bases if memory(b)[0]]
                ratios = [x for x in ratios if x]
                parts.append(f"{_size(mem)}{kind}"
                             + (f" ({', '.join(ratios)})" if ratios else ""))
            cells.append(", ".join(parts) or "-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def stage_efficiency(suite: Suite, limit: float) -> StageResult:
    """Three lra.benchmark passes into one CSV (float32 1K-4K; 8K/16K for the
    sub-quadratic variants; bfloat16 1K-4K), then the tables from the CSV, so a pass
    stopped at its limit still shows every cell it measured."""
    from lra.reporting import efficiency

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
            "Ratios are to transformer[flash] (fused attention: cuDNN in the bfloat16 pass; "
            "the float32 pass runs its chunked XLA form, cuDNN taking fp16/bf16 only) and "
            "to transformer (materialised) at the same L in the same run: LRA's Table 2 "
            "reports the same quantities (steps/s and peak memory, text task, TPU v3) "
            "against the materialised one.",
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
                 efficiency.table(rows, lengths)]
    states = [status for _, status, _ in passes]
    status = ("complete" if all(s == "complete" for s in states)
              else "failed" if "failed" in states else "partial")
    detail = "; ".join(f"{name} {status}" for name, status, _ in passes)
    return StageResult(status, detail, "\n".join(body), commands)


def _exponent_note(model: str, exponent: float | None) -> str:
    if model == "transformer":
        return "transformer (the quadratic reference)"
    if model == "transformer[flash]":
        return "transformer[flash] (the fused reference, measured at every length)"
    return f"{model} ({'too few cells' if exponent is None else f'L^{exponent:.2f}'})"
