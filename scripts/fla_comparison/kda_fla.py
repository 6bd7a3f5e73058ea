"""fla's side of the kda comparison (README.md): loads $CMP_DIR/kda_inputs.npz (written by
kda_ours.py), runs flash-linear-attention's naive KDA ops (verbatim copies made by
setup.sh in $CMP_DIR/fla_src) and a plain-torch re-write of fla's KimiDeltaAttention
forward, and saves outputs and gradients, converted to our layouts, to
$CMP_DIR/kda_fla.npz. Run with the torch venv:

    /tmp/torchvenv/bin/python scripts/fla_comparison/kda_fla.py

dtypes: "f32" runs fla's code as it is (its naive ops cast everything to torch.float,
i.e. float32). "f64" is a float64 reference: the same verbatim source executed with
`torch.float` resolved to float64 (a stand-in `torch` module in the functions' globals)
and, in naive_kda_gate, `.float()` read as `.double()`; no other change.

fla layouts: q/k BxTxHxK, v BxTxHxV, g BxTxHxK, beta BxTxH, state BxHxKxV; ours q/k/v
BxHxLxF, beta BxHxL, state BxHxVxK (fla's transposed). Layer weights: ours flax kernels
D_in x D_out (torch Linear weight = kernel^T), our conv W x C (fla's Conv1d weight
C x 1 x W, weight[c, 0, W-1] on the current token, as ours w[W-1, c]).
"""
from __future__ import annotations

import ast
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
FLA_SRC = os.path.join(CMP_DIR, "fla_src")
OP_GRADS = ("q", "k", "v", "beta", "f", "A_log", "dt_bias")
L2_EPS = 1e-6  # fla.modules.l2norm default
NORM_EPS = 1e-5  # KimiDeltaAttention's norm_eps default -> FusedRMSNormGated eps
HEAD_DIM = 16  # layer: dim 32, 2 heads, expand_v 1 -> head_k_dim = head_v_dim = 16


# ----------------------------------------------------------------------------- fla source


class _Torch64:
    """`torch` with torch.float = float64, for the float64 reference."""
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _read(rel):
    with open(os.path.join(FLA_SRC, rel)) as fh:
        return fh.read()


def load_naive(dtype):
    """naive_recurrent_kda and naive_chunk_kda from fla/ops/kda/naive.py, verbatim."""
    ns = {"__name__": "fla_naive_kda"}
    exec(compile(_read("fla/ops/kda/naive.py"), "fla/ops/kda/naive.py", "exec"), ns)
    if dtype == "f64":
        ns["torch"] = _Torch64()  # the functions read `torch` from these globals at call time
    return ns["naive_recurrent_kda"], ns["naive_chunk_kda"]


def load_gate(dtype):
    """naive_kda_gate from fla/ops/kda/gate.py, its source verbatim (the module itself
    imports triton, so only this function's text is executed)."""
    src = _read("fla/ops/kda/gate.py")
    node = next(n for n in ast.parse(src).body
                if isinstance(n, ast.FunctionDef) and n.name == "naive_kda_gate")
    fn_src = ast.get_source_segment(src, node)
    if dtype == "f64":
        fn_src = fn_src.replace(".float()", ".double()")
    ns = {"torch": torch, "F": F}
    exec(compile(fn_src, "fla/ops/kda/gate.py:naive_kda_gate", "exec"), ns)
    out_dtype = torch.float64 if dtype == "f64" else torch.float32
    return lambda g, a_log, dt_bias: ns["naive_kda_gate"](g, a_log, dt_bias, output_dtype=out_dtype)


TDTYPE = {"f32": torch.float32, "f64": torch.float64}


def t(x, dtype, grad=False):
    return torch.tensor(np.asarray(x), dtype=TDTYPE[dtype], requires_grad=grad)


def npy(x):
    return x.detach().to(torch.float64).numpy()


# ----------------------------------------------------------------------------- op level


def op_forward(impl, dtype, q, k, v, beta, f, a_log, dt_bias, g_transform=None):
    """Ours-layout tensors in, fla's naive op in between, ours-layout (o, S) out."""
    recurrent, chunk = load_naive(dtype)
    gate = load_gate(dtype)
    g = gate(f, a_log, dt_bias)  # BxTxHxK
    if g_transform is not None:
        g = g_transform(g)
    to_fla = lambda x: x.transpose(1, 2)  # noqa: E731  BxHxLx... <-> BxLxH...
    fn = recurrent if impl == "recurrent" else chunk
    kwargs = {} if impl == "recurrent" else {"chunk_size": 64}
    o, s = fn(to_fla(q), to_fla(k), to_fla(v), g, to_fla(beta), output_final_state=True,
              **kwargs)
    return to_fla(o), s.transpose(-1, -2)


