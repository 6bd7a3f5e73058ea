"""fla's side of the path comparison (README.md, section "path"): loads
$CMP_DIR/path_inputs.npz (written by path_ours.py), runs flash-linear-attention's
naive_path_attn (the verbatim copy made by path_setup.sh in $CMP_DIR/path_src) and a
plain-torch, line-by-line re-write of fla's PaTHAttention.forward around it, and saves
outputs and gradients, converted to our layouts, to $CMP_DIR/path_fla.npz. Run with the
torch venv:

    nice -n 10 /tmp/torchvenv/bin/python scripts/fla_comparison/path_fla.py

dtypes: "f32" runs fla's code as it is (naive_path_attn casts q, k, v, w, beta, g to
torch.float, i.e. float32). "f64" is a float64 reference: the same verbatim source executed
with `torch.float` resolved to float64 (kda_fla.py's stand-in `torch` module in the
function's globals) and torch's default dtype set to float64 during the call: the naive
op's logit matrix is `torch.zeros(b, h, seq_len, seq_len, device=q.device)`, i.e. the
default dtype, whatever q's (README "path": measured effect). No other change.

fla layouts: q/k/v/w BxTxHxK, beta and g BxTxH; ours BxHxLxK and BxHxL. Layer weights:
ours flax kernels D_in x D_out (torch Linear weight = kernel^T), our w_conv W x C (fla's
Conv1d weight C x 1 x W), beta.bias = bt_proj.bias, forget.bias = g_proj.bias.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kda_fla import _CONV, _SAME, _T, _Torch64, l2norm, mapped_layer, npy, short_conv, t  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
PATH_SRC = os.path.join(CMP_DIR, "path_src")
OP_GRADS = ("q", "k", "v", "w", "beta", "logf")
OP_GATES = ("nogate", "gate")
HEAD_DIM = 16  # layer: dim 32, 2 heads
NAIVE_CHUNK = 64  # naive_path_attn's default chunk_size (fla's test calls it so)

# our parameter name -> (fla's name, our array -> fla's layout, and back)
PARAM_MAP = {
    "query.kernel": ("q_proj.weight", _T),
    "key.kernel": ("k_proj.weight", _T),
    "value.kernel": ("v_proj.weight", _T),
    "out.kernel": ("o_proj.weight", _T),
    "w_down.kernel": ("w_proj.0.weight", _T),
    "w_up.kernel": ("w_proj.1.weight", _T),
    "w_conv": ("w_conv1d.weight", _CONV),
    "beta.kernel": ("bt_proj.weight", _T),
    "beta.bias": ("bt_proj.bias", _SAME),
    "forget.kernel": ("g_proj.weight", _T),
    "forget.bias": ("g_proj.bias", _SAME),
}
VARIANTS = {"nogate": False, "gate": True}  # use_forget_gate


def _read(rel):
    with open(os.path.join(PATH_SRC, rel)) as fh:
        return fh.read()


def load_naive(dtype):
    """naive_path_attn from fla/ops/path_attn/naive.py, verbatim; f64: `torch.float` read
    as float64 (its `.to(torch.float)`) and, inside the call, torch's default dtype float64
    (its `torch.zeros(b, h, seq_len, seq_len)`)."""
    ns = {"__name__": "fla_naive_path_attn"}
    exec(compile(_read("fla/ops/path_attn/naive.py"), "fla/ops/path_attn/naive.py", "exec"), ns)
    fn = ns["naive_path_attn"]
    if dtype != "f64":
        return fn
    ns["torch"] = _Torch64()  # the function reads `torch` from these globals at call time

    def run(*args, **kwargs):
        with default_dtype(torch.float64):
            return fn(*args, **kwargs)
    return run


@contextlib.contextmanager
def default_dtype(dt):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def shift_one(x_BxTx):
    """x moved one position later (x'_0 = 0): each H_s built from the previous token's w."""
    return torch.cat([torch.zeros_like(x_BxTx[:, :1]), x_BxTx[:, :-1]], dim=1)


# ----------------------------------------------------------------------------- op level


def run_op(inp, out, length, gate, dtype, tag=None, chunk_size=NAIVE_CHUNK, w_transform=None):
    p = f"op/L{length}/"
    names = [a if a != "logf" else f"logf_{gate}" for a in OP_GRADS]
    # Without the gate, g = 0 is a constant (as in fla's test): no gradient w.r.t. it.
    args = [t(inp[p + n], dtype, grad=(gate == "gate" or a != "logf"))
            for a, n in zip(OP_GRADS, names)]
    q, k, v, w, beta, logf = args
    to_fla = lambda x: x.transpose(1, 2)  # noqa: E731  BxHxL... <-> BxLxH...
    w_fla = to_fla(w)
    if w_transform is not None:
        w_fla = w_transform(w_fla)
    o = to_fla(load_naive(dtype)(to_fla(q), to_fla(k), to_fla(v), w_fla, to_fla(beta),
                                 to_fla(logf), scale=q.shape[-1] ** -0.5,
                                 chunk_size=chunk_size))
    torch.sum(t(inp[p + "w_o"], dtype) * o).backward()
    key = f"{p}{gate}/{tag or 'naive'}/{dtype}/"
    out[key + "o"] = npy(o)
    for a, x in zip(OP_GRADS, args):
        if x.requires_grad:
            out[key + "grad_" + a] = npy(x.grad)


# ----------------------------------------------------------------------------- layer


def fla_layer_forward(P, x, dtype, use_forget_gate, reverse_taps=False):
    """fla/layers/path_attn.py PaTHAttention.forward, training path (attention_mask None,
    no cu_seqlens, no cache), defaults (num_kv_heads = num_heads, use_qk_norm False: the
    identity, use_low_rank_w, use_w_shortconv, conv_size 3, conv_bias False), line by line.
    The class itself is not run: its module imports transformers and fla's Triton kernels.
    ShortConvolution is kda_fla.short_conv (Conv1d, padding W-1 cut to T, SiLU), l2_norm
    kda_fla.l2norm (eps 1e-6), and parallel_path_attn (Triton) the naive op with
    parallel_path_attn's defaults: scale = K^-0.5; g None -> zeros (as
    tests/ops/test_path_attn.py feeds the naive op). reverse_taps: the control."""
    naive = load_naive(dtype)
    fdt = torch.float64 if dtype == "f64" else torch.float32  # the layer's `.float()`
    q = F.linear(x, P["q_proj.weight"])
    k = F.linear(x, P["k_proj.weight"])
    v = F.linear(x, P["v_proj.weight"])
    w = F.linear(F.linear(x, P["w_proj.0.weight"]), P["w_proj.1.weight"])
    beta = F.linear(x, P["bt_proj.weight"], P["bt_proj.bias"]).to(fdt).sigmoid() * 2
    g = (F.logsigmoid(F.linear(x, P["g_proj.weight"], P["g_proj.bias"]).to(fdt))
         if use_forget_gate else None)
    w = short_conv(w, P["w_conv1d.weight"], reverse_taps)
    q = rearrange(q, '... (h d) -> ... h d', d=HEAD_DIM)
    k = rearrange(k, '... (h d) -> ... h d', d=HEAD_DIM)
    v = rearrange(v, '... (h d) -> ... h d', d=HEAD_DIM)
    w = rearrange(w, '... (h d) -> ... h d', d=HEAD_DIM)
    w = l2norm(w).to(fdt)  # l2_norm(w, output_dtype=torch.float32)
    if g is None:
        g = torch.zeros(q.shape[:3], dtype=fdt)
    o = naive(q, k, v, w, beta, g, scale=k.shape[-1] ** -0.5)
    o = rearrange(o, '... h d -> ... (h d)')
    return F.linear(o, P["o_proj.weight"])


def run_layer(inp, out, variant, length, dtype, tag=None, reverse_taps=False):
    gate = VARIANTS[variant]
    pmap = {n: m for n, m in PARAM_MAP.items() if gate or not n.startswith("forget.")}
    mapped_layer(inp, out, pmap, "layer/param/", length,
                 f"layer/{variant}/L{length}/{tag or 'naive'}/{dtype}/", dtype,
                 lambda P, x: fla_layer_forward(P, x, dtype, gate, reverse_taps), known=PARAM_MAP)


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    inp = dict(np.load(os.path.join(CMP_DIR, "path_inputs.npz")))
    with open(os.path.join(PATH_SRC, "COMMIT")) as fh:
        commit = fh.read().strip()
    out = {}
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("op/")})
    for length in lengths:
        for gate in OP_GATES:
            for dtype in ("f32", "f64"):
                run_op(inp, out, length, gate, dtype)
            # fla against itself: the naive op's own chunking (16 instead of 64), float64.
            run_op(inp, out, length, gate, "f64", tag="naive16", chunk_size=16)
            # Control: each H_s built from the previous token's w.
            run_op(inp, out, length, gate, "f32", tag="control_wshift", w_transform=shift_one)
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("layer/L")})
    for variant in VARIANTS:
        for length in lengths:
            for dtype in ("f32", "f64"):
                run_layer(inp, out, variant, length, dtype)
            # Control: the short convolution's taps reversed.
            run_layer(inp, out, variant, length, "f32", tag="control_taps", reverse_taps=True)
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/fla_commit"] = np.array(commit)
    np.savez(os.path.join(CMP_DIR, "path_fla.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, "
          f"fla {commit}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
