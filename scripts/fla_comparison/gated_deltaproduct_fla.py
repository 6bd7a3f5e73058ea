"""fla's side of the gated_deltaproduct comparison (README.md): loads
$CMP_DIR/gdp_inputs.npz (written by gated_deltaproduct_ours.py), runs flash-linear-attention's
naive_recurrent_gated_delta_product (verbatim copy made by setup.sh in $CMP_DIR/fla_src),
fla's chunk_gated_delta_product_ref with its Triton rule replaced by fla's own
naive_recurrent_gated_delta_rule, and a plain-torch re-write of fla's GatedDeltaProduct
forward, and saves outputs and gradients, converted to our layouts, to $CMP_DIR/gdp_fla.npz.
Run with the torch venv:

    /tmp/torchvenv/bin/python scripts/fla_comparison/gated_deltaproduct_fla.py

fla reference quirks handled here:
- naive_recurrent_gated_delta_product takes `scale` and never reads it (o = h^T q), while
  the kernel it is the reference of (chunk_gated_delta_product) defaults scale to
  K^-0.5 and the layer passes none: q is pre-scaled by K^-0.5 on fla's side before the
  naive call (the row labels say "q K^-0.5").
- chunk_gated_delta_product_ref (chunk_ref.py) calls the Triton chunk_gated_delta_rule
  and asserts q is not float32: run only in float64, with chunk_gated_delta_rule bound to
  fla's naive_recurrent_gated_delta_rule (same keyword arguments, cu_seqlens None, no
  in-kernel l2norm); its own `g.new_zeros(..., dtype=torch.float32)` keeps g float32.

dtypes: "f32" runs fla's code as it is (its naive ops cast to float32). "f64" is a float64
reference: the same verbatim source executed with `.float()` read as `.double()` and
`torch.float32` as `torch.float64`; no other change (chunk_ref.py: none at all).

Layer weights: ours flax kernels D_in x D_out (torch Linear weight = kernel^T), our conv
W x C (fla's C x 1 x W). Our k / v projection outputs and conv channels are ordered
(head, step, feature), fla's (step, head, feature) ('... t (n h d) -> ... (t n) h d');
our beta projection outputs (head, step), fla's (step, head): PARAM_MAP permutes rows
and channels (`nhd_perm`), a deliberate mapping; the layer control leaves it out.
"""
from __future__ import annotations

import ast
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kda_fla import FLA_SRC, _read, l2norm, mapped_layer, npy, short_conv, t  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
OP_GRADS = ("q", "k", "v", "beta", "g")
NORM_EPS = 1e-5  # GatedDeltaProduct's norm_eps default
NUM_HEADS, HEAD_K, HEAD_V = 2, 16, 32  # layer: dim 32, 2 heads, expand_v 2
ALLOW_NEG_EIGVAL = True  # the layer default


# ----------------------------------------------------------------------------- fla source


def _f64(src):
    return src.replace(".float()", ".double()").replace("torch.float32", "torch.float64")


def load_naive(dtype):
    """naive_recurrent_gated_delta_product from fla/ops/gated_delta_product/naive.py."""
    src = _read("fla/ops/gated_delta_product/naive.py")
    if dtype == "f64":
        src = _f64(src)
    ns = {"__name__": "fla_naive_gdp"}
    exec(compile(src, "fla/ops/gated_delta_product/naive.py", "exec"), ns)
    return ns["naive_recurrent_gated_delta_product"]


def load_chunk_ref():
    """chunk_gated_delta_product_ref (fla/ops/gated_delta_product/chunk_ref.py, the
    function's text verbatim; the module imports the Triton rules) with
    chunk_gated_delta_rule bound to fla's naive_recurrent_gated_delta_rule in float64."""
    rule_src = _f64(_read("fla/ops/gated_delta_rule/naive.py"))
    rule_ns = {"__name__": "fla_naive_gdr"}
    exec(compile(rule_src, "fla/ops/gated_delta_rule/naive.py", "exec"), rule_ns)
    naive_rule = rule_ns["naive_recurrent_gated_delta_rule"]

    def chunk_gated_delta_rule(q, k, v, g, beta, initial_state, output_final_state,
                               cu_seqlens, use_qk_l2norm_in_kernel, scale):
        assert cu_seqlens is None and not use_qk_l2norm_in_kernel
        return naive_rule(q, k, v, beta, g, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state)

    src = _read("fla/ops/gated_delta_product/chunk_ref.py")
    node = next(n for n in ast.parse(src).body
                if isinstance(n, ast.FunctionDef) and n.name == "chunk_gated_delta_product_ref")
    ns = {"torch": torch, "rearrange": rearrange,
          "chunk_gated_delta_rule": chunk_gated_delta_rule, "chunk_delta_rule": None}
    exec(compile(ast.get_source_segment(src, node),
                 "fla/ops/gated_delta_product/chunk_ref.py:chunk_gated_delta_product_ref",
                 "exec"), ns)
    return ns["chunk_gated_delta_product_ref"]


