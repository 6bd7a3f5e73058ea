"""The table of results/cpu/cosformer_vs_original.md from ours_float32.npz, ours_float64.npz
and original.npz (numpy only: either venv). Exits 1 when a row is not as expected: every
case within 1e-12 (ours float64 against the original's float64) and 1e-5 relative (ours
float32), and the control off by more than 1e-2.

    /tmp/torchenv/bin/python scripts/cosformer_comparison/compare.py
"""
import os
import sys

import numpy as np

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/cosformer_cmp")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cases import CASES  # noqa: E402


def worst(ours, ref, case: str, prefix: str) -> tuple[float, float, str]:
    """(max abs diff of y, the worst gradient's max abs diff, which gradient)."""
    y = float(np.max(np.abs(ours[f"{case}/y"] - ref[f"{prefix}{case}/y"])))
    grads = {k[len(case) + 6:]: float(np.max(np.abs(ours[k] - ref[prefix + k])))
             for k in ours.files if k.startswith(f"{case}/grad/")}
    name = max(grads, key=grads.get)
    return y, grads[name], name


def main() -> int:
    o32 = np.load(os.path.join(CMP_DIR, "ours_float32.npz"))
    o64 = np.load(os.path.join(CMP_DIR, "ours_float64.npz"))
    ref = np.load(os.path.join(CMP_DIR, "original.npz"))
    print(f"original: OpenNLPLab/cosFormer {ref['commit']}, torch {ref['torch']}\n")
    print("| case | ours f64 vs original f64: y / grads | ours f64 vs original f64, its "
          "index in f32: y / grads | ours f32 vs original f32: y / grads | max abs y / grads |")
    print("|---|---|---|---|---|")
    failed = []
    for case, _, _, m in CASES:
        scale = float(np.max(np.abs(ref[f"float64/{case}/y"])))
        cells = []
        for ours, prefix, bound in ((o64, "float64/", 1e-12), (o64, "float64_index32/", 1e-5),
                                    (o32, "float32/", 1e-5 * scale)):
            y, g, name = worst(ours, ref, case, prefix)
            cells.append(f"{y:.1e} / {g:.1e} ({name})")
            control = m != 1
            if (control and y < 1e-2) or (not control and y > bound):
                failed.append(f"{case}, original {prefix[:-1]}: y {y:.1e}")
        grad_scale = max(float(np.max(np.abs(ref[k]))) for k in ref.files
                         if k.startswith(f"float64/{case}/grad/"))
        print(f"| {case} | " + " | ".join(cells) + f" | {scale:.2f} / {grad_scale:.1f} |")
    if failed:
        print("\nNOT AS EXPECTED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
