"""Prints the moba comparison as markdown tables (results/cpu/moba_vs_original.md), from
$CMP_DIR/moba_ours.npz, moba_orig.npz and moba_inputs.npz. numpy only: runs in either venv.

    python scripts/fla_comparison/compare_moba.py [--tol 1e-4]

Per row: max |ours - original| over the tensor, and rel = that / max |original| over the same
tensor (compare_kda.py's `diff`: a NaN or inf on either side reads NaN, never hidden).
grads: the worst over the inputs (op level: q, k, v; layer: x and every parameter), the
input named. Padded positions (the varlen row, the padded layer runs) are 0 on both sides.

One exception, stated in its own rows: without rotary, dL/d key.bias is exactly 0 (the bias
adds q_i . b to every logit of query i, a constant under the softmax; the block choice has
no gradient), so its rel would divide float32 rounding by float64 rounding (1e-14). The
non-rotary layer rows leave key.bias out of "grads"; the "key.bias" rows give each side's
max |dL/d key.bias| and rel = ours' / the row's largest gradient (must be <= tol).

Expected: 'agree' rows within tol; 'differ' rows (the CONTROLs, a perturbation of one side;
the top_k = 1 rows of MoBA's and fla's flash-attn forms, which read every earlier block
there; fla's layer with its o_norm, which ours does not have) outside it. A second table
counts the (row, head, query) whose chosen blocks differ between ours and the original's
(read off the original op's own output: moba_orig.py `probe_chosen`); a third gives the
smallest gate margin between the last chosen and the first unchosen block (float64, from the
inputs). Exit status 1 when any row is not as expected.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_kda import NONFINITE, _worse, diff, fmt, gname  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
ZERO_GRAD = "grad_param/key.bias"  # exactly 0 without rotary


def grads_diff(a, a_pfx, b, b_pfx, exclude=()):
    names = sorted(k[len(a_pfx):] for k in a if k.startswith(a_pfx))
    names = [n for n in names if a_pfx[a_pfx.rindex("/") + 1:] + n not in exclude]
    assert names, a_pfx
    worst_abs, worst_rel = (-1.0, ""), (-1.0, "")  # the first name when all are 0
    for n in names:
        err, rel = diff(a[a_pfx + n], b[b_pfx + n])
        worst_abs, worst_rel = _worse(worst_abs, (err, n)), _worse(worst_rel, (rel, n))
    return worst_abs, worst_rel


class Table:
    def __init__(self, tol):
        self.tol, self.rows, self.bad = tol, [], []

    def add(self, kind, what, ours_name, orig_name, out, grads, expect="agree"):
        rels = [out[1], grads[1][0]]
        ok = all(r <= self.tol for r in rels)  # False for NaN
        verdict = "ok" if ok else "FAIL"
        if NONFINITE:
            sides = {"left": "'ours' column", "right": "'original' column"}
            verdict += " (NaN/inf: " + " and ".join(sides[x] for x in sorted(NONFINITE)) + ")"
            NONFINITE.clear()
        as_expected = ok == (expect == "agree")
        if not as_expected:
            self.bad.append(len(self.rows))
        self.rows.append(dict(
            kind=kind, cells=[what, ours_name, orig_name, fmt(out[0]), fmt(out[1]),
                              f"{fmt(grads[0][0])} ({gname(grads[0][1])})",
                              f"{fmt(grads[1][0])} ({gname(grads[1][1])})", expect,
                              verdict + ("" if as_expected else " (NOT AS EXPECTED)")],
            worst=max(r if np.isfinite(r) else np.inf for r in rels), expect=expect))
        return ok

    HEAD = ["case", "ours", "original", "out max abs", "out max rel", "grads max abs",
            "grads max rel", "expected"]

    def print(self):
        head = self.HEAD + [f"rel <= {self.tol:g}"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in self.rows:
            print("| " + " | ".join(r["cells"]) + " |")

    def print_summary(self):
        """Per kind: the worst row (agree: the largest rel; differ: the smallest)."""
        head = ["kind", "rows"] + self.HEAD + [f"rel <= {self.tol:g}"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        kinds = []
        for r in self.rows:
            if r["kind"] not in kinds:
                kinds.append(r["kind"])
        for kind in kinds:
            rows = [r for r in self.rows if r["kind"] == kind]
            pick = (max if rows[0]["expect"] == "agree" else min)(rows, key=lambda r: r["worst"])
            print("| " + " | ".join([kind, str(len(rows))] + pick["cells"]) + " |")


def layer_row(table, kind, what, src, src_pfx, orig, orig_pfx, ours_name, orig_name,
              expect="agree", no_rotary=False):
    out = diff(src[src_pfx + "y"], orig[orig_pfx + "y"])
    g = grads_diff(src, src_pfx + "grad_", orig, orig_pfx + "grad_",
                   exclude=(ZERO_GRAD,) if no_rotary else ())
    return table.add(kind, what, ours_name, orig_name, out, g, expect)


def op_row(table, kind, what, src, src_pfx, orig, orig_pfx, ours_name, orig_name,
           expect="agree"):
    out = diff(src[src_pfx + "o"], orig[orig_pfx + "o"])
    g = grads_diff(src, src_pfx + "grad_", orig, orig_pfx + "grad_")
    return table.add(kind, what, ours_name, orig_name, out, g, expect)


def gate_margins(inp, case, top_k):
    """The smallest (float64) gap between the gate of the last chosen block and that of the
    first unchosen candidate, over every real query with more candidates than top_k - 1."""
    p = f"op/{case}/"
    q, k = inp[p + "q"].astype(np.float64), inp[p + "k"].astype(np.float64)
    bs = int(inp[p + "block_size"])
    best = np.inf
    for b, n in enumerate(int(a) for a in inp[p + "lengths"]):
        n_full = n // bs
        if n_full == 0 or top_k < 2:
            continue
        means = k[b, :, :n_full * bs].reshape(k.shape[1], n_full, bs, -1).mean(2)  # H x N x K
        gate = np.einsum("hik,hnk->hin", q[b, :, :n], means)  # H x L x N
        for i in range(n):
            cand = i // bs  # blocks 0 .. own - 1
            if cand <= top_k - 1:
                continue
            g = -np.sort(-gate[:, i, :cand], axis=-1)
            best = min(best, float((g[:, top_k - 2] - g[:, top_k - 1]).min()))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    ours = dict(np.load(os.path.join(CMP_DIR, "moba_ours.npz")))
    orig = dict(np.load(os.path.join(CMP_DIR, "moba_orig.npz")))
    inp = dict(np.load(os.path.join(CMP_DIR, "moba_inputs.npz")))
    print(f"MoonshotAI/MoBA {orig['meta/moba_commit']}, fla {orig['meta/fla_commit']}, "
          f"torch {orig['meta/torch_version']}, transformers "
          f"{orig['meta/transformers_version']}, jax {ours['meta/jax_version']}; ours "
          "float32; originals f32 = their code as is, f64 = the same code in float64\n")
    table = Table(args.tol)
    choices, margins, extra_bad = [], [], []

    # ------------------------------------------------------------------ op level
    for case in sorted({k.split("/")[1] for k in inp if k.startswith("op/")}, reverse=True):
        p = f"op/{case}/"
        lengths = [int(a) for a in inp[p + "lengths"]]
        bs = int(inp[p + "block_size"])
        _, h, length, dim = inp[p + "q"].shape
        rows = "x".join(str(n) for n in lengths)
        for top_k in (int(a) for a in inp[p + "top_ks"]):
            tag = f"L {rows} bs {bs} top_k {top_k}"
            key = f"{p}k{top_k}/"
            quirk = top_k == 1
            for impl, label in (("dense", "dense (attend)"), ("flash", "flash"),
                                ("flash32", "flash, tiles 32"), ("flash16", "flash, tiles 16")):
                for dt in (("f32", "f64") if impl == "dense" else ("f64",)):
                    op_row(table, "op: ours vs moba_attn_varlen_naive", tag, ours,
                           f"{key}{impl}/", orig, f"{key}naive/{dt}/", label, f"naive {dt}")
            for impl, name in (("efficient", "MoBA moba_attn_varlen"),
                               ("parallel", "fla parallel_moba")):
                kind = ("op top_k 1: ours vs the flash-attn forms (they read every block)"
                        if quirk else "op: ours vs the flash-attn forms (stand-ins)")
                op_row(table, kind, tag, ours, f"{key}dense/", orig, f"{key}{impl}/f64/",
                       "dense (attend)", f"{name} f64", "differ" if quirk else "agree")
            op_row(table, "op: original f32 vs f64", tag, orig, f"{key}naive/f32/", orig,
                   f"{key}naive/f64/", "naive f32 (orig)", "naive f64")
            if quirk:
                for impl, name in (("efficient", "MoBA moba_attn_varlen"),
                                   ("parallel", "fla parallel_moba")):
                    n_blocks = -(-length // bs)
                    op_row(table, "op top_k 1: the flash-attn forms vs naive, every block",
                           tag, orig, f"{key}{impl}/f64/", orig,
                           f"{key}naive_all_blocks/f64/", f"{name} f64 (orig)",
                           f"naive f64, top_k {n_blocks}")
            op_row(table, "op CONTROL: naive reading one block more", tag, ours,
                   f"{key}dense/", orig, f"{key}control_topk/f32/", "dense (attend)",
                   f"naive f32, top_k {top_k + 1}", "differ")
            real = np.arange(length)[None, None, :] < np.asarray(lengths)[:, None, None]
            real = np.broadcast_to(real, (len(lengths), h, length))
            for impl, dt in (("naive", "f32"), ("naive", "f64"), ("parallel", "f32")):
                n_diff = int(((ours[key + "chosen"] != orig[f"{key}{impl}/{dt}/chosen"])
                              .any(-1) & real).sum())
                expect_diff = quirk and impl == "parallel"
                choices.append((tag, f"{impl} {dt}", n_diff, int(real.sum()),
                                "> 0" if expect_diff else "0"))
                if (n_diff > 0) != expect_diff:
                    extra_bad.append(f"chosen {tag} {impl} {dt}")
            margins.append((tag, gate_margins(inp, case, top_k)))

    # ------------------------------------------------------------------ layer
    cases = sorted({k.split("/")[1] for k in inp
                    if k.startswith("layer/") and k.endswith("/config")}, reverse=True)
    for case in cases:
        length, bs, top_k = (int(a) for a in inp[f"layer/{case}/config"])
        tag = f"L {length} bs {bs} top_k {top_k}"
        src = f"layer/{case}/"
        pad = int((~inp[src + "mask"]).sum())
        for variant, rot in (("dense", False), ("flash", False), ("dense_rope", True),
                             ("flash_rope", True)):
            ref = "rope" if rot else "plain"
            for dt in (("f32", "f64") if variant.startswith("dense") else ("f64",)):
                layer_row(table, "layer: ours vs MoBA in LlamaAttention", tag, ours,
                          f"{src}{variant}/", orig, f"{src}llama/{ref}/{dt}/", variant,
                          f"LlamaAttention + moba_naive {dt}" + ("" if rot else ", cos 1 sin 0"),
                          no_rotary=not rot)
            if rot:
                for core in ("naive", "parallel"):
                    for dt in (("f32", "f64") if core == "naive" else ("f64",)):
                        layer_row(table, "layer: ours vs fla MoBA (o_norm -> Identity)", tag,
                                  ours, f"{src}{variant}/", orig,
                                  f"{src}fla_{core}/{dt}/", variant,
                                  f"fla MoBA, core {core} {dt}")
                        layer_row(table, "layer padded: ours vs fla MoBA attention_mask",
                                  f"{tag}, row 2 right-padded by {pad}", ours,
                                  f"{src}padded/{variant}/", orig,
                                  f"{src}padded/fla_{core}/{dt}/", variant + ", padding_mask",
                                  f"fla MoBA attention_mask, core {core} {dt}")
        # the key.bias gradient without rotary (exactly 0)
        for variant in ("dense", "flash"):
            g_scale = max(float(np.abs(ours[k]).max()) for k in ours
                          if k.startswith(f"{src}{variant}/grad_"))
            g_ours = float(np.abs(ours[f"{src}{variant}/{ZERO_GRAD}"]).max())
            g32, g64 = (float(np.abs(orig[f"{src}llama/plain/{dt}/{ZERO_GRAD}"]).max())
                        for dt in ("f32", "f64"))
            rel = g_ours / g_scale
            ok = rel <= args.tol
            if not ok:
                table.bad.append(f"key.bias {tag} {variant}")
            table.rows.append(dict(
                kind="layer: dL/d key.bias without rotary (exactly 0)",
                cells=[tag, variant, f"max abs: LlamaAttention f32 {fmt(g32)}, f64 {fmt(g64)}",
                       "-", "-", f"{fmt(g_ours)} (key.bias)",
                       f"{fmt(rel)} (of the largest gradient, {g_scale:.1f})", "agree",
                       "ok" if ok else "FAIL"], worst=rel, expect="agree"))
        # the originals against each other
        layer_row(table, "layer: original vs original", tag, orig, f"{src}llama/rope/f32/",
                  orig, f"{src}llama/rope/f64/", "LlamaAttention + moba_naive f32 (orig)",
                  "LlamaAttention + moba_naive f64")
        layer_row(table, "layer: original vs original", tag, orig, f"{src}fla_parallel/f64/",
                  orig, f"{src}llama/rope/f64/", "fla MoBA, core parallel f64 (orig)",
                  "LlamaAttention + moba_naive f64")
        # controls and the structural difference
        layer_row(table, "layer CONTROL: q/k rows not permuted (rotary)", tag, ours,
                  f"{src}dense_rope/", orig, f"{src}control_noperm/rope/f32/", "dense_rope",
                  "LlamaAttention f32, q/k_proj rows unpermuted", "differ")
        layer_row(table, "layer CONTROL: one block more", tag, ours, f"{src}dense_rope/", orig,
                  f"{src}control_topk/f32/", "dense_rope", f"fla MoBA f32, moba_topk {top_k + 1}",
                  "differ")
        layer_row(table, "layer DIFFERENCE: fla's o_norm kept", tag, ours, f"{src}dense_rope/",
                  orig, f"{src}fla_with_o_norm/f32/", "dense_rope",
                  "fla MoBA f32 with its o_norm (RMSNorm)", "differ")

    table.print()
    print("\nWorst row of each kind (agree: largest rel; differ: smallest):\n")
    table.print_summary()
    print("\n| op | original | (row, head, query) whose chosen blocks differ from ours | of "
          "| expected |")
    print("|---|---|---|---|---|")
    for tag, name, n_diff, n, expect in choices:
        print(f"| {tag} | {name} | {n_diff} | {n} | {expect} |")
    print("\n| op | smallest float64 gate gap, last chosen - first unchosen |")
    print("|---|---|")
    for tag, m in margins:
        print(f"| {tag} | {'- (no choice)' if not np.isfinite(m) else f'{m:.2e}'} |")
    n_checks = len(table.rows) + len(choices)
    n_bad = len(table.bad) + len(extra_bad)
    print(f"\n{n_checks} checks; {n_bad} not as expected (expected: every 'agree' row within "
          "tolerance, every 'differ' row outside it, the chosen blocks as listed)")
    for b in extra_bad:
        print("not as expected:", b)
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
