"""fla's side of the rwkv7 comparison (results/cpu/rwkv7_vs_fla.md): loads
$CMP_DIR/rwkv7_inputs.npz (written by rwkv7_ours.py), runs flash-linear-attention's naive
DPLR delta rule (verbatim copies made by rwkv7_setup.sh in $CMP_DIR/fla_src) and a
plain-torch re-write of fla's RWKV7Attention.forward around it, and saves outputs and
gradients, converted to our layouts, to $CMP_DIR/rwkv7_fla.npz. Torch venv:

    /tmp/torchvenv/bin/python scripts/fla_comparison/rwkv7_fla.py

The op: fla's chunk_rwkv7(r, w, k, v, a, b, scale=1.) is chunk_dplr_delta_rule(q=r, k, v,
a, b, gk=w, scale=1.) (fla/ops/rwkv7/chunk.py), whose plain-torch forms are
dplr_recurrence and dplr_chunkwise (fla/ops/generalized_delta_rule/dplr/naive.py, alpha =
a, beta = b). Those take head-first tensors and always scale q by d_k^-0.5, so they get
q = r * sqrt(d_k): d_k = 16 here, x 4 then x 1/4, exact in binary floating point.
dplr_chunkwise needs L % chunk == 0: chunk 32 at L 128 only.

dtypes: "f32" runs fla's code as it is (float32). "f64" is a float64 reference: the same
source with `.float()` read as `.double()`, `torch.float` as float64, and torch's default
dtype float64 while it runs (dplr_chunkwise allocates its C x C matrices with the default
dtype); no other change.

Layer: fla/layers/rwkv7.py RWKV7Attention.forward, layer_idx 0 (v_first = v, no v_lora),
fuse_norm False (the layer's default: nn.GroupNorm), no cache, line by line. fla's
verbatim torch helpers where the layer calls a Triton op with a torch reference
(token_shift_ref, torch_addcmul_rwkv7 = fused_addcmul's decode path, k_update_ref,
gate_output_correction_ref) and fla's LoRA class; chunk_rwkv7 / fused_mul_recurrent_rwkv7
replaced by the naive op above. Our weights: flax kernels D_in x D_out (torch Linear weight
= kernel^T), lerps D (fla 1 x 1 x D).
"""
from __future__ import annotations

import ast
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
FLA_SRC = os.path.join(CMP_DIR, "fla_src")
OP_ARGS = ("r", "w", "k", "v", "a", "b")
HEAD_DIM = 16  # layer: dim 32, 2 heads
NORM_EPS = 1e-5  # RWKV7Attention's norm_eps default; g_norm eps = head_dim * norm_eps
OP_CHUNK = 32
TDTYPE = {"f32": torch.float32, "f64": torch.float64}


# ----------------------------------------------------------------------------- fla source


class _Torch64:
    """`torch` with torch.float = float64, for the float64 reference."""
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _read(rel):
    with open(os.path.join(FLA_SRC, rel)) as fh:
        return fh.read()


def _f64_source(src):
    return src.replace(".float()", ".double()")


def load_naive(dtype):
    """dplr_recurrence and dplr_chunkwise from fla's dplr/naive.py, verbatim (f64: see the
    module docstring)."""
    src = _read("fla/ops/generalized_delta_rule/dplr/naive.py")
    ns = {"__name__": "fla_dplr_naive"}
    exec(compile(_f64_source(src) if dtype == "f64" else src,
                 "fla/ops/generalized_delta_rule/dplr/naive.py", "exec"), ns)
    if dtype == "f64":
        ns["torch"] = _Torch64()  # read by the functions at call time (torch.float)
    return ns["dplr_recurrence"], ns["dplr_chunkwise"]


def load_def(rel, name, ns_extra=None):
    """One top-level function or class of an fla file, its source verbatim (the files
    import triton; only this definition is executed)."""
    src = _read(rel)
    node = next(n for n in ast.parse(src).body
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    ns = {"torch": torch, "nn": nn, "F": F, "math": math, **(ns_extra or {})}
    exec(compile("from __future__ import annotations\n" + ast.get_source_segment(src, node),
                 f"{rel}:{name}", "exec"), ns)
    return ns[name]


token_shift_ref = load_def("fla/modules/token_shift.py", "token_shift_ref")
torch_addcmul_rwkv7 = load_def("fla/ops/rwkv7/fused_addcmul.py", "torch_addcmul_rwkv7")
k_update_ref = load_def("fla/ops/rwkv7/fused_k_update.py", "k_update_ref")
gate_output_correction_ref = load_def("fla/ops/rwkv7/gate_output_correction.py",
                                      "gate_output_correction_ref")
LoRA = load_def("fla/layers/rwkv6.py", "LoRA")


def t(x, dtype, grad=False):
    return torch.tensor(np.asarray(x), dtype=TDTYPE[dtype], requires_grad=grad)


def npy(x):
    return x.detach().to(torch.float64).numpy()


class default_dtype:
    def __init__(self, dtype):
        self.dtype = TDTYPE[dtype]

    def __enter__(self):
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.old)


