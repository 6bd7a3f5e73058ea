r"""Turn a directory of runs into LRA's Table 1 and Figure 3.

  python -m lra.report workdirs/sweep_listops_mini [--out=<dir>]

Reads every `results.json` below the directory (any depth; e.g. a `lra.sweep` directory;
a file that is not a run's results, e.g. corrupt or missing `task`, `model` or
`test_accuracy`, is skipped with a warning line naming it, and counted)
and writes, into `--out` (default: the directory itself):
  results.md / results.csv  test accuracy (%) per model (rows) and task (columns), mean over
                            seeds (± std when several), the average over tasks, and the
                            majority-class baseline of each task in its own row. Runs are
                            averaged only when their recorded configs agree in every field
                            but `random_seed` and NON_RESULT_FIELDS (logging and checkpoint
                            frequency, device mesh and sharding); runs of one model that
                            differ in another field are separate rows, labelled with the
                            fields that differ, e.g. `transformer [learning_rate=0.01]`;
                            `≡ dense` marks a cell whose runs reduce to dense attention at
                            their length (lra/dense_check.py: e.g. a window that covers
                            the whole input), `⚠ degenerate` a cell whose runs no longer
                            compute the method (a bottleneck of one: every position gets
                            the same output, or q/k get no gradient), each with a
                            footnote; a run the check cannot build gets no mark and a
                            warning line. Classifiers
                            only: a run fine-tuned from a self-pretraining
                            run (config.init_from) is the row `<model> (self-pretrained)`.
                            `avg` is LRA's: the mean over the tasks but Path-X (every
                            model failed Path-X in LRA's Table 1); with a Path-X column
                            `avg incl. Path-X` follows (later papers average all six).
                            Not converged: a run whose test accuracy is below its
                            majority baseline plus CONVERGENCE_MARGIN, or whose
                            logged training loss never went below
                            CHANCE_LOSS_FRACTION of ln(classes); a cell of several
                            seeds with such runs shows `(k/n converged: <mean of the
                            converged>)`, and a table lists every cell with one.
                            Published: a cell whose every run is of the task's
                            full-size config (SIZE_FIELDS and task_options as
                            configs/<task>.py:model=<m> builds them: never mini or
                            runlocal) and whose model has a number in
                            lra/reporting/published_results.json shows `[published P, ours
                            ±d]` (d: our mean minus P).
                            The locality baseline's runs (config.locality_baseline:
                            lra.sweep --locality_baseline) are the row `locality
                            baseline`, after every model, whatever their mixer
                            (`local`, `local_2d`), with a footnote saying what a
                            position saw on each task; never compared with a
                            published number;
  results.md (per task) /   per model: from-scratch and self-pretrained test accuracy, their
  comparison.csv            difference, the pretraining run (objective, steps of the total),
                            the classifier's parameter count and its ratio to
                            `transformer`'s on the same task and config, marked `!` outside
                            ±10% (LRA's unpublished rule for its variants), with a footnote;
  results.md (pretraining)  pretraining runs (objective mlm / causal_lm): best validation
                            loss, test loss and token accuracy, bits per token; never
                            averaged with classifiers;
  efficiency_accuracy.png   LRA's Figure 3: mean accuracy against training speed (steps/s
                            relative to `transformer` on the same task), marker area from
                            compiled training-step memory relative to `transformer`.

`python -m lra.report --published` prints the published numbers with their sources
(lra/reporting/published_results.json; no directory needed).

The runs' own steps/s are only comparable when the runs had the machine to themselves.
`--efficiency=bench.csv` takes speed and memory from an `lra.benchmark --csv` file instead
(as LRA's Figure 3 does, at one length: `--efficiency_length`, default the longest at which
`transformer` was measured):

  python -m lra.benchmark --models=all --lengths=1024 --csv=bench.csv
  python -m lra.report workdirs/sweep_listops_mini --efficiency=bench.csv
"""
from __future__ import annotations

import csv
import os
import sys
from collections import defaultdict

from absl import app, flags

from lra.reporting.cards import card_tables
from lra.reporting.summary import (classifiers, labels, repeated_seeds, summarize,
                                   summarize_pretraining)
from lra.reporting.tables import (PARAMS_NOTE, comparison_rows, efficiency_ratios, plot,
                                  pretraining_rows, table_rows)
# `collect` is re-exported: notebooks/compare_variants.ipynb and researchers' own
# notebooks read runs as `report.collect(dir)`, as before lra/runs/results.py held it.
from lra.runs import cli
from lra.runs import record as runs_record
from lra.runs.results import (NON_RESULT_FIELDS, SEED_FIELD, SELF_PRETRAINED,  # noqa: F401
                              annotate, collect, load, nothing_found, pretraining_warnings)