def run_op(inp, out, case, impl, dtype, tag=None, g_transform=None):
    p = f"op/{case}/"
    args = [t(inp[p + a], dtype, grad=True) for a in OP_GRADS]
    w_o, w_s = t(inp[p + "w_o"], dtype), t(inp[p + "w_s"], dtype)
    o, s = op_forward(impl, dtype, *args, g_transform=g_transform)
    (torch.sum(w_o * o) + torch.sum(w_s * s)).backward()
    key = f"{p}{tag or impl}/{dtype}/"
    out[key + "o"], out[key + "S"] = npy(o), npy(s)
    for a, x in zip(OP_GRADS, args):
        out[key + "grad_" + a] = npy(x.grad)


def run_gate(inp, out, case, dtype):
    p = f"op/{case}/"
    f, a_log, dt_bias = (t(inp[p + a], dtype, grad=True) for a in ("f", "A_log", "dt_bias"))
    g = load_gate(dtype)(f, a_log, dt_bias)
    torch.sum(t(inp[p + "w_g"], dtype) * g).backward()
    key = f"{p}gate/{dtype}/"
    out[key + "g"] = npy(g)
    for a, x in (("f", f), ("A_log", a_log), ("dt_bias", dt_bias)):
        out[key + "grad_" + a] = npy(x.grad)


# ----------------------------------------------------------------------------- layer

# our parameter name -> (fla's name, our array -> fla's tensor layout, and back)
_T = (lambda w: w.T, lambda w: w.T)  # flax kernel D_in x D_out <-> torch weight D_out x D_in
_CONV = (lambda w: w.T[:, None, :], lambda w: w[:, 0, :].T)  # W x C <-> C x 1 x W
_SAME = (lambda w: w, lambda w: w)
PARAM_MAP = {
    "query.kernel": ("q_proj.weight", _T),
    "key.kernel": ("k_proj.weight", _T),
    "value.kernel": ("v_proj.weight", _T),
    "out.kernel": ("o_proj.weight", _T),
    "forward_scan.conv_q": ("q_conv1d.weight", _CONV),
    "forward_scan.conv_k": ("k_conv1d.weight", _CONV),
    "forward_scan.conv_v": ("v_conv1d.weight", _CONV),
    "forward_scan.beta.kernel": ("b_proj.weight", _T),
    "forward_scan.decay_down.kernel": ("f_proj.0.weight", _T),
    "forward_scan.decay_up.kernel": ("f_proj.1.weight", _T),
    "forward_scan.a_log": ("A_log", _SAME),
    "forward_scan.dt_bias": ("dt_bias", _SAME),
    "norm_scale": ("o_norm.weight", _SAME),
    "gate_down.kernel": ("g_proj.0.weight", _T),
    "gate_up.kernel": ("g_proj.1.weight", _T),
    "gate_up.bias": ("g_proj.1.bias", _SAME),
}


def short_conv(x_BxTxC, weight_Cx1xW, reverse_taps=False):
    """fla's ShortConvolution (activation 'silu', no bias, no cache): nn.Conv1d with
    groups=C and padding=W-1, the first T outputs, then SiLU."""
    w = weight_Cx1xW.flip(-1) if reverse_taps else weight_Cx1xW
    c, taps = w.shape[0], w.shape[-1]
    y = F.conv1d(x_BxTxC.transpose(1, 2), w, padding=taps - 1, groups=c)[..., :x_BxTxC.shape[1]]
    return F.silu(y).transpose(1, 2)


def l2norm(x):
    """fla.modules.l2norm.l2norm_fwd: x / sqrt(sum x^2 + eps) over the last axis."""
    return x / torch.sqrt(torch.sum(x * x, -1, keepdim=True) + L2_EPS)


def rms_norm_gated_sigmoid(x, g, weight, eps):
    """fla's FusedRMSNormGated(activation='sigmoid') forward (layer_norm_gated_fwd_kernel,
    IS_RMS_NORM): x * rsqrt(mean x^2 + eps) * weight * sigmoid(g), over the last axis."""
    rstd = 1 / torch.sqrt(torch.mean(x * x, -1, keepdim=True) + eps)
    return x * rstd * weight * torch.sigmoid(g)