# ----------------------------------------------------------------------------- op level


def fla_op(impl, dtype, r, w, k, v, a, b):
    """chunk_rwkv7(r, w, k, v, a, b, scale=1.) through fla's naive DPLR forms; head-first
    tensors in and out (o BxHxLxV), the state as ours (BxHxVxK; fla's is K x V)."""
    recurrent, chunkwise = load_naive(dtype)
    q = r * math.sqrt(r.shape[-1])  # undoes the naive forms' built-in d_k^-0.5 (scale=1.)
    with default_dtype(dtype):
        if impl == "recurrent":
            o, s = recurrent(q, k, v, a, b, w)
        else:
            o, s = chunkwise(q, k, v, a, b, w, chunk_size=OP_CHUNK)
    return o, s.transpose(-1, -2)


def run_op(inp, out, case, impl, dtype, tag=None, control=False):
    p = f"op/{case}/"
    args = [t(inp[p + a], dtype, grad=True) for a in OP_ARGS]
    r, w, k, v, a, b = args
    if control:  # the erase reading the decayed state: S D (I + a b^T), i.e. a -> e^w a
        a = a * torch.exp(w)
    o, s = fla_op(impl, dtype, r, w, k, v, a, b)
    loss = torch.sum(t(inp[p + "w_o"], dtype) * o) + torch.sum(t(inp[p + "w_s"], dtype) * s)
    loss.backward()
    key = f"{p}{tag or impl}/{dtype}/"
    out[key + "o"], out[key + "S"] = npy(o), npy(s)
    for name, x in zip(OP_ARGS, args):
        out[key + "grad_" + name] = npy(x.grad)


# ----------------------------------------------------------------------------- layer

