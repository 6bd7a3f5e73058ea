"""Zoology's side of the based comparison (results/cpu/based_vs_zoology.md): loads
$CMP_DIR/based_inputs.npz (written by based_ours.py), runs Zoology's own `Based` module
class and its `TaylorExp` feature map (zoology/mixers/based.py, feature_maps/taylor.py,
the verbatim copies made by based_setup.sh in $CMP_DIR/based_src, imported as the
`zoology` package) and fla's naive Based op (fla/ops/based/naive.py, executed verbatim),
and saves outputs and gradients, converted to our layouts, to $CMP_DIR/based_zoology.npz.
Run with the torch venv:

    nice -n 10 /tmp/torchvenv/bin/python scripts/fla_comparison/based_zoology.py

Nothing of Zoology's is re-written. Its based.py tries two optional imports inside
try/except: transformers' Llama rotary (used only under apply_rotary=True; off here, as in
the MQAR row; its import fails here even where transformers is installed, since the pandas
stand-in below has no __spec__: the message is printed and saved, nothing uses it) and the
`csrc` causal_dot_product CUDA kernel (absent: causal_dot_product is None, asserted), so
train_view="linear" runs its pure-torch cumsum branch. zoology/utils.py
(import_from_str, imported by based.py) also imports wandb and pandas, which no Based code
uses: empty module stand-ins are put in sys.modules for those two (pandas with a
`DataFrame = object` attribute: a return annotation in utils.py is evaluated at import).

Forms run: train_view "quadratic" (the MQAR row's, models_repo.py add_based: feature_name
taylor_exp, num_heads = num_key_value_heads = 1, train_view quadratic; eps and causal at
their defaults 1e-12 and True) and "linear" (the class default; its cumsum branch), both
causal; "linear" with causal=False (the quadratic view ignores `causal`: its tril is
unconditional). Options besides: d_model 32, feature_dim 16 (or 8), num_heads =
num_key_value_heads = 1 (the MQAR row) or 2 (our zoology scaffold's heads).

The op: Based.forward itself, its proj_q / proj_k / proj_v replaced by modules that return
the given q, k, v (in the BxLx(H F) layout they would produce) and proj_o by nn.Identity.

dtypes: "f32" is the code as it is on float32 tensors and weights; "f64" the same code on a
`.double()` module and float64 inputs (TaylorExp's `torch.ones` is float32 and is promoted
by torch.cat; no source change).

Layouts: ours q, k BxHxLxF, v BxHxLxK (Zoology's projections give BxLx(H F), viewed to
BxHxLxF as ours); fla's naive ops take BxHxLxD as ours. Weights: ours flax kernels
D_in x D_out, torch nn.Linear weight = kernel^T (no permutation: both split heads
head-major).
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
import time
import types

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kda_fla import _T, npy, t  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
SRC = os.path.join(CMP_DIR, "based_src")
OP_GRADS = ("q", "k", "v")
DIM = 32
CONFIGS = {"h1f16": (1, 16), "h2f16": (2, 16), "h2f8": (2, 8)}  # as based_ours.py
# Zoology view: (train_view, causal)
VIEWS = {"quadratic": ("quadratic", True), "linear": ("linear", True),
         "linear_bidir": ("linear", False)}
FLA_CHUNK = {128: 16, 77: 11}  # naive_chunk_based needs L % chunk == 0
# our parameter name -> (Zoology's name, our array -> its layout, and back)
PARAM_MAP = {
    "query.kernel": ("proj_q.weight", _T),
    "key.kernel": ("proj_k.weight", _T),
    "value.kernel": ("proj_v.weight", _T),
    "out.kernel": ("proj_o.weight", _T),
}
TDT = {"f32": torch.float32, "f64": torch.float64}


# ----------------------------------------------------------------------------- sources


def import_zoology():
    """(zoology.mixers.based module, its import messages)."""
    for name in ("wandb", "pandas"):  # zoology/utils.py's unused imports
        sys.modules.setdefault(name, types.ModuleType(name))
    # fetch_wandb_runs' return annotation `pd.DataFrame` is evaluated at import
    sys.modules["pandas"].DataFrame = getattr(sys.modules["pandas"], "DataFrame", object)
    sys.path.insert(0, os.path.join(SRC, "zoology"))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        import zoology.mixers.based as zb
    assert zb.causal_dot_product is None, "the CUDA kernel imported: not the pure-torch path"
    assert os.path.abspath(zb.__file__).startswith(SRC), zb.__file__
    return zb, buf.getvalue().strip().replace("\n", " / ")


def check_mqar_row():
    """models_repo.py's add_based kwargs, as read (not executed: it imports the whole
    config machinery)."""
    with open(os.path.join(SRC, "zoology/zoology/experiments/models_repo.py")) as fh:
        src = fh.read()
    body = src[src.index("def add_based"):src.index("def ", src.index("def add_based") + 4)]
    for needle in ('"feature_dim": ftr_dim', '"feature_name": "taylor_exp"',
                   '"num_key_value_heads": 1', '"num_heads": 1',
                   '"train_view": "quadratic"', "16,"):
        assert needle in body, f"models_repo.py add_based changed: {needle!r} not found"
    assert "eps" not in body and "causal" not in body  # the defaults: 1e-12, True


def load_fla_naive():
    ns = {"__name__": "fla_naive_based"}
    path = os.path.join(SRC, "fla/fla/ops/based/naive.py")
    with open(path) as fh:
        exec(compile(fh.read(), "fla/ops/based/naive.py", "exec"), ns)
    return ns["naive_parallel_based"], ns["naive_chunk_based"]


class Given(nn.Module):
    """A projection that returns a given tensor (the op-level stand-in)."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x):
        return self.value


