"""fla's side of the loglinear_mamba2 comparison (compare_loglinear.py): loads
$CMP_DIR/loglinear_inputs.npz (written by loglinear_ours.py), runs flash-linear-attention's
code from the verbatim copies loglinear_setup.sh made in $CMP_DIR/fla_src, and saves
outputs and gradients, converted to our layouts, to $CMP_DIR/loglinear_fla.npz. Run with
the torch venv:

    /tmp/torchvenv/bin/python scripts/fla_comparison/loglinear_fla.py

Op: fla/ops/log_linear_attn/naive.py's naive_log_linear_attn, executed as it is.

Layer: fla/layers/log_linear_mamba2.py executed as it is (LogLinearMamba2, its
hmamba_chunk_scan_combined and hmamba_split_conv1d_scan_combined), with what needs CUDA or
Triton or transformers replaced by plain torch (`_stub_modules`):
  - chunk_log_linear_attn (Triton) -> naive_log_linear_attn on the same arguments (fla's
    own test, tests/ops/test_log_linear_attn.py, checks the two against each other);
  - causal_conv1d_fn (Dao-AILab's CUDA kernel) -> nn.functional.conv1d with groups=C and
    padding W-1, cut to T, then SiLU (what the kernel computes);
  - rmsnorm_fn (Triton) -> fla's own rms_norm_ref from layernorm_gated.py (executed);
  - RMSNormGated and apply_mask_to_padding_states: fla's code, executed;
  - transformers' ACT2FN / logging: SiLU and a silent logger.
The layer is built as fla's LogLinearMamba2Config builds it (use_bias False, use_conv_bias
True, one group, conv 4, expand 2, eps 1e-5, chunk 64), head_dim = our P; our weights are
copied in (in_proj = [z, x, B, C, dt, dl] = our gate, value, key, query, dt, levels), and
its forward is `cuda_kernels_forward` (the eval path: conv, mask, hmamba_chunk_scan_combined,
RMSNormGated, out_proj) and, as a second row, the training path (module.train():
hmamba_split_conv1d_scan_combined under torch.utils.checkpoint).

dtypes: "f32" runs fla's code as it is; "f64" is the float64 reference: the same source
with `.float()` read as `.double()` (A_log.float() in the layer, the upcasts in
rms_norm_ref) and the module in float64; no other change.

Control: the layer (and the op) with every level scale replaced by 1, i.e. Mamba-2
without the levels: must differ from ours.
"""
from __future__ import annotations

import ast
import os
import sys
import time
import types

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
FLA_SRC = os.path.join(CMP_DIR, "fla_src")
OP_GRADS = ("x", "log_a", "b", "c", "lam")
TDTYPE = {"f32": torch.float32, "f64": torch.float64}
LAYER = dict(dim=32, num_heads=2, state_size=32)  # as loglinear_ours.py
PADDED = (77, 50)


def _read(rel):
    with open(os.path.join(FLA_SRC, rel)) as fh:
        return fh.read()


def _function(rel, name, dtype="f32"):
    """One top-level function or class of an fla file, its source verbatim (f64: `.float()`
    read as `.double()`)."""
    src = _read(rel)
    node = next(n for n in ast.parse(src).body
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    text = ast.get_source_segment(src, node)
    return text.replace(".float()", ".double()") if dtype == "f64" else text


def load_naive(unit_levels=False):
    """naive_log_linear_attn from fla/ops/log_linear_attn/naive.py, executed as it is
    (unit_levels: the control, level_scales replaced by ones)."""
    ns = {"__name__": "fla_naive_log_linear"}
    exec(compile(_read("fla/ops/log_linear_attn/naive.py"), "naive.py", "exec"), ns)
    fn = ns["naive_log_linear_attn"]
    if unit_levels:
        return lambda q, k, v, g, level_scales: fn(q, k, v, g, torch.ones_like(level_scales))
    return fn


# ----------------------------------------------------------------------------- fla source


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None):
    """Dao-AILab causal_conv1d_fn in torch: x B x C x T, weight C x W (weight[:, W-1] on
    the current token), bias C; SiLU when activation is 'silu' / 'swish'."""
    assert seq_idx is None and initial_states is None and not return_final_states
    c, taps = weight.shape
    y = F.conv1d(x, weight[:, None, :], bias, padding=taps - 1, groups=c)[..., :x.shape[-1]]
    return F.silu(y) if activation in ("silu", "swish") else y