_T = (lambda w: w.T, lambda w: w.T)  # flax kernel D_in x D_out <-> torch weight D_out x D_in
_LERP = (lambda w: w[None, None, :], lambda w: w[0, 0])  # D <-> 1 x 1 x D
_SAME = (lambda w: w, lambda w: w)
# our parameter name -> (fla's name, our array -> fla's layout, and back)
PARAM_MAP = {
    **{f"forward_dir.{x}": (x, _LERP) for x in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")},
    "r_proj.kernel": ("r_proj.weight", _T),
    "k_proj.kernel": ("k_proj.weight", _T),
    "v_proj.kernel": ("v_proj.weight", _T),
    "o_proj.kernel": ("o_proj.weight", _T),
    "k_k": ("k_k", _SAME),
    "k_a": ("k_a", _SAME),
    "r_k": ("r_k", _SAME),
    "forward_dir.w_lora.down.kernel": ("w_lora.lora.0.weight", _T),
    "forward_dir.w_lora.up.kernel": ("w_lora.lora.2.weight", _T),
    "forward_dir.w_lora.up.bias": ("w_lora.lora.2.bias", _SAME),
    "forward_dir.a_lora.down.kernel": ("a_lora.lora.0.weight", _T),
    "forward_dir.a_lora.up.kernel": ("a_lora.lora.2.weight", _T),
    "forward_dir.a_lora.up.bias": ("a_lora.lora.2.bias", _SAME),
    "g_lora.down.kernel": ("g_lora.lora.0.weight", _T),
    "g_lora.up.kernel": ("g_lora.lora.2.weight", _T),
    "norm_scale": ("g_norm.weight", _SAME),
    "norm_bias": ("g_norm.bias", _SAME),
}


def lora(P, name, dtype, activation, bias=True):
    """fla's LoRA (verbatim class) holding the Parameters P[name.lora.*] (the same
    objects, so that their .grad is read back)."""
    w0 = P[f"{name}.lora.0.weight"]
    m = LoRA(w0.shape[1], P[f"{name}.lora.2.weight"].shape[0], w0.shape[0], bias=bias,
             activation=activation).to(TDTYPE[dtype])
    m.lora[0].weight = w0
    m.lora[2].weight = P[f"{name}.lora.2.weight"]
    if bias:
        m.lora[2].bias = P[f"{name}.lora.2.bias"]
    return m


def fla_layer_forward(P, hidden_states, attention_mask, impl, dtype, control=False):
    """fla/layers/rwkv7.py RWKV7Attention.forward (layer_idx 0, fuse_norm False, no
    cache), line by line. control: fused_k_rwkv7's k update left out."""
    batch_size, seq_len, _ = hidden_states.shape
    if attention_mask is not None:
        am = attention_mask.narrow(1, attention_mask.size(1) - seq_len, seq_len).unsqueeze(-1)
        hidden_states = hidden_states.mul(am)
    delta = token_shift_ref(hidden_states)  # token_shift(..., cache=None)
    xr, xw, xk, xv, xa, xg = torch_addcmul_rwkv7(hidden_states, delta, P["x_r"], P["x_w"],
                                                 P["x_k"], P["x_v"], P["x_a"], P["x_g"])
    r = F.linear(xr, P["r_proj.weight"])
    w = -0.6065306597126334 * lora(P, "w_lora", dtype, "tanh")(xw).sigmoid()
    k = F.linear(xk, P["k_proj.weight"])
    v = F.linear(xv, P["v_proj.weight"])
    a = lora(P, "a_lora", dtype, None)(xa).sigmoid()  # layer_idx 0: v_first = v, no v_lora
    g = lora(P, "g_lora", dtype, "sigmoid", bias=False)(xg)
    kk = F.normalize(rearrange(k * P["k_k"], 'b t (h d) -> b t h d', d=HEAD_DIM), dim=-1, p=2.0)
    if not control:
        k = k_update_ref(k, a, P["k_a"])  # fused_k_rwkv7
    if attention_mask is not None:
        v = v * am
    r, w, k, a = map(lambda x: rearrange(x, 'b t (h d) -> b t h d', d=HEAD_DIM), (r, w, k, a))
    v = rearrange(v, 'b t (h d) -> b t h d', d=HEAD_DIM)
    # chunk_rwkv7(r=r, w=w, k=k, v=v, a=-kk, b=kk * a, scale=1.):
    head_first = lambda x: x.transpose(1, 2)  # noqa: E731  B T H D <-> B H T D
    o, _ = fla_op(impl, dtype, *(head_first(x) for x in (r, w, k, v, -kk, kk * a)))
    o = head_first(o)
    g_norm = nn.GroupNorm(num_groups=2, num_channels=2 * HEAD_DIM, eps=HEAD_DIM * NORM_EPS,
                          affine=True).to(TDTYPE[dtype])
    g_norm.weight, g_norm.bias = P["g_norm.weight"], P["g_norm.bias"]
    o = g_norm(rearrange(o, 'b t h d -> (b t) (h d)')).view(batch_size, seq_len, -1)
    o = gate_output_correction_ref(o, r, k, P["r_k"], v, g)
    return F.linear(o, P["o_proj.weight"])


def run_layer(inp, out, case, impl, dtype, tag=None, control=False):
    P = {}
    for ours, (name, (to_fla, _)) in PARAM_MAP.items():
        P[name] = nn.Parameter(t(to_fla(inp["layer/param/" + ours]), dtype))
    missing = {k[len("layer/param/"):] for k in inp if k.startswith("layer/param/")} - set(PARAM_MAP)
    assert not missing, f"our parameters without an fla counterpart: {missing}"
    p = f"layer/{case}/"
    x = t(inp[p + "x"], dtype, grad=True)
    mask = torch.tensor(inp[p + "mask"]) if p + "mask" in inp else None
    y = fla_layer_forward(P, x, None if mask is None else mask.long(), impl, dtype, control)
    real = torch.ones(x.shape[:2], dtype=torch.bool) if mask is None else mask
    y = torch.where(real[..., None], y, torch.zeros((), dtype=y.dtype))
    torch.sum(t(inp[p + "w_y"], dtype) * y).backward()
    key = f"{p}{tag or impl}/{dtype}/"
    out[key + "y"], out[key + "grad_x"] = npy(y), npy(x.grad)
    for ours, (name, (_, back)) in PARAM_MAP.items():
        grad = P[name].grad  # None for k_a in the control (unused there)
        out[key + "grad_param/" + ours] = back(npy(torch.zeros_like(P[name]) if grad is None
                                                   else grad))


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    inp = dict(np.load(os.path.join(CMP_DIR, "rwkv7_inputs.npz")))
    with open(os.path.join(FLA_SRC, "COMMIT")) as fh:
        commit = fh.read().strip()
    out = {}
    cases = sorted({k.split("/")[1] for k in inp if k.startswith("op/")})
    for case in cases:
        length = inp[f"op/{case}/r"].shape[2]
        for dtype in ("f32", "f64"):
            run_op(inp, out, case, "recurrent", dtype)
            if length % OP_CHUNK == 0:
                run_op(inp, out, case, "chunk", dtype)
        run_op(inp, out, case, "recurrent", "f32", tag="control_erase_decayed", control=True)
    layer_cases = sorted({k.split("/")[1] for k in inp if k.startswith("layer/L")})
    for case in layer_cases:
        length = inp[f"layer/{case}/x"].shape[1]
        for dtype in ("f32", "f64"):
            run_layer(inp, out, case, "recurrent", dtype)
            if length % OP_CHUNK == 0:
                run_layer(inp, out, case, "chunk", dtype)
        run_layer(inp, out, case, "recurrent", "f32", tag="control_no_k_update", control=True)
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/fla_commit"] = np.array(commit)
    np.savez(os.path.join(CMP_DIR, "rwkv7_fla.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, "
          f"fla {commit}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