def to_bxlxhf(x_BxHxLxF):
    b, h, l, f = x_BxHxLxF.shape
    return x_BxHxLxF.transpose(1, 2).reshape(b, l, h * f)


def to_bxhxlxk(y_BxLxHK, heads):
    b, l, hk = y_BxLxHK.shape
    return y_BxLxHK.reshape(b, l, heads, hk // heads).transpose(1, 2)


# ----------------------------------------------------------------------------- runs


def run_feature_map(zb, inp, out):
    for d in sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("fm/")}):
        p = f"fm/d{d}/"
        # the kwargs Based.__init__ passes to init_feature_map
        fmap = zb.init_feature_map(feature_map="taylor_exp", input_dim=d, head_dim_idx=-1,
                                   temp=1., eps=1e-12)
        for tag, dtype, flip in (("zoology", "f32", False), ("zoology", "f64", False),
                                 ("control_reversed", "f32", True)):
            x = t(inp[p + "x"], dtype, grad=True)
            phi = fmap(x.flip(-1) if flip else x)
            torch.sum(t(inp[p + "w"], dtype) * phi).backward()
            out[f"{p}{tag}/{dtype}/phi"], out[f"{p}{tag}/{dtype}/grad_x"] = npy(phi), npy(x.grad)


def run_op(zb, inp, out, length, view, dtype, tag=None):
    p = f"op/L{length}/"
    q, k, v = (t(inp[p + a], dtype, grad=True) for a in OP_GRADS)
    b, h, _, f = q.shape
    train_view, causal = VIEWS[view]
    m = zb.Based(d_model=h * v.shape[-1], l_max=length, feature_dim=f, num_key_value_heads=h,
                 num_heads=h, feature_name="taylor_exp", train_view=train_view, causal=causal)
    m.proj_q, m.proj_k, m.proj_v = Given(to_bxlxhf(q)), Given(to_bxlxhf(k)), Given(to_bxlxhf(v))
    m.proj_o = nn.Identity()
    hidden = torch.zeros(b, length, h * v.shape[-1], dtype=TDT[dtype])  # size and dtype only
    o = to_bxhxlxk(m(hidden), h)
    torch.sum(t(inp[p + "w_o"], dtype) * o).backward()
    key = f"{p}{tag or 'zoology_' + view}/{dtype}/"
    out[key + "o"] = npy(o)
    for a, x in zip(OP_GRADS, (q, k, v)):
        out[key + "grad_" + a] = npy(x.grad)


