"""Prints the hyena / Zoology comparison as a markdown table (README.md), from
$CMP_DIR/hyena_ours.npz and $CMP_DIR/hyena_zoology.npz. numpy only: runs in either venv.

    python scripts/fla_comparison/compare_hyena.py [--tol 1e-4]

Per row: max |ours - zoology| over the tensor, and rel = that / max |zoology| over the same
tensor (compare_kda.py's helpers: a NaN or inf on either side is reported, never hidden).
grads: the worst over the inputs (filter: z, freq and the FFN's weights; conv: u, k,
bias; layer: x and every parameter), the input named; buffers have none ('-'). No state:
'-'. 'ok' is every rel <= tol; the CONTROL rows must read FAIL. Exits 1 when a row is
not as expected.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import Table, diff, grads_diff, report  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
LAYER = {"sfo3": "hyena (defaults: filter_order 64, short_filter_order 3)",
         "sfo0": "hyena short_filter_order=0"}
ZLAYER = {"sfo3": "Hyena(l_max=128)", "sfo0": "Hyena(l_max=128), 1-tap conv = identity"}


class ZooTable(Table):
    """compare_kda's Table with the column 'zoology' and rows without gradients."""

    def add(self, op, ours_name, z_name, out, state, grads):
        if grads is not None:
            return super().add(op, ours_name, z_name, out, state, grads)
        ok = super().add(op, ours_name, z_name, out, state, ((0.0, ""), (0.0, "")))
        self.rows[-1][7:9] = ["-", "-"]
        return ok

    def print(self):
        head = ["op", "ours", "zoology", "out max abs", "out max rel", "state max abs",
                "state max rel", "grads max abs", "grads max rel", f"rel <= {self.tol:g}"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in self.rows:
            print("| " + " | ".join(r) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "hyena_ours.npz")))
    zoo = dict(np.load(os.path.join(CMP_DIR, "hyena_zoology.npz")))
    print(f"zoology {zoo['meta/zoology_commit']}, torch {zoo['meta/torch_version']}, "
          f"jax {ours['meta/jax_version']}; ours float32, zoology f32 = its code as is, "
          f"f64 = the same code built and run in float64\n")
    table = ZooTable(args.tol)
    expected = []  # (ok, must_pass)

    def row(op, src, sp, label, zp, zlabel, out_key, must=True, grads=True):
        out = diff(src[sp + out_key], zoo[zp + out_key])
        g = grads_diff(src, sp + "grad_", zoo, zp + "grad_") if grads else None
        ok = table.add(op if must else "CONTROL " + op, label, zlabel, out, None, g)
        expected.append((ok, must))

    buffers = [("z_init", "position_embedding(128)", "PositionalEmbedding.z (init)"),
               ("t", "linspace(0, 1, max_len) in filters", "PositionalEmbedding.t"),
               ("deltas", "decay_deltas(32)", "ExponentialModulation.deltas")]
    for key, label, zlabel in buffers:
        for dt in ("f32", "f64"):
            row(f"buffer {key}", ours, "buffers/", label, f"buffers/{dt}/", f"{zlabel} {dt}",
                key, grads=False)

    lengths = sorted({int(k.split("/")[1][1:]) for k in ours if k.startswith("filter/")})
    for length in lengths:
        op = f"filter L={length} (max_len 128)"
        fp = f"filter/L{length}/"
        for dt in ("f32", "f64"):
            row(op, ours, fp, "Hyena.filters(L)[0]", f"{fp}{dt}/", f"Filter.filter(L)[0] {dt}",
                "h")
        row(op + " (zoology vs zoology)", zoo, f"{fp}f32/", "zoology Filter.filter f32",
            f"{fp}f64/", "Filter.filter f64", "h")
        row(op, ours, fp, "Hyena.filters(L)[0]", f"{fp}control_nodecay/f32/",
            "Filter.filter f32, modulate=False (no decay)", "h", must=False)

    for length in lengths:
        op = f"conv L={length} D=16"
        cp = f"conv/L{length}/"
        label = "Hyena.__call__ (stand-in self): FFT conv + u bias"
        for dt in ("f32", "f64"):
            row(op, ours, cp, label, f"{cp}{dt}/", f"fftconv_ref(gelu=False) {dt}", "o")
        row(op + " (zoology vs zoology)", zoo, f"{cp}f32/", "zoology fftconv_ref f32",
            f"{cp}f64/", "fftconv_ref f64", "o")
        row(op, ours, cp, label, f"{cp}control_late/f32/", "fftconv_ref f32, k one tap late",
            "o", must=False)

    for length in lengths:
        op = f"layer L={length} dim=32"
        for variant in ("sfo3", "sfo0"):
            for dt in ("f32", "f64"):
                row(op, ours, f"layer/{variant}/L{length}/", LAYER[variant],
                    f"layer/{variant}/L{length}/{dt}/", f"{ZLAYER[variant]} {dt}", "y")
            row(op + " (zoology vs zoology)", zoo, f"layer/{variant}/L{length}/f32/",
                f"zoology {ZLAYER[variant]} f32", f"layer/{variant}/L{length}/f64/",
                f"{ZLAYER[variant]} f64", "y")
        row(op, ours, f"layer/sfo3/L{length}/", LAYER["sfo3"],
            f"layer/control_reversed_taps/L{length}/f32/",
            "Hyena(l_max=128) f32, short conv taps reversed", "y", must=False)
        if f"layer/control_maxlen/L{length}/y" in ours:
            row(op, ours, f"layer/control_maxlen/L{length}/", "hyena built with max_len=77",
                f"layer/sfo3/L{length}/f64/", "Hyena(l_max=128) f64", "y", must=False)

    return report(table, expected)


if __name__ == "__main__":
    sys.exit(main())
