"""Prints the kda / fla comparison as a markdown table (README.md), from
$CMP_DIR/kda_ours.npz and $CMP_DIR/kda_fla.npz. numpy only: runs in either venv.

    python scripts/fla_comparison/compare_kda.py [--tol 1e-4]

Per row: max |ours - fla| over the tensor, and rel = that / max |fla| over the same
tensor. grads: the worst over the inputs (op level: q, k, v, beta and the gate's raw
f, A_log, dt_bias; gate row: f, A_log, dt_bias; layer: x and every parameter), the input
named. 'ok' is every rel <= tol; the control rows must read FAIL.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")


NONFINITE = set()  # names of the sides that held a NaN or inf, per row (Table.add clears)


def diff(a, b):
    """(max |a - b|, that / max |b|); NaN for both when either holds a NaN or an inf (the
    side is noted in NONFINITE), never a number that hides one."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    for side, x in (("left", a), ("right", b)):
        if not np.isfinite(x).all():
            NONFINITE.add(side)
    if NONFINITE:
        return np.nan, np.nan
    err = float(np.max(np.abs(a - b)))
    scale = float(np.max(np.abs(b)))
    return err, err / scale if scale else (0.0 if err == 0 else np.inf)


def _worse(x, y):
    """The pair (value, name) with the larger value, NaN counting as the largest."""
    return x if np.isnan(x[0]) or (not np.isnan(y[0]) and x[0] >= y[0]) else y


def grads_diff(ours, ours_prefix, fla, fla_prefix):
    names = sorted(k[len(ours_prefix):] for k in ours if k.startswith(ours_prefix))
    assert names, ours_prefix
    worst_abs, worst_rel = (0.0, ""), (0.0, "")
    for n in names:
        err, rel = diff(ours[ours_prefix + n], fla[fla_prefix + n])
        worst_abs, worst_rel = _worse(worst_abs, (err, n)), _worse(worst_rel, (rel, n))
    return worst_abs, worst_rel


def fmt(x):
    return f"{x:.2e}"


def gname(n):
    return n.replace("grad_param/", "").replace("grad_", "")


