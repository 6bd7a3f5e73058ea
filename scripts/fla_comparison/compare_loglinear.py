"""Prints the loglinear_mamba2 / fla comparison as a markdown table, from
$CMP_DIR/loglinear_ours.npz and $CMP_DIR/loglinear_fla.npz (loglinear_ours.py,
loglinear_fla.py). numpy only: runs in either venv. Exit status 1 when a row is not as
expected (a comparison outside the tolerance, a CONTROL inside it, or the parameter counts
differing).

    python scripts/fla_comparison/compare_loglinear.py [--tol 1e-4]

Per row: max |ours - fla| over the tensor, and rel = that / max |fla| over the same tensor;
grads: the worst over the inputs (op: x, log_a, B, C, lambda; layer: x and every
parameter), the input named. The padded layer row compares the real positions' outputs
(the loss reads only those; gradients everywhere).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import Table, diff, grads_diff  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "loglinear_ours.npz")))
    fla = dict(np.load(os.path.join(CMP_DIR, "loglinear_fla.npz")))
    inp = dict(np.load(os.path.join(CMP_DIR, "loglinear_inputs.npz")))
    print(f"fla {fla['meta/fla_commit']}, torch {fla['meta/torch_version']}, "
          f"jax {ours['meta/jax_version']}; ours float32, fla f32 = its code as is, "
          f"f64 = the same code in float64\n")
    table = Table(args.tol)
    expected = []  # (ok, must_pass)

    def row(op, ours_label, fla_label, src, src_pfx, fla_pfx, must=True, mask=None):
        y_key = "o" if src_pfx.startswith("op/") else "y"
        a, b = src[src_pfx + y_key], fla[fla_pfx + y_key]
        if mask is not None:
            a, b = a[mask], b[mask]
        ok = table.add(op, ours_label, fla_label, diff(a, b), None,
                       grads_diff(src, src_pfx + "grad_", fla, fla_pfx + "grad_"))
        expected.append((ok, must))

    op_lengths = sorted({int(k.split("/")[1][1:]) for k in ours if k.startswith("op/")})
    for length in op_lengths:
        p = f"op/L{length}/"
        op = f"op L={length}"
        forms = [("reference", "loglinear_reference"), ("recurrent", "loglinear_step (scan)")]
        forms += [(f"chunk{c}", f"chunk_loglinear C={c}") for c in (4, 16, 64)]
        for impl, label in forms:
            row(op, label, "naive_log_linear_attn f64", ours, f"{p}{impl}/", f"{p}naive/f64/")
        row(op, "loglinear_reference", "naive_log_linear_attn f32", ours, f"{p}reference/",
            f"{p}naive/f32/")
        row(op + " (fla vs fla)", "fla naive f32", "naive_log_linear_attn f64", fla,
            f"{p}naive/f32/", f"{p}naive/f64/")
        row("CONTROL " + op, "loglinear_reference", "naive, every lambda = 1 (Mamba-2)", ours,
            f"{p}reference/", f"{p}control_unit_levels/f32/", must=False)

    tags = sorted({k.split("/")[1] for k in ours if k.startswith("layer/")},
                  key=lambda s: (s.endswith("pad"), int(s[1:].removesuffix("pad"))))
    label = "causal loglinear_mamba2 C=16 f32"
    for tag in tags:
        p = f"layer/{tag}/"
        mask = inp.get(f"layer/{tag}/mask")
        op = f"layer {tag}" if mask is None else f"layer {tag[:-3]}, row 2: {mask[1].sum()} real"
        row(op, label, "LogLinearMamba2 + naive f64", ours, p, f"{p}eval/f64/", mask=mask)
        row(op, label, "LogLinearMamba2 + naive f32", ours, p, f"{p}eval/f32/", mask=mask)
        if mask is not None:
            continue
        row(op, label, "LogLinearMamba2 training path f32", ours, p, f"{p}train/f32/")
        row(op + " (fla vs fla)", "fla layer f32", "LogLinearMamba2 + naive f64", fla,
            f"{p}eval/f32/", f"{p}eval/f64/")
        row("CONTROL " + op, label, "fla layer, every lambda = 1 (Mamba-2)", ours, p,
            f"{p}control_unit_levels/f32/", must=False)
    table.print()
    counts = int(ours["meta/param_count"]), int(fla["meta/param_count"])
    print(f"\nparameters: ours {counts[0]}, fla's LogLinearMamba2 {counts[1]}")
    expected.append((counts[0] == counts[1], True))
    bad = [i for i, (ok, must) in enumerate(expected) if ok != must]
    print(f"{len(expected)} checks; {len(bad)} not as expected "
          "(expected: every comparison within tolerance, every CONTROL outside it, the "
          "parameter counts equal)")
    for i in bad:
        print("  not as expected: " + (" | ".join(table.rows[i][:3] + table.rows[i][-1:])
                                       if i < len(table.rows) else "parameter counts"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
