"""Prints the nsa / fla comparison as markdown tables (results/cpu/nsa_vs_fla.md), from
$CMP_DIR/nsa_ours.npz and $CMP_DIR/nsa_fla.npz. numpy only: runs in either venv.

    python scripts/fla_comparison/compare_nsa.py [--tol 1e-4]

Per row: max |ours - fla| over the tensor, and rel = that / max |fla| over the same
tensor (compare_kda.py's helpers); padded rows: the outputs at padded positions are 0 on
both sides (fla's pad_input; ours zeroed, they are unspecified). grads: the worst over
the inputs (op level: q, k, v, g_cmp, g_slc, g_swa; layer: x and every parameter), the
input named. No state ('-').
'ok' is every rel <= tol; the CONTROL rows (fla choosing two blocks fewer) must read FAIL.
A second table counts the (batch, kv head, query) whose chosen set of blocks differs
between ours and fla's naive_nsa_topk; it must be 0. Exit status 1 when any row is not as
expected.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import Table, row  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")


def differing_sets(a, b):
    """How many index rows (..., S) hold different sets of blocks (-1 = empty)."""
    return int((np.sort(a, -1) != np.sort(b, -1)).any(-1).sum()), int(np.prod(a.shape[:-1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "nsa_ours.npz")))
    fla = dict(np.load(os.path.join(CMP_DIR, "nsa_fla.npz")))
    inp = np.load(os.path.join(CMP_DIR, "nsa_inputs.npz"))
    print(f"fla {fla['meta/fla_commit']}, torch {fla['meta/torch_version']}, "
          f"jax {ours['meta/jax_version']}; ours float32, fla f32 = its code as is, "
          f"f64 = the same code in float64\n")
    table = Table(args.tol)
    expected = []  # (ok, must_pass)
    choices = []
    cases = sorted({k.split("/")[1] for k in ours if k.startswith("op/")}, reverse=True)
    for case in cases:
        p = f"op/{case}/"
        _, hq, length, dim = inp[p + "q"].shape
        h = inp[p + "k"].shape[1]
        bs, s, w = (int(a) for a in inp[p + "config"])
        tag = f"L={length} HQ={hq} H={h} K={dim} BS={bs} S={s} W={w}"
        for mode, label in (("given", "parallel_nsa, given indices"),
                            ("chosen", "parallel_nsa, its choice")):
            fname = f"naive_nsa ({'block_indices' if mode == 'given' else 'topk'})"
            for dt in ("f32", "f64"):
                ok = row(table, ours, f"{p}{mode}/", fla, f"{p}{mode}/{dt}/", f"op {tag}",
                         label, f"{fname} {dt}", "o")
                expected.append((ok, True))
            ok = row(table, fla, f"{p}{mode}/f32/", fla, f"{p}{mode}/f64/",
                     f"op {tag} (fla vs fla)", f"fla {fname} f32", f"{fname} f64", "o")
            expected.append((ok, True))
        for dt in ("f32", "f64"):
            n_diff, n = differing_sets(ours[f"{p}chosen/block_idx"],
                                       fla[f"{p}chosen/{dt}/block_idx"])
            choices.append((f"op {tag}", f"naive_nsa_topk {dt}", n_diff, n))
            expected.append((n_diff == 0, True))
        ok = row(table, ours, f"{p}chosen/", fla, f"{p}control_counts/f32/",
                 f"CONTROL op {tag}", "parallel_nsa, its choice",
                 f"naive_nsa f32, block_counts {s - 2}", "o")
        expected.append((ok, False))

    cases = sorted({k.split("/")[1] for k in ours if k.startswith("layer/")}, reverse=True)
    for case in cases:
        dim, heads, kv, head_dim, bs, s, w = (int(a) for a in inp[f"layer/{case}/config"])
        length = inp[f"layer/{case}/x"].shape[1]
        tag = (f"layer L={length} dim={dim} heads={heads} kv={kv} K={head_dim} BS={bs} "
               f"S={s} W={w}")
        src = f"layer/{case}/"
        for dt in ("f32", "f64"):
            ok = row(table, ours, src, fla, f"{src}naive/{dt}/", tag, "nsa causal, rotary",
                     f"layer + naive_nsa {dt}", "y")
            expected.append((ok, True))
        ok = row(table, fla, f"{src}naive/f32/", fla, f"{src}naive/f64/", f"{tag} (fla vs fla)",
                 "fla layer + naive_nsa f32", "layer + naive_nsa f64", "y")
        expected.append((ok, True))
        pad = int((~inp[f"layer/{case}/mask"]).sum())
        for dt in ("f32", "f64"):
            ok = row(table, ours, f"{src}padded/", fla, f"{src}padded/naive/{dt}/",
                     f"{tag}, row 2 right-padded by {pad}", "nsa causal, rotary, padding_mask",
                     f"layer attention_mask (unpad, cu_seqlens) {dt}", "y")
            expected.append((ok, True))
        ok = row(table, ours, src, fla, f"{src}control_counts/f32/", f"CONTROL {tag}",
                 "nsa causal, rotary", f"layer f32, block_counts {s - 2}", "y")
        expected.append((ok, False))
    table.print()
    print("\n| op | fla | queries x kv heads whose chosen blocks differ | of |")
    print("|---|---|---|---|")
    for op, name, n_diff, n in choices:
        print(f"| {op} | {name} | {n_diff} | {n} |")
    bad = [i for i, (ok, must) in enumerate(expected) if ok != must]
    print(f"\n{len(expected)} checks; {len(bad)} not as expected (expected: every comparison "
          "within tolerance, every chosen set the same, every CONTROL outside it)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