def _stub_modules(dtype, unit_levels):
    """sys.modules entries for the layer file's imports (module docstring)."""
    naive = load_naive(unit_levels)

    def chunk_log_linear_attn(q, k, v, g, level_scales, initial_state=None,
                              output_final_state=False, cu_seqlens=None):
        assert initial_state is None and cu_seqlens is None
        return naive(q, k, v, g, level_scales), None

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    logger = types.SimpleNamespace(warning_once=lambda *a, **k: None,
                                   warning=lambda *a, **k: None)
    module("transformers")
    module("transformers.activations", ACT2FN={"silu": nn.SiLU(), "swish": nn.SiLU()})
    module("transformers.utils", logging=types.SimpleNamespace(get_logger=lambda n: logger))
    mamba2 = {"torch": torch}
    exec(_function("fla/layers/mamba2.py", "apply_mask_to_padding_states"), mamba2)
    module("fla")
    module("fla.layers")
    module("fla.layers.mamba2", apply_mask_to_padding_states=mamba2["apply_mask_to_padding_states"],
           causal_conv1d_fn=causal_conv1d_fn, causal_conv1d_update=None,
           is_fast_path_available=True)
    module("fla.layers.utils", get_layer_cache=None, update_layer_cache=None)
    norm = {"torch": torch, "nn": nn, "F": F, "rearrange": __import__("einops").rearrange}
    exec(_function("fla/modules/layernorm_gated.py", "rms_norm_ref", dtype), norm)

    def rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
        return norm["rms_norm_ref"](x, weight, bias, z=z, eps=eps, group_size=group_size,
                                    norm_before_gate=norm_before_gate, upcast=True)
    norm["rmsnorm_fn"] = rmsnorm_fn
    exec(_function("fla/modules/layernorm_gated.py", "RMSNormGated"), norm)
    module("fla.modules")
    module("fla.modules.layernorm_gated", RMSNormGated=norm["RMSNormGated"],
           rmsnorm_fn=rmsnorm_fn)
    module("fla.ops")
    module("fla.ops.log_linear_attn")
    module("fla.ops.log_linear_attn.chunk", LogLinearAttentionState=object,
           chunk_log_linear_attn=chunk_log_linear_attn)


def load_layer_module(dtype, unit_levels=False):
    """fla/layers/log_linear_mamba2.py executed with the stubs (f64: `.float()` ->
    `.double()`)."""
    _stub_modules(dtype, unit_levels)
    src = _read("fla/layers/log_linear_mamba2.py")
    if dtype == "f64":
        src = src.replace(".float()", ".double()")
    ns = {"__name__": "fla_log_linear_mamba2"}
    exec(compile(src, "fla/layers/log_linear_mamba2.py", "exec"), ns)
    return ns


# ----------------------------------------------------------------------------- op level


def t(x, dtype, grad=False):
    return torch.tensor(np.asarray(x), dtype=TDTYPE[dtype], requires_grad=grad)


def npy(x):
    return x.detach().to(torch.float64).numpy()


def run_op(inp, out, length, dtype, tag, unit_levels=False):
    """Ours-layout tensors in, fla's layouts for the naive op (q = C, k = B: BxTx1xN; v:
    BxTxHxP; g: BxTxH; level_scales: BxTxHxK), ours-layout y and gradients out."""
    p = f"op/L{length}/"
    x, log_a, b, c, lam = (t(inp[p + a], dtype, grad=True) for a in OP_GRADS)
    fn = load_naive(unit_levels)
    y = fn(c.permute(0, 2, 1, 3), b.permute(0, 2, 1, 3), x.permute(0, 2, 1, 3),
           log_a.permute(0, 2, 1), lam.permute(0, 2, 1, 3))  # BxTxHxP
    y = y.permute(0, 2, 1, 3)
    torch.sum(t(inp[p + "w_o"], dtype) * y).backward()
    key = f"{p}{tag}/{dtype}/"
    out[key + "o"] = npy(y)
    for a, v in zip(OP_GRADS, (x, log_a, b, c, lam)):  # the control reads no lambda
        out[key + "grad_" + a] = npy(v.grad if v.grad is not None else torch.zeros_like(v))


# ----------------------------------------------------------------------------- layer

IN_PROJ = ("gate.kernel", "value.kernel", "key.kernel", "query.kernel", "dt.kernel",
           "levels.kernel")  # in_proj's [z, xBC (x, B, C), dt, dl] rows, in order
