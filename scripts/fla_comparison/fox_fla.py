"""fla's side of the fox comparison (README.md): loads $CMP_DIR/fox_inputs.npz (written by
fox_ours.py), runs flash-linear-attention's naive_forgetting_attn (the verbatim copy made
by setup.sh in $CMP_DIR/fla_src) and a plain-torch re-write of fla's ForgettingAttention
forward around it, and saves outputs and gradients, converted to our layouts, to
$CMP_DIR/fox_fla.npz. Run with the torch venv:

    /tmp/torchvenv/bin/python scripts/fla_comparison/fox_fla.py

dtypes: "f32" runs fla's code as it is (naive_forgetting_attn casts q, k, v, g to float32).
"f64" is a float64 reference: the same verbatim source executed with `.float()` read as
`.double()` (its only dtype cast); no other change.

fla layouts: q/k/v BxTxHxD, g (log f) BxTxH; ours BxHxLxD and BxHxL. Layer weights: ours
flax kernels D_in x D_out (torch Linear weight = kernel^T), forget.bias = f_proj.bias.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kda_fla import _SAME, _T, FLA_SRC, _read, mapped_layer, npy, t  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
OP_GRADS = ("q", "k", "v", "logf")
HEAD_DIM = 16  # layer: dim 32, 2 heads

# our parameter name -> (fla's name, our array -> fla's layout, and back)
PARAM_MAP = {
    "query.kernel": ("q_proj.weight", _T),
    "key.kernel": ("k_proj.weight", _T),
    "value.kernel": ("v_proj.weight", _T),
    "out.kernel": ("o_proj.weight", _T),
    "forget.kernel": ("f_proj.weight", _T),
    "forget.bias": ("f_proj.bias", _SAME),
    "gate.kernel": ("g_proj.weight", _T),
}
# fla has one attention form: our dense and flash variants are both read against these.
VARIANTS = {"nogate": False, "gate": True}  # use_output_gate


def load_naive(dtype):
    """naive_forgetting_attn from fla/ops/forgetting_attn/naive.py, verbatim (f64: `.float()`
    read as `.double()`)."""
    src = _read("fla/ops/forgetting_attn/naive.py")
    if dtype == "f64":
        assert src.count(".float()") == 4, "naive.py changed: recheck the f64 substitution"
        src = src.replace(".float()", ".double()")
    ns = {"__name__": "fla_naive_forgetting_attn"}
    exec(compile(src, "fla/ops/forgetting_attn/naive.py", "exec"), ns)
    return ns["naive_forgetting_attn"]


def shift_one(g_BxTxH):
    """g moved one position later (g'_0 = 0): c'_i = c_{i-1}, the bias off by one token."""
    return torch.cat([torch.zeros_like(g_BxTxH[:, :1]), g_BxTxH[:, :-1]], dim=1)


# ----------------------------------------------------------------------------- op level


def run_op(inp, out, length, dtype, tag=None, g_transform=None):
    p = f"op/L{length}/"
    args = [t(inp[p + a], dtype, grad=True) for a in OP_GRADS]
    q, k, v, logf = args
    to_fla = lambda x: x.transpose(1, 2)  # noqa: E731  BxHxL... <-> BxLxH...
    g = to_fla(logf)
    if g_transform is not None:
        g = g_transform(g)
    o = to_fla(load_naive(dtype)(to_fla(q), to_fla(k), to_fla(v), g))
    torch.sum(t(inp[p + "w_o"], dtype) * o).backward()
    key = f"{p}{tag or 'naive'}/{dtype}/"
    out[key + "o"] = npy(o)
    for a, x in zip(OP_GRADS, args):
        out[key + "grad_" + a] = npy(x.grad)


# ----------------------------------------------------------------------------- layer


def fla_layer_forward(P, x, dtype, use_output_gate, forget_sign=1.0):
    """fla/layers/forgetting_attn.py ForgettingAttention.forward, no mask, no cache, no
    cu_seqlens (qkv_bias False, qk_norm False, window_size None, num_kv_heads = num_heads:
    the defaults), line by line with parallel_forgetting_attn (Triton) replaced by
    naive_forgetting_attn (same scale default K^-0.5, same g: log f per token, cumulated
    inside). forget_sign=-1: the control (f = logsigmoid(-f_proj(x)))."""
    naive = load_naive(dtype)
    fdt = torch.float64 if dtype == "f64" else torch.float32  # the layer's `.float()`
    q, k, v = (F.linear(x, P[n]) for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight"))
    f = F.logsigmoid(forget_sign * F.linear(x, P["f_proj.weight"], P["f_proj.bias"]).to(fdt))
    q = rearrange(q, '... (h d) -> ... h d', d=HEAD_DIM)
    k = rearrange(k, '... (h d) -> ... h d', d=HEAD_DIM)
    v = rearrange(v, '... (h d) -> ... h d', d=HEAD_DIM)
    o = naive(q, k, v, f)
    o = rearrange(o, '... h d -> ... (h d)')
    if use_output_gate:
        o = F.linear(x, P["g_proj.weight"]).sigmoid() * o
    return F.linear(o, P["o_proj.weight"])


def run_layer(inp, out, variant, length, dtype, tag=None, forget_sign=1.0):
    gate = VARIANTS[variant]
    pmap = {n: m for n, m in PARAM_MAP.items() if gate or not n.startswith("gate.")}
    mapped_layer(inp, out, pmap, "layer/param/", length,
                 f"layer/{variant}/L{length}/{tag or 'naive'}/{dtype}/", dtype,
                 lambda P, x: fla_layer_forward(P, x, dtype, gate, forget_sign), known=PARAM_MAP)


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    inp = dict(np.load(os.path.join(CMP_DIR, "fox_inputs.npz")))
    with open(os.path.join(FLA_SRC, "COMMIT")) as fh:
        commit = fh.read().strip()
    out = {}
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("op/")})
    for length in lengths:
        for dtype in ("f32", "f64"):
            run_op(inp, out, length, dtype)
        # Control: the forget bias one position late (c_{i-1} - c_{j-1}).
        run_op(inp, out, length, "f32", tag="control_shift", g_transform=shift_one)
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("layer/L")})
    for variant in VARIANTS:
        for length in lengths:
            for dtype in ("f32", "f64"):
                run_layer(inp, out, variant, length, dtype)
            # Control: the forget gate's sign flipped (f = sigmoid(-(W_f x + b_f))).
            run_layer(inp, out, variant, length, "f32", tag="control_sign", forget_sign=-1.0)
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/fla_commit"] = np.array(commit)
    np.savez(os.path.join(CMP_DIR, "fox_fla.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, "
          f"fla {commit}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
