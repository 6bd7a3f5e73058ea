"""DIAGNOSTIC: where fla's naive_chunk_kda, float32, turns the layer's gradient into NaN
at L=128 (the rows marked NaN in compare_kda.py's table). Torch venv:

    /tmp/torchvenv/bin/python scripts/fla_comparison/diag_fla_chunk_nan.py

Prints the largest |sum of g| over a 64-token chunk (exp of more than ln(FLT_MAX) = 88.7
overflows in float32), whether the forward is finite, and the naive.py line that
torch.autograd.detect_anomaly blames.
"""
import io
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kda_fla as m  # noqa: E402

inp = dict(np.load(os.path.join(m.CMP_DIR, "kda_inputs.npz")))
for length in (77, 128):
    P = {name: m.t(to(inp["layer/param/" + o]), "f64") for o, (name, (to, _)) in m.PARAM_MAP.items()}
    x = m.t(inp[f"layer/L{length}/x"], "f64")
    f = rearrange(F.linear(F.linear(x, P["f_proj.0.weight"]), P["f_proj.1.weight"]),
                  "... (h d) -> ... h d", d=m.HEAD_DIM)
    g = m.load_gate("f64")(f, P["A_log"], P["dt_bias"])
    cum = rearrange(g[:, :64 * (length // 64) or length], "b (n c) h k -> b n c h k",
                    c=min(64, length)).cumsum(2)
    print(f"L={length}: g in [{g.min().item():.2f}, {g.max().item():.2e}], "
          f"max |cumsum of g within a 64-chunk| = {cum.abs().max().item():.1f}")

P = {name: m.t(to(inp["layer/param/" + o]), "f32", grad=True) for o, (name, (to, _)) in m.PARAM_MAP.items()}
x = m.t(inp["layer/L128/x"], "f32", grad=True)
log = io.StringIO()
with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly():
    warnings.simplefilter("always")
    y = m.fla_layer_forward(P, x, "chunk", "f32")
    print("L=128 float32 naive_chunk_kda layer: forward finite:", bool(torch.isfinite(y).all()))
    try:
        torch.sum(m.t(inp["layer/L128/w_y"], "f32") * y).backward()
        print("backward finite:", bool(torch.isfinite(x.grad).all()))
    except RuntimeError as e:
        print("backward:", str(e).splitlines()[0])
for w in caught:
    for line in str(w.message).splitlines():
        if "naive.py" in line:
            print("forward op blamed:", line.strip())
src = open(os.path.join(m.FLA_SRC, "fla/ops/kda/naive.py")).read().splitlines()
print("naive.py:130:", src[129].strip())
print("naive.py:158:", src[157].strip())
