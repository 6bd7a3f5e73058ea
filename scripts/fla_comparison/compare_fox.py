"""Prints the fox / fla comparison as a markdown table (README.md), from
$CMP_DIR/fox_ours.npz and $CMP_DIR/fox_fla.npz. numpy only: runs in either venv.

    python scripts/fla_comparison/compare_fox.py [--tol 1e-4]

Per row: max |ours - fla| over the tensor, and rel = that / max |fla| over the same
tensor (compare_kda.py's helpers). grads: the worst over the inputs (op level: q, k, v,
log f; layer: x and every parameter), the input named. No state: softmax attention has
none ('-'). 'ok' is every rel <= tol; the control rows must read FAIL.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import Table, report, row  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
OURS_OP = [("dense", "dense logits + forget_bias"),
           ("flash", "chunked_attention forget=(c,c)"),
           ("flash32", "chunked_attention tiles 32"),
           ("flash16", "chunked_attention tiles 16")]
# our layer variant: (its label, fla's key: the output gate or not)
OURS_LAYER = {"dense": ("fox dense", "nogate"), "flash": ("fox flash", "nogate"),
              "dense_gate": ("fox dense output_gate", "gate"),
              "flash_gate": ("fox flash output_gate", "gate")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "fox_ours.npz")))
    fla = dict(np.load(os.path.join(CMP_DIR, "fox_fla.npz")))
    inp = np.load(os.path.join(CMP_DIR, "fox_inputs.npz"))
    print(f"fla {fla['meta/fla_commit']}, torch {fla['meta/torch_version']}, "
          f"jax {ours['meta/jax_version']}; ours float32, fla f32 = its code as is, "
          f"f64 = the same code in float64\n")
    table = Table(args.tol)
    expected = []  # (ok, must_pass)
    lengths = sorted({int(k.split("/")[1][1:]) for k in ours if k.startswith("op/")}, reverse=True)
    for length in lengths:
        b, h, _, d = inp[f"op/L{length}/q"].shape
        tag = f"L={length} D={d}"
        p = f"op/L{length}/"
        for impl, label in OURS_OP:
            for dt in ("f32", "f64"):
                ok = row(table, ours, f"{p}{impl}/", fla, f"{p}naive/{dt}/", f"op {tag}",
                         label, f"naive_forgetting_attn {dt}", "o")
                expected.append((ok, True))
        ok = row(table, fla, f"{p}naive/f32/", fla, f"{p}naive/f64/", f"op {tag} (fla vs fla)",
                 "fla naive_forgetting_attn f32", "naive_forgetting_attn f64", "o")
        expected.append((ok, True))
        ok = row(table, ours, f"{p}dense/", fla, f"{p}control_shift/f32/", f"CONTROL op {tag}",
                 "dense logits + forget_bias", "naive_forgetting_attn f32, g one token late",
                 "o")
        expected.append((ok, False))

    lengths = sorted({int(k.split("/")[2][1:]) for k in ours if k.startswith("layer/")})
    for length in lengths:
        for variant, (label, fkey) in OURS_LAYER.items():
            fp = f"layer/{fkey}/L{length}/"
            fname = "layer" + (" output gate" if fkey == "gate" else "") + " + naive"
            for dt in ("f32", "f64"):
                ok = row(table, ours, f"layer/{variant}/L{length}/", fla, f"{fp}naive/{dt}/",
                         f"layer L={length}", label, f"{fname} {dt}", "y")
                expected.append((ok, True))
        for fkey in ("nogate", "gate"):
            fp = f"layer/{fkey}/L{length}/"
            fname = "layer" + (" output gate" if fkey == "gate" else "") + " + naive"
            ok = row(table, fla, f"{fp}naive/f32/", fla, f"{fp}naive/f64/",
                     f"layer L={length} (fla vs fla)", f"fla {fname} f32", f"{fname} f64", "y")
            expected.append((ok, True))
        for variant in ("dense", "flash_gate"):
            label, fkey = OURS_LAYER[variant]
            fp = f"layer/{fkey}/L{length}/"
            fname = "layer" + (" output gate" if fkey == "gate" else "")
            ok = row(table, ours, f"layer/{variant}/L{length}/", fla, f"{fp}control_sign/f32/",
                     f"CONTROL layer L={length}", label, f"{fname} f32, forget sign flipped",
                     "y")
            expected.append((ok, False))
    return report(table, expected)


if __name__ == "__main__":
    sys.exit(main())