# The protocol's pieces (published numbers, convergence counting, the locality baseline,
# LRA's task order) live in lra/reporting/protocol.py; re-exported under the names tests,
# notebooks and scripts have used (`report.not_converged_reason`, `report.TASK_ORDER`, ...).
from lra.reporting.protocol import (  # noqa: F401
    ABSENT, CHANCE_LOSS_FRACTION, CONVERGENCE_MARGIN, CONVERGENCE_NOTE, LOCALITY_LABEL,
    LOCALITY_NOTE, PUBLISHED_NOTE, PUBLISHED_PATH, SIZE_FIELDS, TASK_ORDER,
    convergence_rows, convergence_text, locality_note, markdown, model_order,
    not_converged_reason, published, published_cells, published_entries,
    published_lm_markdown, published_markdown, published_rows, published_text, row_model, run_name, seed_of, show,
    size_differences, tasks_and_models)

DENSE_MARK = "≡ dense"
DEGENERATE_MARK = "⚠ degenerate"
DEGENERATE_NOTE = (f"{DEGENERATE_MARK}: with the sizes the run used, at its length, the "
                   "variant no longer computes its method: every position gets the same "
                   "output, or a query/key projection gets no gradient (a softmax over one "
                   "summary or key, e.g. Linformer with k=1; lra/dense_check.py "
                   "`degenerate`). `python -m lra.dense_check <dir>` says why per run.")