DIRECT = {  # ours -> (fla's parameter, ours -> fla, fla -> ours)
    "forward_scan.conv": ("conv1d.weight", lambda w: w.T[:, None, :], lambda w: w[:, 0, :].T),
    "forward_scan.conv_bias": ("conv1d.bias", lambda w: w, lambda w: w),
    "forward_scan.dt_bias": ("dt_bias", lambda w: w, lambda w: w),
    "forward_scan.a_log": ("A_log", lambda w: w, lambda w: w),
    "forward_scan.level_weight": ("L", lambda w: w, lambda w: w),
    "forward_scan.d": ("D", lambda w: w, lambda w: w),
    "norm_scale": ("norm.weight", lambda w: w, lambda w: w),
    "out.kernel": ("out_proj.weight", lambda w: w.T, lambda w: w.T),
}


def build_fla_layer(ns, dtype):
    heads, inner = LAYER["num_heads"], 2 * LAYER["dim"]
    layer = ns["LogLinearMamba2"](
        num_heads=heads, head_dim=inner // heads, hidden_size=LAYER["dim"],
        state_size=LAYER["state_size"], expand=2, n_groups=1, conv_kernel=4,
        use_conv_bias=True, use_bias=False, norm_eps=1e-5, chunk_size=64, backend="cuda")
    return layer.to(TDTYPE[dtype])


def load_weights(layer, inp, dtype):
    params = {k[len("layer/param/"):]: v for k, v in inp.items() if k.startswith("layer/param/")}
    missing = set(params) - set(IN_PROJ) - set(DIRECT)
    assert not missing, f"our parameters without an fla counterpart: {missing}"
    sizes = [params[n].shape[1] for n in IN_PROJ]
    named = dict(layer.named_parameters())
    assert set(named) == {"in_proj.weight"} | {v[0] for v in DIRECT.values()}, sorted(named)
    with torch.no_grad():
        named["in_proj.weight"].copy_(t(np.concatenate([params[n] for n in IN_PROJ], 1).T,
                                        dtype))
        for ours, (name, to_fla, _) in DIRECT.items():
            assert tuple(named[name].shape) == to_fla(params[ours]).shape, name
            named[name].copy_(t(to_fla(params[ours]), dtype))
    return sizes


def run_layer(inp, out, tag, length, dtype, path, key_tag=None, unit_levels=False):
    ns = load_layer_module(dtype, unit_levels)
    layer = build_fla_layer(ns, dtype)
    sizes = load_weights(layer, inp, dtype)
    layer.train(path == "train")
    x = t(inp[f"layer/L{length}/x"], dtype, grad=True)
    w_y = t(inp[f"layer/L{length}/w_y"], dtype)
    mask = None
    if tag.endswith("pad"):
        mask = torch.tensor(inp[f"layer/{tag}/mask"])
        w_y = w_y * mask[..., None]
    y, _, _ = layer.cuda_kernels_forward(x, None, False, mask)
    torch.sum(w_y * y).backward()
    key = f"layer/{tag}/{key_tag or path}/{dtype}/"
    out[key + "y"], out[key + "grad_x"] = npy(y), npy(x.grad)
    named = dict(layer.named_parameters())
    for ours, part in zip(IN_PROJ, torch.split(named["in_proj.weight"].grad, sizes, 0)):
        out[key + "grad_param/" + ours] = npy(part).T
    for ours, (name, _, back) in DIRECT.items():
        grad = named[name].grad  # None: the control's L (no level reads it)
        out[key + "grad_param/" + ours] = back(npy(
            grad if grad is not None else torch.zeros_like(named[name])))
    return sum(p.numel() for p in layer.parameters())


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    inp = dict(np.load(os.path.join(CMP_DIR, "loglinear_inputs.npz")))
    with open(os.path.join(FLA_SRC, "COMMIT")) as fh:
        commit = fh.read().strip()
    out = {}
    op_lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("op/")})
    for length in op_lengths:
        for dtype in ("f32", "f64"):
            run_op(inp, out, length, dtype, "naive")
        run_op(inp, out, length, "f32", "control_unit_levels", unit_levels=True)
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.endswith("/x")})
    for length in lengths:
        for dtype in ("f32", "f64"):
            count = run_layer(inp, out, f"L{length}", length, dtype, "eval")
        run_layer(inp, out, f"L{length}", length, "f32", "train")
        run_layer(inp, out, f"L{length}", length, "f32", "eval", key_tag="control_unit_levels",
                  unit_levels=True)
    for dtype in ("f32", "f64"):
        run_layer(inp, out, f"L{PADDED[0]}pad", PADDED[0], dtype, "eval")
    out["meta/param_count"] = np.array(count)
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/fla_commit"] = np.array(commit)
    np.savez(os.path.join(CMP_DIR, "loglinear_fla.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, "
          f"fla {commit}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
