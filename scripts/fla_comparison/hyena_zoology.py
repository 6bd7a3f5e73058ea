"""Zoology's side of the hyena comparison (compare_hyena.py): loads
$CMP_DIR/hyena_inputs.npz (written by hyena_ours.py), runs Zoology's code from the verbatim
copy hyena_setup.sh made ($CMP_DIR/hyena_src/zoology/mixers/hyena.py, executed as it is:
torch, einops, pydantic; it has no CUDA / Triton import, and its only long convolution is
the plain-torch `fftconv_ref`) and saves outputs and gradients, in our layouts and under
our parameter names, to $CMP_DIR/hyena_zoology.npz. Run with the torch venv:

    /tmp/torchvenv/bin/python scripts/fla_comparison/hyena_zoology.py

What runs (nothing re-written):
  - buffers: a fresh `Hyena(d_model=32, l_max=128)`'s filter_fn.pos_emb.z (its init),
    .pos_emb.t and .modulation.deltas;
  - filter: `Hyena.filter_fn.filter(L)` (Filter.filter: pos_emb(L) -> implicit_filter ->
    ExponentialModulation) with our weights copied in, [0] of its 1 x L x D;
  - conv: `fftconv_ref(u, k, D=bias, dropout_mask=None, gelu=False)` (what Filter.forward
    calls) on u B x D x L, k D x L;
  - layer: `Hyena(d_model=32, l_max=128)` with the defaults (filter_order 64,
    short_filter_order 3, num_heads 1, num_blocks 1: Zoology's MQAR row "hyena",
    models_repo.py add_hyena), every weight copied in, `forward(x)`; Zoology's buffers
    (t, deltas) are its own. For our short_filter_order=0: Zoology's Hyena cannot run with
    0 (Conv1d kernel_size 0, padding -1: "negative padding is not supported"), so it is
    Hyena(short_filter_order=1) with that 1-tap depthwise conv set to weight 1, bias 0 (the
    identity), still Zoology's forward.
dtypes: "f32" is the module built and run in float32; "f64" the same source with
torch's default dtype float64 while building (so t, z's init and deltas are computed in
float64 as well), inputs and weights in float64.

Controls (must differ from ours): conv with k one tap late; filter with the decay window
off (filter_fn.modulate = False); the layer with the short convolution's taps reversed.
"""
from __future__ import annotations

import importlib.util
import os
import time
import warnings

import numpy as np
import torch

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
SRC = os.path.join(CMP_DIR, "hyena_src")
TDTYPE = {"f32": torch.float32, "f64": torch.float64}
DIM, MAX_LEN = 32, 128  # as hyena_ours.py

T = lambda a: a.T  # noqa: E731
# our parameter name -> (Zoology's parameter, ours -> Zoology's layout, Zoology's -> ours)
MAPPING = {
    "in_proj.kernel": ("in_proj.weight", T, T),
    "in_proj.bias": ("in_proj.bias", None, None),
    "out_proj.kernel": ("out_proj.weight", T, T),
    "out_proj.bias": ("out_proj.bias", None, None),
    "short_w": ("short_filter.weight", lambda a: a[:, None, :], lambda a: a[:, 0, :]),
    "short_b": ("short_filter.bias", None, None),
    "z": ("filter_fn.pos_emb.z", lambda a: a[None], lambda a: a[0]),
    "filter_in.kernel": ("filter_fn.implicit_filter.0.weight", T, T),
    "filter_in.bias": ("filter_fn.implicit_filter.0.bias", None, None),
    "freq": ("filter_fn.implicit_filter.1.freq", lambda a: a[None], lambda a: a[0]),
    "filter_hidden.0.kernel": ("filter_fn.implicit_filter.2.weight", T, T),
    "filter_hidden.0.bias": ("filter_fn.implicit_filter.2.bias", None, None),
    "filter_hidden.1.kernel": ("filter_fn.implicit_filter.4.weight", T, T),
    "filter_hidden.1.bias": ("filter_fn.implicit_filter.4.bias", None, None),
    "filter_out.kernel": ("filter_fn.implicit_filter.6.weight", T, T),
    "bias": ("filter_fn.bias", None, None),
}


