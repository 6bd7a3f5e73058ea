"""Prints the based / Zoology comparison as markdown tables (README.md,
results/cpu/based_vs_zoology.md), from $CMP_DIR/based_ours.npz and
$CMP_DIR/based_zoology.npz. numpy only: runs in either venv.

    python scripts/fla_comparison/compare_based.py [--tol 1e-4]

Per row: max |ours - original| over the tensor, and rel = that / max |original| over the
same tensor (compare_kda.py's `diff`: a NaN or inf on either side reads NaN, never hidden).
grads: the worst over the inputs (feature map: x; op: q, k, v; layer: x and every
parameter), the input named; '-' where a form has no gradient here (decoding: its y over
every position, and over the positions reached by `step` alone). 'orig vs orig' rows are
the references against each other (f32 against f64, Zoology's two views, Zoology against
fla). 'ok' is every rel <= tol; the CONTROL rows must read FAIL. Then a summary: per kind
of row, how many and the worst. Exits 1 when any row is not as expected.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import NONFINITE, diff, fmt, gname, grads_diff  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
CAUSAL_CHUNKS = ("chunk64", "chunk16", "chunk128", "quadratic")  # the causal forms
ZVIEW = {"quadratic": "Based quadratic", "linear": "Based linear (cumsum)",
         "linear_bidir": "Based linear causal=False"}


class Table:
    def __init__(self, tol):
        self.tol, self.rows = tol, []

    def add(self, kind, case, ours, orig, out, grads, must_pass=True):
        rels = [out[1]] + ([grads[1][0]] if grads else [])
        ok = all(r <= self.tol for r in rels)  # False for NaN
        verdict = "ok" if ok else "FAIL"
        if NONFINITE:
            sides = {"left": "'ours' column", "right": "'original' column"}
            verdict += " (NaN/inf: " + " and ".join(sides[x] for x in sorted(NONFINITE)) + ")"
            NONFINITE.clear()
        self.rows.append(dict(
            kind=kind, must_pass=must_pass, ok=ok,
            worst=max(rels) if ok or must_pass else min(rels),
            cells=[case, ours, orig, fmt(out[0]), fmt(out[1]),
                   f"{fmt(grads[0][0])} ({gname(grads[0][1])})" if grads else "-",
                   f"{fmt(grads[1][0])} ({gname(grads[1][1])})" if grads else "-", verdict]))
        return ok

    def print(self):
        head = ["case", "ours", "original", "out max abs", "out max rel", "grads max abs",
                "grads max rel", f"rel <= {self.tol:g}"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in self.rows:
            print("| " + " | ".join(r["cells"]) + " |")

    def summary(self):
        """Per kind: the row count and its worst row (largest rel; for controls the row
        closest to passing, i.e. the smallest of its rels)."""
        print("| kind | rows | worst case | ours | original | out max rel | grads max rel "
              f"| rel <= {self.tol:g} |")
        print("|" + "---|" * 8)
        kinds = list(dict.fromkeys(r["kind"] for r in self.rows))
        for kind in kinds:
            rows = [r for r in self.rows if r["kind"] == kind]
            pick = (max if rows[0]["must_pass"] else min)(
                rows, key=lambda r: np.inf if np.isnan(r["worst"]) else r["worst"])
            c = pick["cells"]
            print(f"| {kind} | {len(rows)} | {c[0]} | {c[1]} | {c[2]} | {c[4]} | {c[6]} "
                  f"| {c[7]} |")


def row(table, kind, case, ours, opfx, orig, zpfx, ours_label, orig_label, out_key,
        must_pass=True, grads=True):
    out = diff(ours[opfx + out_key], orig[zpfx + out_key])
    g = grads_diff(ours, opfx + "grad_", orig, zpfx + "grad_") if grads else None
    return table.add(kind, case, ours_label, orig_label, out, g, must_pass)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "based_ours.npz")))
    z = dict(np.load(os.path.join(CMP_DIR, "based_zoology.npz")))
    inp = np.load(os.path.join(CMP_DIR, "based_inputs.npz"))
    print(f"zoology {z['meta/zoology_commit']}, fla {z['meta/fla_commit']}, "
          f"torch {z['meta/torch_version']}, jax {ours['meta/jax_version']}; ours float32, "
          "original f32 = its code as is, f64 = the same code in float64\n")
    T = Table(args.tol)
    expected = []  # (ok, must_pass)

    def add(*a, must_pass=True, **kw):
        expected.append((row(T, *a, must_pass=must_pass, **kw), must_pass))

    # feature map
    for d in sorted({int(k.split("/")[1][1:]) for k in ours if k.startswith("fm/")},
                    reverse=True):
        p = f"fm/d{d}/"
        case = f"feature map d={d}"
        for dt in ("f32", "f64"):
            add(f"feature map vs TaylorExp {dt}", case, ours, p + "ours/", z,
                f"{p}zoology/{dt}/", "taylor_features", f"TaylorExp.forward {dt}", "phi")
        add("CONTROL feature map", f"CONTROL {case}", ours, p + "ours/", z,
            f"{p}control_reversed/f32/", "taylor_features", "TaylorExp f32, x's features "
            "reversed", "phi", must_pass=False)

    # op
    for length in sorted({int(k.split("/")[1][1:]) for k in ours if k.startswith("op/")},
                         reverse=True):
        p = f"op/L{length}/"
        h, f = inp[p + "q"].shape[1], inp[p + "q"].shape[-1]
        case = f"op L={length} H={h} d={f}"
        for form in CAUSAL_CHUNKS:
            for view in ("quadratic", "linear"):
                add("op causal vs Zoology f64", case, ours, f"{p}{form}/", z,
                    f"{p}zoology_{view}/f64/", f"{form} eps 1e-12", f"{ZVIEW[view]} f64", "o")
        for view in ("quadratic", "linear"):
            add("op causal vs Zoology f32", case, ours, f"{p}chunk64/", z,
                f"{p}zoology_{view}/f32/", "chunk64 eps 1e-12", f"{ZVIEW[view]} f32", "o")
        for dt in ("f32", "f64"):
            add(f"op bidirectional vs Zoology {dt}", case, ours, f"{p}bidir/", z,
                f"{p}zoology_linear_bidir/{dt}/", "bidir eps 1e-12",
                f"{ZVIEW['linear_bidir']} {dt}", "o")
        for form in ("chunk64_eps1e-6", "chunk16_eps1e-6"):
            for fla, dt in (("parallel", "f64"), ("chunk", "f64"), ("parallel", "f32")):
                add(f"op causal vs fla naive {dt}", case, ours, f"{p}{form}/", z,
                    f"{p}fla_{fla}/{dt}/", form.replace("_", " "),
                    f"fla naive_{fla}_based {dt}", "o")
        for key, label in (("zoology_quadratic", "Zoology Based quadratic"),
                           ("zoology_linear", "Zoology Based linear"),
                           ("zoology_linear_bidir", "Zoology Based linear causal=False"),
                           ("fla_parallel", "fla naive_parallel_based"),
                           ("fla_chunk", "fla naive_chunk_based")):
            add("op original f32 vs its f64", f"{case} (orig vs orig)", z, f"{p}{key}/f32/", z,
                f"{p}{key}/f64/", f"{label} f32", f"{label} f64", "o")
        add("op Zoology quadratic vs linear (f64)", f"{case} (orig vs orig)", z,
            f"{p}zoology_quadratic/f64/", z, f"{p}zoology_linear/f64/",
            "Zoology Based quadratic f64", "Based linear (cumsum) f64", "o")
        add("op Zoology vs fla (eps 1e-12 vs 1e-6)", f"{case} (orig vs orig)", z,
            f"{p}zoology_quadratic/f64/", z, f"{p}fla_parallel/f64/",
            "Zoology Based quadratic f64", "fla naive_parallel_based f64", "o")
        add("CONTROL op", f"CONTROL {case}", ours, f"{p}chunk64/", z,
            f"{p}zoology_linear_bidir/f32/", "chunk64 (causal)",
            f"{ZVIEW['linear_bidir']} f32", "o", must_pass=False)

    # layer
    configs = list(dict.fromkeys(k.split("/")[1] for k in ours if k.startswith("layer/")))
    for config in configs:
        for length in sorted({int(k.split("/")[3][1:]) for k in ours
                              if k.startswith(f"layer/{config}/")}):
            h, f = int(config[1]), int(config[3:])
            case = f"layer {config} (H={h} feature_dim={f}) L={length}"
            forms = {k.split("/")[2] for k in ours if k.startswith(f"layer/{config}/")}
            zp = lambda view, dt: f"layer/{config}/{view}/L{length}/{dt}/"  # noqa: E731
            op = lambda form: f"layer/{config}/{form}/L{length}/"  # noqa: E731
            for form in CAUSAL_CHUNKS:
                if form not in forms:
                    continue
                for view in ("quadratic", "linear"):
                    add("layer causal vs Zoology f64", case, ours, op(form), z, zp(view, "f64"),
                        f"based {form}", f"{ZVIEW[view]} f64", "y")
            add("layer causal vs Zoology f32", case, ours, op("chunk64"), z,
                zp("quadratic", "f32"), "based chunk64", f"{ZVIEW['quadratic']} f32", "y")
            for dt in ("f32", "f64"):
                add(f"layer bidirectional vs Zoology {dt}", case, ours, op("bidir"), z,
                    zp("linear_bidir", dt), "based causal=False",
                    f"{ZVIEW['linear_bidir']} {dt}", "y")
            if "decode" in forms:
                add("layer decoding (y only) vs Zoology f64", case, ours, op("decode"), z,
                    zp("quadratic", "f64"), "based prefill + steps",
                    f"{ZVIEW['quadratic']} f64", "y", grads=False)
                # the positions reached by `step` alone (t >= row b's prompt length)
                lens = inp[f"layer/L{length}/prompt_lens"]
                steps = np.arange(length)[None] >= lens[:, None]
                out = diff(ours[op("decode") + "y"][steps], z[zp("quadratic", "f64") + "y"][steps])
                expected.append((T.add("layer decoding (y only) vs Zoology f64", case,
                                       f"based steps only ({int(steps.sum())} of {steps.size})",
                                       f"{ZVIEW['quadratic']} f64", out, None), True))
            add("layer Zoology quadratic vs linear (f64)", f"{case} (orig vs orig)", z,
                zp("quadratic", "f64"), z, zp("linear", "f64"), "Zoology Based quadratic f64",
                "Based linear (cumsum) f64", "y")
            for view in ZVIEW:
                add("layer Zoology f32 vs its f64", f"{case} (orig vs orig)", z,
                    zp(view, "f32"), z, zp(view, "f64"), f"Zoology {ZVIEW[view]} f32",
                    f"{ZVIEW[view]} f64", "y")
            add("CONTROL layer", f"CONTROL {case}", ours, op("chunk64"), z,
                zp("control_swap_qk", "f32"), "based chunk64",
                "Based quadratic f32, proj_q / proj_k swapped", "y", must_pass=False)

    T.print()
    print()
    T.summary()
    bad = [i for i, (ok, must) in enumerate(expected) if ok != must]
    print(f"\n{len(expected)} rows; {len(bad)} not as expected "
          "(expected: every comparison within tolerance, every CONTROL outside it)")
    for i in bad:
        c = T.rows[i]["cells"]
        print("  not as expected: " + " | ".join(c[:3] + c[-1:]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