DENSE_NOTE = (f"{DENSE_MARK}: at the run's length (config.max_length, plus 1 with CLS "
              "pooling) the variant, with the hyperparameters the run used, attends to every "
              "key: its window, blocks, chunks, k, ... cover the whole input, and it computes "
              "what `transformer` computes (reformer, routing: on shared queries and keys; "
              "lra/dense_check.py). The cell does not measure the variant's approximation.")

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a program, so importing this module (tests, notebooks,
    # other tools) never claims global absl flag names.
    flags.DEFINE_string("out", None, "Output directory (default: the input directory).")
    flags.DEFINE_string("efficiency", None, "An lra.benchmark --csv file: Figure 3 takes "
                        "speed and memory from it instead of from the runs.")
    flags.DEFINE_integer("efficiency_length", 0, "Length of the --efficiency cells to use "
                         "(0: the longest at which transformer was measured).")
    flags.DEFINE_bool("published", False, "Print the published LRA results with their "
                      "sources (lra/reporting/published_results.json); then the report of the "
                      "directory, if one is given.")


AVG_NOTE = ("avg: the mean over the row's tasks but Path-X, as LRA's Table 1 (Tay et al. "
            "2021) averages (every model there failed Path-X); `*`: the row lacks some of "
            "the averaged tasks. Later papers (S4 and after) average all six tasks.")
PRETRAINED_NOTE = ("self-pretrained: a classifier fine-tuned (config.init_from) from a "
                   "self-pretraining run on the task's own training inputs (lra.sweep "
                   "--pretrain). Its runs are grouped by being self-pretrained, not by the "
                   "path of init_from, and their num_train_steps counts the pretraining and "
                   "the fine-tuning steps, so that a row compares with the from-scratch run "
                   "of as many steps. Δ: self-pretrained minus from scratch, in points.")



def run_marks(results: list[dict]) -> tuple[dict[tuple[str, str], list[str]], list[str]]:
    """(task, row label) -> the marks of its runs (see labels), from each run's resolved
    `config`: DENSE_MARK when a run's variant reduces to dense attention at its length,
    DEGENERATE_MARK when its sizes no longer compute the method (a bottleneck of one, a
    window of nothing: lra/dense_check.py `degenerate`); and warning lines for the runs
    that could not be checked. Runs without a config are not checked; `transformer` and
    the variants that are its mixer by construction (`universal`) are never marked
    dense."""
    marks, warnings, checked = defaultdict(list), [], set()
    annotate(results)
    results = classifiers(results)
    for r, label in zip(results, labels(results)):
        config = r.get("config")
        if not config or not config.get("model"):
            continue
        key = (r["task"], label)
        if key in checked:
            continue
        checked.add(key)
        try:
            from lra import dense_check  # imports jax: only when a run has a config

            if (not dense_check.always_dense(config["model"])
                    and dense_check.run_reduces_to_dense(config)):
                marks[key].append(DENSE_MARK)
            if dense_check.run_degenerate(config):
                marks[key].append(DEGENERATE_MARK)
        except Exception as e:  # noqa: BLE001  (an unknown model, a bad value, ...)
            warning = (f"{key[0]} {key[1]}: could not check whether it reduces to dense "
                       f"attention or degenerates ({type(e).__name__}: {e})")
            if warning not in warnings:
                warnings.append(warning)
    return dict(marks), warnings


def report(root: str, out: str | None = None, efficiency_csv: str | None = None,
           efficiency_length: int = 0, skipped: list[str] | None = None,
           published_path: str = PUBLISHED_PATH) -> dict[str, str]:
    """Writes results.md, results.csv, comparison.csv and efficiency_accuracy.png;
    returns their paths. `published_path`: the published results file (see
    published_cells).
    The results.json files that were skipped (see load) are warning lines in results.md
    and, when `skipped` is a list, appended to it."""
    out = out or root
    results, skipped_here = load(root)
    if skipped is not None:
        skipped.extend(skipped_here)
    if not results:
        raise FileNotFoundError(nothing_found(root, skipped_here))
    os.makedirs(out, exist_ok=True)
    summary = summarize(results)
    marks, warnings = run_marks(results)
    shown, withheld = published_cells(summary, published_path)
    header, rows = table_rows(summary, marks, shown)
    convergence = convergence_rows(summary)
    tasks, _ = tasks_and_models(summary)
    comparisons = {t: comparison_rows(summary, t) for t in tasks}
    pretraining = summarize_pretraining(results)
    labelled = any(s["base"] != s["model"] for s in summary.values())
    used = {mark for cell in marks.values() for mark in cell}
    notes = [note for mark, note in ((DENSE_MARK, DENSE_NOTE),
                                     (DEGENERATE_MARK, DEGENERATE_NOTE)) if mark in used]
    if summary:
        notes.append(AVG_NOTE + (" This table has a Path-X column: `avg incl. Path-X` "
                                 "averages all its tasks." if "pathx" in tasks else ""))
    if convergence[1]:
        notes.append(CONVERGENCE_NOTE)
    if shown:
        used_sources = {source["short"]: source for _, source in shown.values()}
        notes.append(PUBLISHED_NOTE + " Sources: " + "; ".join(
            f"{short}: arXiv {src['arxiv']}, {src['table']}" for short, src in
            used_sources.items()) + ".")
    if withheld:
        notes.append("Published numbers not shown (the runs are not of the task's full-size "
                     "config; see the note on published numbers): " + "; ".join(withheld)
                     + ".")
    locality = locality_note(summary)
    if locality:
        notes.append(locality)
    if any(marked for _, _, marked in comparisons.values()):
        notes.append(PARAMS_NOTE)
    if any(s["kind"] == SELF_PRETRAINED for s in summary.values()):
        notes.append(PRETRAINED_NOTE)
    if labelled:
        notes.append("model [field=value, ...]: runs of one model on one task whose recorded "
                     "configs differ in these fields are separate rows; runs are averaged "
                     f"only when their configs differ at most in {SEED_FIELD} and "
                     f"{', '.join(NON_RESULT_FIELDS)}.")
    compute = runs_record.compute_line(results)  # what the table's runs cost
    if compute:
        notes.append(compute)
    notes += [f"warning: {w}" for w in warnings + repeated_seeds(results)
              + pretraining_warnings(results)]
    if skipped_here:
        notes.append(f"warning: {len(skipped_here)} results.json skipped (not in the table, "
                     f"{len(results)} used):")
        notes += [f"warning: {line}" for line in skipped_here]
    paths = {"markdown": os.path.join(out, "results.md"),
             "csv": os.path.join(out, "results.csv"),
             "comparison_csv": os.path.join(out, "comparison.csv"),
             "plot": os.path.join(out, "efficiency_accuracy.png")}
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        if summary:
            f.write(markdown(header, rows) + "\n")
        else:
            f.write("No classification runs (only pretraining runs, below).\n")
        if convergence[1]:
            f.write("\n### Convergence: cells with a run that did not converge\n\n"
                    + markdown(*convergence) + "\n")
        for t, (c_header, c_rows, _) in comparisons.items():
            f.write(f"\n### {t}: test accuracy (%) and parameters\n\n"
                    + markdown(c_header, c_rows) + "\n")
        if pretraining:
            f.write("\n### Pretraining runs (masked-token or next-token prediction on the "
                    "task's own training inputs; not classification accuracy)\n\n"
                    + markdown(*pretraining_rows(pretraining)) + "\n")
        cards = card_tables(summary)
        if cards:
            f.write("\n" + "\n".join(cards))
        f.write("".join(f"\n{note}\n" for note in notes))
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    with open(paths["comparison_csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        for i, (t, (c_header, c_rows, _)) in enumerate(comparisons.items()):
            if i == 0:
                writer.writerow(["task", *c_header])
            writer.writerows([t, *row] for row in c_rows)
    efficiency = (efficiency_ratios(efficiency_csv, efficiency_length)
                  if efficiency_csv else None)
    plot(summary, paths["plot"], efficiency)
    return paths


def main(argv):
    if FLAGS.published:
        print(published_markdown())
        print()
        print(published_lm_markdown())
        if len(argv) == 1:
            return
        print()
    if len(argv) != 2:
        print("error: give one directory of runs: python -m lra.report <directory> "
              "[--out=<dir>] [--efficiency=<bench.csv>]", file=sys.stderr)
        sys.exit(2)
    skipped = []
    try:
        paths = report(argv[1], FLAGS.out, FLAGS.efficiency, FLAGS.efficiency_length,
                       skipped=skipped)
    except (OSError, ValueError) as e:  # no runs, a bad --efficiency file, --out unwritable
        cli.refuse(str(e))
    print(open(paths["markdown"], encoding="utf-8").read())
    print(f"Wrote {paths['markdown']}, {paths['csv']}, {paths['comparison_csv']}, "
          f"{paths['plot']}"
          + (f"; {len(skipped)} results.json skipped (warnings above)" if skipped else ""))


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=cli.parse_flags_or_refuse)
