"""OpenNLPLab/cosFormer's CosformerAttention on the comparison's inputs (torch venv): the
verbatim cosformer.py that setup.sh copied to $CMP_DIR/src, imported as it is; our weights
copied in (nn.Linear's weight is our kernel transposed; q_proj/k_proj/v_proj/out_proj are
our query/key/value/out); inputs (B, L, E) transposed to its (L, B, E). Forward and the
gradients of sum(w y) for x and every parameter, to $CMP_DIR/original.npz: in float64
(torch's default dtype float64 too: the module computes its position index pi/2 i in the
default dtype), float64 as a float64 user gets it (index in float32, then cast), and
float32. Needs ours.py to have written inputs.npz.

    /tmp/torchenv/bin/python scripts/cosformer_comparison/original.py
"""
import os
import sys

import numpy as np
import torch

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/cosformer_cmp")
sys.path.insert(0, os.path.join(CMP_DIR, "src"))
from cosformer import CosformerAttention  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cases import CASES, DIM, HEADS, PARAMS  # noqa: E402

TORCH_NAMES = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}


def run(data: dict, case: str, causal: bool, dtype) -> dict:
    model = CosformerAttention(embed_dim=DIM, num_heads=HEADS, causal=causal).to(dtype)
    with torch.no_grad():
        for p in PARAMS:
            layer = getattr(model, TORCH_NAMES[p])
            layer.weight.copy_(torch.tensor(data[f"{case}/{p}/kernel"].T, dtype=dtype))
            layer.bias.copy_(torch.tensor(data[f"{case}/{p}/bias"], dtype=dtype))
    x = torch.tensor(data[f"{case}/x"], dtype=dtype).transpose(0, 1).contiguous()
    x.requires_grad_(True)
    w = torch.tensor(data[f"{case}/w"], dtype=dtype).transpose(0, 1)
    y = model(x)  # key = value = query: self-attention, M = L
    (w * y).sum().backward()
    out = {"y": y.detach().transpose(0, 1).numpy(), "grad/x": x.grad.transpose(0, 1).numpy()}
    for p in PARAMS:
        layer = getattr(model, TORCH_NAMES[p])
        out[f"grad/{p}/kernel"] = layer.weight.grad.T.numpy()
        out[f"grad/{p}/bias"] = layer.bias.grad.numpy()
    return out


def main() -> None:
    data = dict(np.load(os.path.join(CMP_DIR, "inputs.npz")))
    out = {}
    for case, _, causal, _ in CASES:
        for name, dtype, default in (("float64", torch.float64, torch.float64),
                                     ("float64_index32", torch.float64, torch.float32),
                                     ("float32", torch.float32, torch.float32)):
            # get_index computes pi/2 * arange(1, L + 1) in torch's default dtype, then
            # casts it to q's: float64 throughout needs the default float64 too.
            torch.set_default_dtype(default)
            for key, value in run(data, case, causal, dtype).items():
                out[f"{name}/{case}/{key}"] = value
    torch.set_default_dtype(torch.float32)
    with open(os.path.join(CMP_DIR, "src", "COMMIT")) as f:
        out["commit"] = np.array(f.read().strip())
    out["torch"] = np.array(torch.__version__)
    np.savez(os.path.join(CMP_DIR, "original.npz"), **out)
    print(f"torch {torch.__version__}: {len(CASES)} cases -> {CMP_DIR}/original.npz")


if __name__ == "__main__":
    main()