# ----------------------------------------------------------------------------- op level


def to_fla(q, k, v, beta, g):
    """Ours (q BxHxLxK, k BxHxLxNxK, v BxHxLxNxV, beta BxHxLxN, g BxHxL) -> fla's
    (q BxTxHxK, k/v Bx(T N)xHxF, beta Bx(T N)xH, g BxTxH)."""
    flat = lambda x: rearrange(x, "b h t n ... -> b (t n) h ...")  # noqa: E731
    return q.transpose(1, 2), flat(k), flat(v), flat(beta), g.transpose(1, 2)


def op_forward(impl, dtype, q, k, v, beta, g, reverse_steps=False):
    n = k.shape[3]
    if reverse_steps:  # CONTROL: each token's n steps in reverse order
        k, v, beta = k.flip(3), v.flip(3), beta.flip(3)
    qf, kf, vf, bf, gf = to_fla(q, k, v, beta, g)
    if impl == "naive":
        # naive_recurrent_gated_delta_product ignores `scale`: q pre-scaled by K^-0.5.
        o, h = load_naive(dtype)(qf * qf.shape[-1] ** -0.5, kf, vf, gf, bf, None, None,
                                 output_final_state=True, num_householder=n)
    else:  # chunk_ref, float64 only; scale None -> the rule's K^-0.5
        o, h = load_chunk_ref()(qf, kf, vf, gf, bf, num_householder=n,
                                output_final_state=True)
    return o.transpose(1, 2), h.transpose(-1, -2)


def run_op(inp, out, case, impl, dtype, tag=None, reverse_steps=False):
    p = f"op/{case}/"
    args = [t(inp[p + a], dtype, grad=True) for a in OP_GRADS]
    w_o, w_s = t(inp[p + "w_o"], dtype), t(inp[p + "w_s"], dtype)
    o, s = op_forward(impl, dtype, *args, reverse_steps=reverse_steps)
    (torch.sum(w_o * o) + torch.sum(w_s * s)).backward()
    key = f"{p}{tag or impl}/{dtype}/"
    out[key + "o"], out[key + "S"] = npy(o), npy(s)
    for a, x in zip(OP_GRADS, args):
        out[key + "grad_" + a] = npy(x.grad)


# ----------------------------------------------------------------------------- layer


def nhd_perm(n, h, d):
    """p with fla[r] = ours[p[r]]: fla's channel r = (s h + i) d + e (step s, head i,
    feature e) is our channel (i n + s) d + e."""
    s, i, e = np.meshgrid(np.arange(n), np.arange(h), np.arange(d), indexing="ij")
    return ((i * n + s) * d + e).reshape(-1)


def _rows(perm):
    """A flax kernel D_in x D_out (our column order) <-> torch weight D_out x D_in (fla's
    row order), and a conv W x C <-> C x 1 x W, both permuted by `perm` (None: none)."""
    inv = None if perm is None else np.argsort(perm)
    take = lambda a, idx: a if idx is None else a[idx]  # noqa: E731
    lin = (lambda w: take(w.T, perm), lambda w: take(w, inv).T)
    conv = (lambda w: take(w.T, perm)[:, None, :], lambda w: take(w[:, 0, :], inv).T)
    return lin, conv


def param_map(n, permute=True):
    """our parameter name -> (fla's name, our array -> fla's layout, and back)."""
    same = (lambda w: w, lambda w: w)
    plain_lin, plain_conv = _rows(None)
    k_lin, k_conv = _rows(nhd_perm(n, NUM_HEADS, HEAD_K) if permute else None)
    v_lin, v_conv = _rows(nhd_perm(n, NUM_HEADS, HEAD_V) if permute else None)
    b_lin, _ = _rows(nhd_perm(n, NUM_HEADS, 1) if permute else None)
    return {
        "query.kernel": ("q_proj.weight", plain_lin),
        "key.kernel": ("k_proj.weight", k_lin),
        "value.kernel": ("v_proj.weight", v_lin),
        "out.kernel": ("o_proj.weight", plain_lin),
        "forward_scan.conv_q": ("q_conv1d.weight", plain_conv),
        "forward_scan.conv_k": ("k_conv1d.weight", k_conv),
        "forward_scan.conv_v": ("v_conv1d.weight", v_conv),
        "forward_scan.beta.kernel": ("b_proj.weight", b_lin),
        "forward_scan.decay.kernel": ("a_proj.weight", plain_lin),
        "forward_scan.a_log": ("A_log", same),
        "forward_scan.dt_bias": ("dt_bias", same),
        "norm_scale": ("o_norm.weight", same),
        "gate.kernel": ("g_proj.weight", plain_lin),
    }