def load_zoology():
    """zoology/mixers/hyena.py executed as it is (a module of its own)."""
    path = os.path.join(SRC, "zoology", "mixers", "hyena.py")
    spec = importlib.util.spec_from_file_location("zoology_mixers_hyena", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ZH = load_zoology()


def build(dt, short_filter_order=3):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(TDTYPE[dt])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Conv1d's zero-element init warning: none here
            m = ZH.Hyena(d_model=DIM, l_max=MAX_LEN, short_filter_order=short_filter_order)
    finally:
        torch.set_default_dtype(prev)
    return m.to(TDTYPE[dt])


def copy_in(m, inp, dt, names):
    params = dict(m.named_parameters())
    with torch.no_grad():
        for name in names:
            zname, to_z, _ = MAPPING[name]
            a = inp["layer/param/" + name].astype(np.float64)
            a = to_z(a) if to_z else a
            assert params[zname].shape == a.shape, (name, params[zname].shape, a.shape)
            params[zname].copy_(torch.from_numpy(np.ascontiguousarray(a)).to(TDTYPE[dt]))


def grads_out(m, out, prefix, names):
    params = dict(m.named_parameters())
    for name in names:
        zname, _, from_z = MAPPING[name]
        g = params[zname].grad
        g = np.zeros(params[zname].shape) if g is None else g.detach().double().numpy()
        out[prefix + "grad_param/" + name] = from_z(g) if from_z else g


def t(a, dt, grad=False):
    x = torch.from_numpy(np.asarray(a)).to(TDTYPE[dt])
    return x.requires_grad_(grad)


def npy(x):
    return x.detach().double().numpy()


def run_buffers(out):
    for dt in TDTYPE:
        m = build(dt)
        p = f"buffers/{dt}/"
        out[p + "z_init"] = npy(m.filter_fn.pos_emb.z)[0]
        out[p + "t"] = npy(m.filter_fn.pos_emb.t)[0, :, 0]
        out[p + "deltas"] = npy(m.filter_fn.modulation.deltas)[0, 0]
        assert "filter_fn.pos_emb.t" in dict(m.named_buffers())
        assert "filter_fn.modulation.deltas" in dict(m.named_buffers())


FILTER_NAMES = [n for n in MAPPING if n.split(".")[0] in
                ("z", "freq", "filter_in", "filter_hidden", "filter_out")]


def run_filter(inp, out, lengths):
    for length in lengths:
        for key, modulate in (("", True), ("control_nodecay/", False)):
            for dt in (("f32", "f64") if modulate else ("f32",)):
                m = build(dt)
                copy_in(m, inp, dt, FILTER_NAMES)
                m.filter_fn.modulate = modulate
                h = m.filter_fn.filter(length)[0]  # L x D
                (t(inp[f"filter/L{length}/w_h"], dt) * h).sum().backward()
                p = f"filter/L{length}/{key}{dt}/"
                out[p + "h"] = npy(h)
                grads_out(m, out, p, FILTER_NAMES)


def run_conv(inp, out, lengths):
    for length in lengths:
        src = f"conv/L{length}/"
        for key in ("", "control_late/"):
            for dt in (("f32", "f64") if not key else ("f32",)):
                u = t(inp[src + "u"], dt, True)
                k = t(inp[src + "k"], dt, True)
                bias = t(inp[src + "bias"], dt, True)
                kk = k if not key else torch.nn.functional.pad(k, (1, 0))[:, :length]
                o = ZH.fftconv_ref(u.transpose(1, 2), kk, bias, dropout_mask=None,
                                   gelu=False).transpose(1, 2)
                (t(inp[src + "w_o"], dt) * o).sum().backward()
                p = f"{src}{key}{dt}/"
                out[p + "o"] = npy(o)
                for name, a in (("u", u), ("k", k), ("bias", bias)):
                    out[p + "grad_" + name] = npy(a.grad)


def run_layer(inp, out, lengths):
    names3 = list(MAPPING)
    names0 = [n for n in MAPPING if not n.startswith("short_")]
    cases = [("sfo3", "f32", 3), ("sfo3", "f64", 3), ("sfo0", "f32", 0), ("sfo0", "f64", 0),
             ("control_reversed_taps", "f32", 3)]
    for length in lengths:
        for key, dt, sfo in cases:
            m = build(dt, short_filter_order=max(sfo, 1))
            copy_in(m, inp, dt, names3 if sfo else names0)
            with torch.no_grad():
                if sfo == 0:  # the identity 1-tap conv (module docstring)
                    m.short_filter.weight.fill_(1.0)
                    m.short_filter.bias.zero_()
                if key.startswith("control"):
                    m.short_filter.weight.copy_(m.short_filter.weight.flip(-1))
            x = t(inp[f"layer/L{length}/x"], dt, True)
            y = m(x)
            (t(inp[f"layer/L{length}/w_y"], dt) * y).sum().backward()
            p = f"layer/{key}/L{length}/{dt}/"
            out[p + "y"] = npy(y)
            out[p + "grad_x"] = npy(x.grad)
            grads_out(m, out, p, names3 if sfo else names0)


def main():
    t0 = time.time()
    inp = dict(np.load(os.path.join(CMP_DIR, "hyena_inputs.npz")))
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("layer/L")})
    out = {}
    run_buffers(out)
    run_filter(inp, out, lengths)
    run_conv(inp, out, lengths)
    run_layer(inp, out, lengths)
    with open(os.path.join(SRC, "COMMIT")) as fh:
        out["meta/zoology_commit"] = np.array(fh.read().strip())
    out["meta/torch_version"] = np.array(torch.__version__)
    np.savez(os.path.join(CMP_DIR, "hyena_zoology.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR}/hyena_zoology.npz (zoology "
          f"{out['meta/zoology_commit']}, torch {torch.__version__}, "
          f"{time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
