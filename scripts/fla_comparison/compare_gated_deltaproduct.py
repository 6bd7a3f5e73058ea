"""Prints the gated_deltaproduct / fla comparison as a markdown table (README.md), from
$CMP_DIR/gdp_ours.npz and $CMP_DIR/gdp_fla.npz. numpy only: runs in either venv.

    python scripts/fla_comparison/compare_gated_deltaproduct.py [--tol 1e-4]

Per row: max |ours - fla| over the tensor, and rel = that / max |fla| over the same
tensor (compare_kda.py's helpers). grads: the worst over the inputs (op level: q, k, v,
beta, g; layer: x and every parameter), the input named. 'ok' is every rel <= tol; the
control rows must read FAIL.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import Table, diff, grads_diff, report  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
NAIVE = "naive_recurrent_gated_delta_product (q K^-0.5)"
CHUNK_REF = "chunk_gated_delta_product_ref + naive_recurrent_gated_delta_rule f64"


def op_row(table, src, src_pfx, fla, fla_pfx, op, label, fla_label):
    out = diff(src[src_pfx + "o"], fla[fla_pfx + "o"])
    state = diff(src[src_pfx + "S"], fla[fla_pfx + "S"])
    g = grads_diff(src, src_pfx + "grad_", fla, fla_pfx + "grad_")
    return table.add(op, label, fla_label, out, state, g)


def layer_row(table, src, src_pfx, fla, fla_pfx, op, label, fla_label):
    out = diff(src[src_pfx + "y"], fla[fla_pfx + "y"])
    g = grads_diff(src, src_pfx + "grad_", fla, fla_pfx + "grad_")
    return table.add(op, label, fla_label, out, None, g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "gdp_ours.npz")))
    fla = dict(np.load(os.path.join(CMP_DIR, "gdp_fla.npz")))
    inp = np.load(os.path.join(CMP_DIR, "gdp_inputs.npz"))
    print(f"fla {fla['meta/fla_commit']}, torch {fla['meta/torch_version']}, "
          f"jax {ours['meta/jax_version']}; ours float32, fla f32 = its code as is, "
          f"f64 = the same code in float64\n")
    table = Table(args.tol)
    expected = []  # (ok, must_pass)
    cases = sorted({k.split("/")[1] for k in ours if k.startswith("op/")},
                   key=lambda c: (c[:2], -int(c.split("_")[1][1:])))
    for case in cases:
        b, h, length, n, k = inp[f"op/{case}/k"].shape
        v = inp[f"op/{case}/v"].shape[-1]
        tag = f"n_h={n} L={length} d_v={v}"
        p = f"op/{case}/"
        impls = [("reference", "delta_rule_reference(unroll)")] + [
            (f"chunk{c}", f"chunk_delta_rule(unroll) C={c}") for c in (16, 32, 64)]
        flas = [("naive/f32", f"{NAIVE} f32"), ("naive/f64", f"{NAIVE} f64"),
                ("chunk_ref/f64", CHUNK_REF)]
        for impl, label in impls:
            for fk, fl in flas:
                ok = op_row(table, ours, f"{p}{impl}/", fla, f"{p}{fk}/", f"op {tag}", label, fl)
                expected.append((ok, True))
        # fla against fla: its float32 rounding floor, and its two references.
        for src, label in (("naive/f32", f"fla {NAIVE} f32"),
                           ("chunk_ref/f64", "fla " + CHUNK_REF)):
            ok = op_row(table, fla, f"{p}{src}/", fla, f"{p}naive/f64/",
                        f"op {tag} (fla vs fla)", label, f"{NAIVE} f64")
            expected.append((ok, True))
        ok = op_row(table, ours, f"{p}reference/", fla, f"{p}control_steps_reversed/f32/",
                    f"CONTROL op {tag}", "delta_rule_reference(unroll)",
                    f"{NAIVE} f32, each token's steps reversed")
        expected.append((ok, False))
        ok = op_row(table, ours, f"{p}control_decay_last/", fla, f"{p}naive/f32/",
                    f"CONTROL op {tag}", "delta_rule_reference, decay on the last step",
                    f"{NAIVE} f32")
        expected.append((ok, False))

    ns = sorted({int(k.split("/")[1][1:]) for k in ours if k.startswith("layer/n")})
    lengths = sorted({int(k.split("/")[2][1:]) for k in ours if k.startswith("layer/n")})
    for n in ns:
        for length in lengths:
            p = f"layer/n{n}/L{length}/"
            op = f"layer n_h={n} L={length}"
            label = "GatedDeltaProduct C=16 f32"
            for dt in ("f32", "f64"):
                ok = layer_row(table, ours, p, fla, f"{p}naive/{dt}/", op, label,
                               f"layer + naive {dt}")
                expected.append((ok, True))
            ok = layer_row(table, fla, f"{p}naive/f32/", fla, f"{p}naive/f64/",
                           op + " (fla vs fla)", "fla layer + naive f32", "layer + naive f64")
            expected.append((ok, True))
            ok = layer_row(table, ours, p, fla, f"{p}control_no_permutation/f32/",
                           "CONTROL " + op, label,
                           "layer f32, weights not permuted (n, h)")
            expected.append((ok, False))
    return report(table, expected)


if __name__ == "__main__":
    sys.exit(main())