class Table:
    def __init__(self, tol):
        self.tol, self.rows = tol, []

    def add(self, op, ours_name, fla_name, out, state, grads):
        rels = [out[1], grads[1][0]] + ([state[1]] if state else [])
        ok = all(r <= self.tol for r in rels)  # False for NaN
        verdict = "ok" if ok else "FAIL"
        if NONFINITE:
            sides = {"left": "'ours' column", "right": "'fla' column"}
            verdict += " (NaN/inf: " + " and ".join(sides[x] for x in sorted(NONFINITE)) + ")"
            NONFINITE.clear()
        self.rows.append([
            op, ours_name, fla_name, fmt(out[0]), fmt(out[1]),
            fmt(state[0]) if state else "-", fmt(state[1]) if state else "-",
            f"{fmt(grads[0][0])} ({gname(grads[0][1])})",
            f"{fmt(grads[1][0])} ({gname(grads[1][1])})", verdict])
        return ok

    def print(self):
        head = ["op", "ours", "fla", "out max abs", "out max rel", "state max abs",
                "state max rel", "grads max abs", "grads max rel", f"rel <= {self.tol:g}"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in self.rows:
            print("| " + " | ".join(r) + " |")


def row(table, src, src_pfx, fla, fla_pfx, op, label, fla_label, out_key):
    """One table row: `out_key` and the worst gradient (keys `grad_*`) of src against fla."""
    out = diff(src[src_pfx + out_key], fla[fla_pfx + out_key])
    g = grads_diff(src, src_pfx + "grad_", fla, fla_pfx + "grad_")
    return table.add(op, label, fla_label, out, None, g)


def report(table, expected):
    """Prints the table and the rows not as expected, from `expected`: (ok, must_pass) per
    row; returns the exit status (1 if any row is not as expected)."""
    table.print()
    bad = [i for i, (ok, must) in enumerate(expected) if ok != must]
    print(f"\n{len(expected)} rows; {len(bad)} not as expected "
          "(expected: every comparison within tolerance, every CONTROL outside it)")
    for i in bad:
        print("  not as expected: " + " | ".join(table.rows[i][:3] + table.rows[i][-1:]))
    return 1 if bad else 0


def op_row(table, ours, fla, case, op, ours_impl, ours_label, fla_key, fla_label,
           ours_src=None):
    """ours_src: take 'ours' from another fla result (the rounding floor rows)."""
    src = ours if ours_src is None else fla
    op_pfx = f"op/{case}/{ours_impl}/" if ours_src is None else f"op/{case}/{ours_src}/"
    fla_pfx = f"op/{case}/{fla_key}/"
    out = diff(src[op_pfx + "o"], fla[fla_pfx + "o"])
    state = diff(src[op_pfx + "S"], fla[fla_pfx + "S"])
    g = grads_diff(src, op_pfx + "grad_", fla, fla_pfx + "grad_")
    return table.add(op, ours_label, fla_label, out, state, g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "kda_ours.npz")))
    fla = dict(np.load(os.path.join(CMP_DIR, "kda_fla.npz")))
    inp = np.load(os.path.join(CMP_DIR, "kda_inputs.npz"))
    print(f"fla {fla['meta/fla_commit']}, torch {fla['meta/torch_version']}, "
          f"jax {ours['meta/jax_version']}; ours float32, fla f32 = its code as is, "
          f"f64 = the same code in float64\n")
    table = Table(args.tol)
    expected = []  # (ok, must_pass)
    cases = sorted({k.split("/")[1] for k in ours if k.startswith("op/")}, reverse=True)
    for case in cases:
        b, h, length, k = inp[f"op/{case}/q"].shape
        v = inp[f"op/{case}/v"].shape[-1]
        tag = f"L={length} d_v={v}"
        for dt in ("f32", "f64"):
            out = diff(ours[f"op/{case}/gate/g"], fla[f"op/{case}/gate/{dt}/g"])
            g = grads_diff(ours, f"op/{case}/gate/grad_", fla, f"op/{case}/gate/{dt}/grad_")
            ok = table.add(f"gate {tag}", "KDADirection.gates", f"naive_kda_gate {dt}",
                           out, None, g)
            expected.append((ok, True))
        has_chunk = f"op/{case}/chunk/f32/o" in fla
        for impl, label in [("reference", "delta_rule_reference")] + [
                (f"chunk{c}", f"chunk_kda C={c}") for c in (16, 32, 64)]:
            flas = [("recurrent/f32", "naive_recurrent_kda f32"),
                    ("recurrent/f64", "naive_recurrent_kda f64")]
            if has_chunk:
                flas.append(("chunk/f32", "naive_chunk_kda(64) f32"))
            for fk, fl in flas:
                ok = op_row(table, ours, fla, case, f"op {tag}", impl, label, fk, fl)
                expected.append((ok, True))
        # fla's own float32 against its float64: the rounding floor.
        floors = [("recurrent/f32", "fla naive_recurrent_kda f32")]
        if has_chunk:
            floors += [("chunk/f32", "fla naive_chunk_kda(64) f32"),
                       ("chunk/f64", "fla naive_chunk_kda(64) f64")]
        for src, label in floors:
            ok = op_row(table, ours, fla, case, f"op {tag} (fla vs fla)", None, label,
                        "recurrent/f64", "naive_recurrent_kda f64", ours_src=src)
            expected.append((ok, True))
        ok = op_row(table, ours, fla, case, f"CONTROL op {tag}", "reference",
                    "delta_rule_reference", "control_gmean/f32",
                    "naive_recurrent_kda f32, g -> mean_K(g)")
        expected.append((ok, False))

    lengths = sorted({int(k.split("/")[1][1:]) for k in ours if k.startswith("layer/L")})
    for length in lengths:
        p = f"layer/L{length}/"
        fkeys = [("recurrent/f32", "layer + naive_recurrent_kda f32"),
                 ("recurrent/f64", "layer + naive_recurrent_kda f64")]
        has_chunk = f"{p}chunk/f32/y" in fla
        if has_chunk:
            fkeys += [("chunk/f32", "layer + naive_chunk_kda(64) f32"),
                      ("chunk/f64", "layer + naive_chunk_kda(64) f64")]
        rows = [(ours, "", fk, fl, "KimiDeltaAttention C=16 f32", True) for fk, fl in fkeys]
        floors = ["recurrent/f32"] + (["chunk/f32", "chunk/f64"] if has_chunk else [])
        for src in floors:
            form = "naive_recurrent_kda" if src.startswith("recurrent") else "naive_chunk_kda(64)"
            rows.append((fla, src + "/", "recurrent/f64", "layer + naive_recurrent_kda f64",
                         f"fla layer + {form} {src[-3:]}", True))
        rows.append((ours, "", "control_taps_reversed/f32",
                     "layer f32, conv taps reversed", "KimiDeltaAttention C=16 f32", False))
        for src, sub, fk, fl, label, must in rows:
            op = f"layer L={length}" if must else f"CONTROL layer L={length}"
            if src is fla:
                op += " (fla vs fla)"
            sp, fp = p + sub, f"{p}{fk}/"
            out = diff(src[sp + "y"], fla[fp + "y"])
            g = grads_diff(src, sp + "grad_", fla, fp + "grad_")
            ok = table.add(op, label, fl, out, None, g)
            expected.append((ok, must))
    return report(table, expected)


if __name__ == "__main__":
    sys.exit(main())
