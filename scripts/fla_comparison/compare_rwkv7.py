"""Prints the rwkv7 / fla comparison as a markdown table (results/cpu/rwkv7_vs_fla.md), from
$CMP_DIR/rwkv7_ours.npz and $CMP_DIR/rwkv7_fla.npz; exits 1 when a row is not as expected
(a comparison outside the tolerance, or a CONTROL inside it). numpy only: either venv.

    python scripts/fla_comparison/compare_rwkv7.py [--tol 1e-4]

Per row: max |ours - fla| over the tensor, and rel = that / max |fla| over the same
tensor (compare_kda.py's diff, grads_diff and Table). grads: the worst over the inputs
(op: r, w, k, v, a, b; layer: x and every parameter), the input named.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import Table, diff, grads_diff, op_row, report  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "rwkv7_ours.npz")))
    fla = dict(np.load(os.path.join(CMP_DIR, "rwkv7_fla.npz")))
    inp = np.load(os.path.join(CMP_DIR, "rwkv7_inputs.npz"))
    print(f"fla {fla['meta/fla_commit']}, torch {fla['meta/torch_version']}, "
          f"jax {ours['meta/jax_version']}; ours float32, fla f32 = its code as is, "
          f"f64 = the same code in float64\n")
    table = Table(args.tol)
    expected = []  # (ok, must_pass)
    cases = sorted({k.split("/")[1] for k in ours if k.startswith("op/")}, reverse=True)
    for case in cases:
        length, v_dim = inp[f"op/{case}/r"].shape[2], inp[f"op/{case}/v"].shape[-1]
        tag = f"L={length} d_v={v_dim}"
        has_chunk = f"op/{case}/chunk/f32/o" in fla
        flas = [("recurrent/f32", "dplr_recurrence f32"),
                ("recurrent/f64", "dplr_recurrence f64")]
        if has_chunk:
            flas.append(("chunk/f64", "dplr_chunkwise(32) f64"))
        for impl, label in [("reference", "dplr_reference")] + [
                (f"chunk{c}", f"chunk_dplr C={c}") for c in (16, 32, 64)]:
            for fk, fl in flas:
                expected.append((op_row(table, ours, fla, case, f"op {tag}", impl, label,
                                        fk, fl), True))
        # fla's own float32 against its float64: the rounding floor.
        floors = [("recurrent/f32", "fla dplr_recurrence f32")]
        if has_chunk:
            floors += [("chunk/f32", "fla dplr_chunkwise(32) f32"),
                       ("chunk/f64", "fla dplr_chunkwise(32) f64")]
        for src, label in floors:
            expected.append((op_row(table, ours, fla, case, f"op {tag} (fla vs fla)", None,
                                    label, "recurrent/f64", "dplr_recurrence f64",
                                    ours_src=src), True))
        expected.append((op_row(table, ours, fla, case, f"CONTROL op {tag}", "reference",
                                "dplr_reference", "control_erase_decayed/f32",
                                "dplr_recurrence f32, a -> e^w a (erase after decay)"),
                         False))

    for case in sorted({k.split("/")[1] for k in ours if k.startswith("layer/")},
                       key=lambda c: (len(c), c)):
        p = f"layer/{case}/"
        length = inp[p + "x"].shape[1]
        name = f"layer L={length}" + (" left-padded" if p + "mask" in inp else "")
        fkeys = [("recurrent/f32", "layer + dplr_recurrence f32"),
                 ("recurrent/f64", "layer + dplr_recurrence f64")]
        has_chunk = f"{p}chunk/f32/y" in fla
        if has_chunk:
            fkeys.append(("chunk/f64", "layer + dplr_chunkwise(32) f64"))
        rows = [(ours, "", fk, fl, "causal rwkv7 C=16 f32", True) for fk, fl in fkeys]
        for src in ["recurrent/f32"] + (["chunk/f32", "chunk/f64"] if has_chunk else []):
            form = "dplr_recurrence" if src.startswith("recurrent") else "dplr_chunkwise(32)"
            rows.append((fla, src + "/", "recurrent/f64", "layer + dplr_recurrence f64",
                         f"fla layer + {form} {src[-3:]}", True))
        rows.append((ours, "", "control_no_k_update/f32",
                     "layer f32 without the k update (fused_k_rwkv7)",
                     "causal rwkv7 C=16 f32", False))
        for src, sub, fk, fl, label, must in rows:
            op = name if must else f"CONTROL {name}"
            if src is fla:
                op += " (fla vs fla)"
            sp, fp = p + sub, f"{p}{fk}/"
            out = diff(src[sp + "y"], fla[fp + "y"])
            g = grads_diff(src, sp + "grad_", fla, fp + "grad_")
            expected.append((table.add(op, label, fl, out, None, g), must))
    return report(table, expected)


if __name__ == "__main__":
    sys.exit(main())