def run_op_fla(inp, out, length, form, dtype):
    parallel, chunk = load_fla_naive()
    p = f"op/L{length}/"
    q, k, v = (t(inp[p + a], dtype, grad=True) for a in OP_GRADS)
    if form == "parallel":
        o = parallel(q, k, v)  # scale q.shape[-1]^-0.5, use_norm: / (z + 1e-6)
    else:
        o = chunk(q, k, v, chunk_size=FLA_CHUNK[length])
    torch.sum(t(inp[p + "w_o"], dtype) * o).backward()
    key = f"{p}fla_{form}/{dtype}/"
    out[key + "o"] = npy(o)
    for a, x in zip(OP_GRADS, (q, k, v)):
        out[key + "grad_" + a] = npy(x.grad)


def run_layer(zb, inp, out, config, view, length, dtype, tag=None, swap_qk=False):
    heads, feature_dim = CONFIGS[config]
    train_view, causal = VIEWS[view]
    m = zb.Based(d_model=DIM, l_max=length, feature_dim=feature_dim, num_key_value_heads=heads,
                 num_heads=heads, feature_name="taylor_exp", train_view=train_view,
                 causal=causal)
    pfx = f"layer/{config}/param/"
    ours = {k[len(pfx):] for k in inp if k.startswith(pfx)}
    assert ours == set(PARAM_MAP), f"parameters not mapped both ways: {ours ^ set(PARAM_MAP)}"
    theirs = {n for n, _ in m.named_parameters()}
    assert theirs == {v[0] for v in PARAM_MAP.values()}, theirs
    if dtype == "f64":
        m = m.double()
    params = dict(m.named_parameters())
    with torch.no_grad():
        for name, (zname, (to_z, _)) in PARAM_MAP.items():
            if swap_qk and name in ("query.kernel", "key.kernel"):  # the control
                name = "key.kernel" if name == "query.kernel" else "query.kernel"
            w = torch.tensor(to_z(inp[pfx + name]), dtype=TDT[dtype])
            assert params[zname].shape == w.shape, (zname, params[zname].shape, w.shape)
            params[zname].copy_(w)
    x = t(inp[f"layer/L{length}/x"], dtype, grad=True)
    y = m(x)
    torch.sum(t(inp[f"layer/L{length}/w_y"], dtype) * y).backward()
    key = f"layer/{config}/{tag or view}/L{length}/{dtype}/"
    out[key + "y"], out[key + "grad_x"] = npy(y), npy(x.grad)
    for name, (zname, (_, back)) in PARAM_MAP.items():
        out[key + "grad_param/" + name] = back(npy(params[zname].grad))


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    zb, messages = import_zoology()
    check_mqar_row()
    inp = dict(np.load(os.path.join(CMP_DIR, "based_inputs.npz")))
    with open(os.path.join(SRC, "COMMIT")) as fh:
        commit = fh.read().strip()
    with open(os.path.join(SRC, "FLA_COMMIT")) as fh:
        fla_commit = fh.read().strip()
    out = {}
    run_feature_map(zb, inp, out)
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("op/")})
    for length in lengths:
        for dtype in ("f32", "f64"):
            for view in VIEWS:
                run_op(zb, inp, out, length, view, dtype)
            for form in ("parallel", "chunk"):
                run_op_fla(inp, out, length, form, dtype)
    lengths = sorted({int(k.split("/")[1][1:]) for k in inp if k.startswith("layer/L")})
    for config in CONFIGS:
        for length in lengths:
            for view in VIEWS:
                for dtype in ("f32", "f64"):
                    run_layer(zb, inp, out, config, view, length, dtype)
            # Control: proj_q and proj_k given each other's weights.
            run_layer(zb, inp, out, config, "quadratic", length, "f32", tag="control_swap_qk",
                      swap_qk=True)
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/zoology_commit"] = np.array(commit)
    out["meta/fla_commit"] = np.array(fla_commit)
    out["meta/import_messages"] = np.array(messages)
    np.savez(os.path.join(CMP_DIR, "based_zoology.npz"), **out)
    print(f"zoology's import messages: {messages}")
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, "
          f"zoology {commit}, fla {fla_commit}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
