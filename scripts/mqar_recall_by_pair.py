r"""Which key-value pairs an MQAR run recalls: its test accuracy split by the queried pair's
place in the row and by how far back the key sits.

    PYTHONPATH=. python scripts/mqar_recall_by_pair.py RUN [RUN ...] [--out=FILE.md]

RUN is a finished `configs/mqar.py` run's workdir (its results.json and checkpoints). Its
best checkpoint is restored into the model its config builds (as `lra.generate` does), the
test split regenerated from the config's task options (MQAR has no files), and every
labelled position scored with argmax, as `test_accuracy` counts them. Printed (and written
to --out as markdown) per run:

  - accuracy by pair: pair 1 is the row's first key-value pair, pair kv its last (nearest
    the queries);
  - accuracy by distance: positions from the query back to its key, in 8 bins of L / 8;
  - "in row": the share of predictions that are one of the row's kv values, right or
    wrong; a model that knows the row's values but not which key each belongs to is right
    on about 1 / kv of the labels with "in row" near 100; "right of in row", the share of
    those that are right (every right prediction is in the row): 1 / kv when the model
    names one of the row's values without regard to the key;
  - the run's recorded test_accuracy beside the recomputed one (they must agree: the same
    checkpoint, split and count).

Why: at a fixed width the fixed-state mixers plateau near 1 / kv of the labels (L 64, 4
pairs: ~25%; L 128, 8 pairs: ~12%). This says whether they keep one pair (accuracy by
pair) or the row's values without their keys (in row).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from lra.tasks.mqar import IGNORE  # the label of a position not predicted

DISTANCE_BINS = 8  # per table: bins of seq_len / 8 positions


def recall_table(inputs_NxL: np.ndarray, labels_NxL: np.ndarray,
                 predicted_NxL: np.ndarray, num_kv_pairs: int) -> dict:
    """Counts of labelled positions and right predictions, by pair (1-based: which of the
    row's kv pairs the query asks for) and by distance bin (query position minus the key's
    position, in DISTANCE_BINS bins of L / DISTANCE_BINS); and how many predictions are
    one of the row's values (in_row). The row's first 2 kv positions are key value key value ...
    (lra.tasks.mqar.generate), so the queried key is found among the row's keys."""
    by_pair = np.zeros((num_kv_pairs, 2), np.int64)  # (labels, right)
    by_distance = np.zeros((DISTANCE_BINS, 2), np.int64)
    width = max(1, inputs_NxL.shape[1] // DISTANCE_BINS)
    in_row = 0
    rows, positions = np.nonzero(labels_NxL != IGNORE)
    for r, p in zip(rows, positions):
        keys = inputs_NxL[r, 0:2 * num_kv_pairs:2]
        in_row += int(predicted_NxL[r, p] in inputs_NxL[r, 1:2 * num_kv_pairs:2])
        where = np.nonzero(keys == inputs_NxL[r, p])[0]
        if len(where) != 1:
            raise ValueError(f"row {r}: the token at labelled position {p} is not one of the "
                             "row's keys: not an MQAR row of this num_kv_pairs")
        j = int(where[0])
        right = int(predicted_NxL[r, p] == labels_NxL[r, p])
        by_pair[j] += (1, right)
        by_distance[min((p - 2 * j) // width, DISTANCE_BINS - 1)] += (1, right)
    return {"by_pair": by_pair, "by_distance": by_distance, "bin_width": width,
            "in_row": in_row, "labels": len(rows)}


def score_run(workdir: str, batch_size: int = 250) -> dict:
    """Restores `workdir`'s best checkpoint and scores its test split (module docstring)."""
    import jax
    from flax import nnx

    import lra.tasks
    from lra import generate, train

    if not os.path.exists(os.path.join(workdir, "results.json")):
        raise SystemExit(f"error: {workdir} has no results.json: give a finished "
                         "configs/mqar.py run's workdir")
    config, _ = generate.load_config(workdir)
    if config.task != "mqar":
        raise SystemExit(f"error: {workdir} is a {config.task!r} run, not an MQAR run")
    options = config.task_options.to_dict()
    task = lra.tasks.get("mqar").with_options(**options)
    model = train.build_model(config, task)
    step, kind = generate.restore(model, workdir)
    model.eval()
    split = task.load("", "test", config.max_length, **options)
    inputs, labels, mask = split["inputs"], split["targets"], split["mask"]

    @nnx.jit
    def predict(model, x, m):
        return jax.numpy.argmax(model(x, m, deterministic=True), -1)

    predicted = np.concatenate([
        np.asarray(predict(model, inputs[i:i + batch_size], mask[i:i + batch_size]))
        for i in range(0, len(inputs), batch_size)])
    correct = (predicted == labels) & (labels != IGNORE)
    table = recall_table(inputs, labels, predicted, options["num_kv_pairs"])
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
        recorded = json.load(f).get("test_accuracy")
    labelled = int((labels != IGNORE).sum())
    return {"workdir": workdir, "model": config.model, "seed": config.random_seed,
            "seq_len": config.max_length, "width": config.emb_dim,
            "num_kv_pairs": options["num_kv_pairs"], "checkpoint": f"{kind} step {step}",
            "test_accuracy": float(correct.sum() / labelled), "recorded": recorded, **table}


def to_markdown(scores: list[dict]) -> str:
    """One table per (L, kv): a row per run (module docstring), then the labels' counts."""
    pct = lambda n, right: f"{100 * right / n:.1f}" if n else "-"  # noqa: E731
    out = []
    for seq_len, kv in sorted({(s["seq_len"], s["num_kv_pairs"]) for s in scores}):
        group = [s for s in scores if (s["seq_len"], s["num_kv_pairs"]) == (seq_len, kv)]
        w = group[0]["bin_width"]
        head = (["run", "test acc (recorded)", "in row", "right of in row"]
                + [f"pair {j + 1}" for j in range(kv)]
                + [f"dist {b * w}-{b * w + w - 1}" for b in range(DISTANCE_BINS)])
        out += [f"### L {seq_len}, {kv} key-value pairs (1 / kv = {100 / kv:.1f}%)", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for s in group:
            name = f"{s['model']} width {s['width']} seed {s['seed']}"
            recorded = "-" if s["recorded"] is None else f"{100 * s['recorded']:.2f}"
            out.append("| " + " | ".join(
                [name, f"{100 * s['test_accuracy']:.2f} ({recorded})",
                 pct(s["labels"], s["in_row"]),
                 pct(s["in_row"], int(s["by_pair"][:, 1].sum()))]
                + [pct(*s["by_pair"][j]) for j in range(kv)]
                + [pct(*s["by_distance"][b]) for b in range(DISTANCE_BINS)]) + " |")
        first = group[0]
        out += ["", "Labels per pair: " + ", ".join(str(int(n)) for n, _ in first["by_pair"])
                + "; per distance bin: " + ", ".join(str(int(n)) for n, _ in
                                                    first["by_distance"]) + ".", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="finished configs/mqar.py run workdirs")
    parser.add_argument("--out", help="write the markdown table here too")
    args = parser.parse_args(argv)
    scores = []
    for n, run in enumerate(args.runs, 1):
        s = score_run(run)
        print(f"[{n}/{len(args.runs)}] {run}: {s['checkpoint']}, test accuracy "
              f"{100 * s['test_accuracy']:.2f} (recorded {s['recorded']})", flush=True)
        scores.append(s)
    text = to_markdown(scores)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
