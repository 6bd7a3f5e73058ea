"""Prints the path / fla comparison as a markdown table (README.md, section "path"), from
$CMP_DIR/path_ours.npz and $CMP_DIR/path_fla.npz. numpy only: runs in either venv.

    python scripts/fla_comparison/compare_path.py [--tol 1e-4]

Per row: max |ours - fla| over the tensor, and rel = that / max |fla| over the same
tensor (compare_kda.py's helpers). grads: the worst over the inputs (op level: q, k, v, w,
beta, log f; layer: x and every parameter), the input named. No state: softmax attention
has none ('-'). 'ok' is every rel <= tol; the control rows must read FAIL.

fla's PaTH multiplies the gate's bias c_i - c_j by the attention scale K^-0.5 with the
logits; our layer scales log f by K^-0.5 in `gates` (since this comparison found the
difference: README "path": findings), so the op rows feed our ops log f * K^-0.5. The
CONTROL "unscaled" rows are the convention before the fix (the op fed log f; the layer
class with `gates` overridden in path_ours.py) and must read FAIL.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import Table, report, row  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
OURS_OP = [("scan", "path_logits (scan)"),
           ("chunked16", "path_logits_chunked C=16"),
           ("chunked32", "path_logits_chunked C=32"),
           ("chunked64", "path_logits_chunked C=64"),
           ("flash16", "flash_path_attention C=16"),
           ("flash32", "flash_path_attention C=32")]
GATE_LABEL = {"nogate": "no gate (g = 0)", "gate": "forget gate"}
# our layer form: its label
OURS_LAYER = {"chunked_dense": "impl=chunked dense", "scan_dense": "impl=scan dense",
              "chunked_flash": "impl=chunked flash"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "path_ours.npz")))
    fla = dict(np.load(os.path.join(CMP_DIR, "path_fla.npz")))
    inp = np.load(os.path.join(CMP_DIR, "path_inputs.npz"))
    print(f"fla {fla['meta/fla_commit']}, torch {fla['meta/torch_version']}, "
          f"jax {ours['meta/jax_version']}; ours float32, fla f32 = its code as is, "
          f"f64 = the same code in float64\n")
    table = Table(args.tol)
    expected = []  # (ok, must_pass)
    lengths = sorted({int(k.split("/")[1][1:]) for k in ours if k.startswith("op/")}, reverse=True)
    for length in lengths:
        b, h, _, d = inp[f"op/L{length}/q"].shape
        for gate in ("nogate", "gate"):
            tag = f"op L={length} {GATE_LABEL[gate]}"
            p = f"op/L{length}/{gate}/"
            for impl, label in OURS_OP:
                if gate == "gate":
                    label += ", log f * K^-0.5 (as the layer's gates)"
                for dt in ("f32", "f64"):
                    ok = row(table, ours, f"{p}{impl}/", fla, f"{p}naive/{dt}/", tag, label,
                             f"naive_path_attn {dt}", "o")
                    expected.append((ok, True))
            if gate == "gate":  # CONTROL: ours fed log f unscaled (before the fix)
                for impl, label in OURS_OP:
                    ok = row(table, ours, f"{p}{impl}_unscaled/", fla, f"{p}naive/f64/",
                             "CONTROL " + tag, label + ", log f unscaled",
                             "naive_path_attn f64", "o")
                    expected.append((ok, False))
            ok = row(table, fla, f"{p}naive/f32/", fla, f"{p}naive/f64/", tag + " (fla vs fla)",
                     "fla naive_path_attn f32", "naive_path_attn f64", "o")
            expected.append((ok, True))
            ok = row(table, fla, f"{p}naive16/f64/", fla, f"{p}naive/f64/",
                     tag + " (fla vs fla)", "fla naive_path_attn chunk_size=16 f64",
                     "naive_path_attn chunk_size=64 f64", "o")
            expected.append((ok, True))
            ok = row(table, ours, f"{p}chunked16/", fla, f"{p}control_wshift/f32/",
                     "CONTROL " + tag, "path_logits_chunked C=16",
                     "naive_path_attn f32, w one token late", "o")
            expected.append((ok, False))

    lengths = sorted({int(k.split("/")[3][1:]) for k in ours if k.startswith("layer/")})
    for length in lengths:
        for gate in ("nogate", "gate"):
            tag = f"layer L={length} {'forget_gate' if gate == 'gate' else 'no gate'}"
            fp = f"layer/{gate}/L{length}/"
            fname = "PaTHAttention" + (" use_forget_gate" if gate == "gate" else "") + " + naive"
            for form, label in OURS_LAYER.items():
                for dt in ("f32", "f64"):
                    ok = row(table, ours, f"layer/{form}/{gate}/L{length}/", fla,
                             f"{fp}naive/{dt}/", tag, label, f"{fname} {dt}", "y")
                    expected.append((ok, True))
            if gate == "gate":  # CONTROL: our class before the fix (log f unscaled)
                for form, label in OURS_LAYER.items():
                    ok = row(table, ours, f"layer/{form}/gate_unscaled/L{length}/", fla,
                             f"{fp}naive/f64/", "CONTROL " + tag,
                             label + ", log f unscaled (before the fix)", f"{fname} f64", "y")
                    expected.append((ok, False))
            ok = row(table, fla, f"{fp}naive/f32/", fla, f"{fp}naive/f64/", tag + " (fla vs fla)",
                     f"fla {fname} f32", f"{fname} f64", "y")
            expected.append((ok, True))
            ok = row(table, ours, f"layer/chunked_dense/{gate}/L{length}/", fla,
                     f"{fp}control_taps/f32/", "CONTROL " + tag, OURS_LAYER["chunked_dense"],
                     f"{fname} f32, conv taps reversed", "y")
            expected.append((ok, False))
    return report(table, expected)


if __name__ == "__main__":
    sys.exit(main())