def fla_layer_forward(P, x, impl, dtype, reverse_taps=False):
    """fla/layers/kda.py KimiDeltaAttention.forward, training path without padding or cache
    (attention_mask None, use_cache False), line by line with chunk_kda replaced by its
    definition: use_qk_l2norm_in_kernel (l2norm on q, k), use_gate_in_kernel
    (naive_kda_gate on f_proj(x)), use_beta_sigmoid_in_kernel (sigmoid on b_proj(x)),
    allow_neg_eigval False, scale None (d_k^-0.5), then the naive op."""
    recurrent, chunk = load_naive(dtype)
    gate = load_gate(dtype)
    q = short_conv(F.linear(x, P["q_proj.weight"]), P["q_conv1d.weight"], reverse_taps)
    k = short_conv(F.linear(x, P["k_proj.weight"]), P["k_conv1d.weight"], reverse_taps)
    v = short_conv(F.linear(x, P["v_proj.weight"]), P["v_conv1d.weight"], reverse_taps)
    g = F.linear(F.linear(x, P["f_proj.0.weight"]), P["f_proj.1.weight"])
    beta = F.linear(x, P["b_proj.weight"])
    q, k = (rearrange(y, "... (h d) -> ... h d", d=HEAD_DIM) for y in (q, k))
    g = rearrange(g, "... (h d) -> ... h d", d=HEAD_DIM)
    v = rearrange(v, "... (h d) -> ... h d", d=HEAD_DIM)
    # inside chunk_kda / fused_recurrent_kda:
    q, k = l2norm(q), l2norm(k)
    g = gate(g, P["A_log"], P["dt_bias"])
    beta = torch.sigmoid(beta)
    if impl == "recurrent":
        o, _ = recurrent(q, k, v, g, beta)
    else:
        o, _ = chunk(q, k, v, g, beta, chunk_size=64)
    gp = F.linear(F.linear(x, P["g_proj.0.weight"]), P["g_proj.1.weight"], P["g_proj.1.bias"])
    o = rms_norm_gated_sigmoid(o, rearrange(gp, "... (h d) -> ... h d", d=HEAD_DIM),
                               P["o_norm.weight"], NORM_EPS)
    o = rearrange(o, "b t h d -> b t (h d)")
    return F.linear(o, P["o_proj.weight"])


def mapped_layer(inp, out, pmap, prefix, length, key, dtype, forward, known=None):
    """y = forward(P, x) on our drawn weights inp[prefix + ours] mapped to fla's (pmap: ours
    -> (fla name, (to_fla, back))), x = inp["layer/L<length>/x"]; saves y, dL/dx and every
    dL/d(our parameter), mapped back, under `key`, for L = sum(w_y * y). Every drawn
    parameter must have a counterpart in `known` (default: pmap's keys)."""
    P = {name: t(to_fla(inp[prefix + ours]), dtype, grad=True)
         for ours, (name, (to_fla, _)) in pmap.items()}
    missing = {k[len(prefix):] for k in inp if k.startswith(prefix)} - set(known or pmap)
    assert not missing, f"our parameters without an fla counterpart: {missing}"
    x = t(inp[f"layer/L{length}/x"], dtype, grad=True)
    y = forward(P, x)
    torch.sum(t(inp[f"layer/L{length}/w_y"], dtype) * y).backward()
    out[key + "y"], out[key + "grad_x"] = npy(y), npy(x.grad)
    for ours, (name, (_, back)) in pmap.items():
        out[key + "grad_param/" + ours] = back(npy(P[name].grad))


def run_layer(inp, out, length, impl, dtype, tag=None, reverse_taps=False):
    mapped_layer(inp, out, PARAM_MAP, "layer/param/", length,
                 f"layer/L{length}/{tag or impl}/{dtype}/", dtype,
                 lambda P, x: fla_layer_forward(P, x, impl, dtype, reverse_taps))


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    inp = dict(np.load(os.path.join(CMP_DIR, "kda_inputs.npz")))
    with open(os.path.join(FLA_SRC, "COMMIT")) as fh:
        commit = fh.read().strip()
    out = {}
    cases = sorted({k.split("/")[1] for k in inp if k.startswith("op/")})
    for case in cases:
        length = inp[f"op/{case}/q"].shape[2]
        for dtype in ("f32", "f64"):
            run_gate(inp, out, case, dtype)
            run_op(inp, out, case, "recurrent", dtype)
            if length % 64 == 0:  # naive_chunk_kda asserts T % chunk_size == 0
                run_op(inp, out, case, "chunk", dtype)
        # Control: the per-channel decay replaced by its mean over K (a scalar per head).
        run_op(inp, out, case, "recurrent", "f32", tag="control_gmean",
               g_transform=lambda g: g.mean(-1, keepdim=True).expand_as(g))
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("layer/L")})
    for length in lengths:
        for dtype in ("f32", "f64"):
            run_layer(inp, out, length, "recurrent", dtype)
            if length % 64 == 0:
                run_layer(inp, out, length, "chunk", dtype)
        # Control: fla's convolution taps reversed (w[0] on the current token).
        run_layer(inp, out, length, "recurrent", "f32", tag="control_taps_reversed",
                  reverse_taps=True)
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/fla_commit"] = np.array(commit)
    np.savez(os.path.join(CMP_DIR, "kda_fla.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, "
          f"fla {commit}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