def rms_norm_gated_swish(x, g, weight, eps):
    """fla's FusedRMSNormGated (default activation 'swish') forward
    (layer_norm_gated_fwd_kernel, IS_RMS_NORM): x rsqrt(mean x^2 + eps) weight g sigmoid(g)."""
    rstd = 1 / torch.sqrt(torch.mean(x * x, -1, keepdim=True) + eps)
    return x * rstd * weight * (g * torch.sigmoid(g))


def fla_layer_forward(P, x, n, dtype):
    """fla/layers/gated_deltaproduct.py GatedDeltaProduct.forward, training path (mode
    'chunk') without padding or cache, line by line with chunk_gated_delta_product
    replaced by what it does: use_qk_l2norm_in_kernel (l2norm on q and on each of the n
    keys), scale None (K^-0.5), then the naive recurrence. Defaults: use_forget_gate,
    allow_neg_eigval, use_output_gate, use_short_conv (4 taps, no bias), num_v_heads =
    num_heads, head_dim 16 here (dim 32 / 2 heads), expand_v 2."""
    naive = load_naive(dtype)
    fdt = torch.float64 if dtype == "f64" else torch.float32  # the layer's `.float()`
    q = short_conv(F.linear(x, P["q_proj.weight"]), P["q_conv1d.weight"])
    k = short_conv(F.linear(x, P["k_proj.weight"]), P["k_conv1d.weight"])
    v = short_conv(F.linear(x, P["v_proj.weight"]), P["v_conv1d.weight"])
    q = rearrange(q, '... (h d) -> ... h d', d=HEAD_K)
    k = rearrange(k, '... t (n h d) -> ... (t n) h d', n=n, d=HEAD_K)
    v = rearrange(v, '... t (n h d) -> ... (t n) h d', n=n, d=HEAD_V)
    beta = F.linear(x, P["b_proj.weight"]).sigmoid()
    if ALLOW_NEG_EIGVAL:
        beta = beta * 2.
    beta = rearrange(beta, '... t (n h) -> ... (t n) h', n=n)
    g = -P["A_log"].to(fdt).exp() * F.softplus(F.linear(x, P["a_proj.weight"]).to(fdt)
                                                 + P["dt_bias"])
    # inside chunk_gated_delta_product:
    q, k = l2norm(q), l2norm(k)
    scale = k.shape[-1] ** -0.5
    o, _ = naive(q * scale, k, v, g, beta, scale, None, num_householder=n)
    gp = rearrange(F.linear(x, P["g_proj.weight"]), '... (h d) -> ... h d', d=HEAD_V)
    o = rms_norm_gated_swish(o, gp, P["o_norm.weight"], NORM_EPS)
    o = rearrange(o, 'b t h d -> b t (h d)')
    return F.linear(o, P["o_proj.weight"])


def run_layer(inp, out, n, length, dtype, tag=None, permute=True):
    mapped_layer(inp, out, param_map(n, permute), f"layer/n{n}/param/", length,
                 f"layer/n{n}/L{length}/{tag or 'naive'}/{dtype}/", dtype,
                 lambda P, x: fla_layer_forward(P, x, n, dtype))


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    inp = dict(np.load(os.path.join(CMP_DIR, "gdp_inputs.npz")))
    with open(os.path.join(FLA_SRC, "COMMIT")) as fh:
        commit = fh.read().strip()
    out = {}
    cases = sorted({k.split("/")[1] for k in inp if k.startswith("op/")})
    for case in cases:
        for dtype in ("f32", "f64"):
            run_op(inp, out, case, "naive", dtype)
        run_op(inp, out, case, "chunk_ref", "f64")
        # Control: each token's Householder steps applied in reverse order.
        run_op(inp, out, case, "naive", "f32", tag="control_steps_reversed",
               reverse_steps=True)
    ns = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("layer/n")})
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("layer/L")})
    for n in ns:
        for length in lengths:
            for dtype in ("f32", "f64"):
                run_layer(inp, out, n, length, dtype)
            # Control: our weights taken in fla's order as they are (no (n, h) permutation).
            run_layer(inp, out, n, length, "f32", tag="control_no_permutation", permute=False)
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/fla_commit"] = np.array(commit)
    np.savez(os.path.join(CMP_DIR, "gdp_fla.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, "
          f"fla {commit}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
