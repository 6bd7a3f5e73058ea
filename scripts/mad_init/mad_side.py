"""mad-lab's side of the initialisation comparison (results/cpu/mad_init_vs_mad_lab.md):
builds mad-lab's own models (athms/mad-lab 0f49a45, the verbatim copies setup.sh makes in
$CMP_DIR/mad_init_src) as its benchmark.py make_model_fn does: each layer's options from
its configs/layers/<name>.yml (loaded once per layer), `dim` and `max_length` set on every
layer config, width 128, layers [mixer, swiglu, mixer, swiglu] (2 mixer layers, each
followed by the SwiGLU channel mixer, benchmark.py's default pattern), the vocabulary
and length of the task's baseline (configs/tasks/<task>.yml): the LanguageModel for
in-context recall (vocab 16, length 128) and the AutoEncoder for compression (vocab 16,
length 32). Rows: gla (gated-linear-attention), hyena (hyena), and both again under
compression. At several torch seeds it writes, for each parameter after the model's own
_init_weights, its shape and per seed (n, sum, sum of squares, max |w|) to
$CMP_DIR/mad_init.json. Run with the torch venv:

    bash scripts/mad_init/setup.sh
    /tmp/torchvenv/bin/python scripts/mad_init/mad_side.py
    .venv/bin/python scripts/mad_init/compare.py   # ours beside it: the table

Nothing of mad-lab's is re-written or stood in for: its package __init__ files are not
copied (they import the Lightning wrapper and every layer), so only the modules these
rows need are imported; no forward pass runs (the kernels are Triton's, CUDA only).
"""
import json
import os
import sys

import torch
import yaml

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
SRC = os.path.join(CMP_DIR, "mad_init_src")
SEEDS = range(4)
DIM = 128
# row -> (task yml, backbone, mixer layer name); mad/registry.py's layer_registry names
ROWS = {
    "gla": ("in-context-recall", "language-model", "gated-linear-attention"),
    "hyena": ("in-context-recall", "language-model", "hyena"),
    "compression/gla": ("compression", "autoencoder", "gated-linear-attention"),
    "compression/hyena": ("compression", "autoencoder", "hyena"),
}


def load_yml(path):
    with open(os.path.join(SRC, path), encoding="utf-8") as f:
        return yaml.safe_load(f)


def build(task: str, backbone: str, mixer: str):
    from mad.model.auto_encoder import AutoEncoder
    from mad.model.language_model import LanguageModel
    from mad.model.layers.attention_gated_linear import GatedLinearAttention
    from mad.model.layers.hyena import HyenaOperator
    from mad.model.layers.mlp import SwiGLU

    modules = {"gated-linear-attention": GatedLinearAttention, "hyena": HyenaOperator,
               "swiglu": SwiGLU}  # mad/registry.py layer_registry[name]['module']
    baseline = load_yml(f"configs/tasks/{task}.yml")["baseline"]
    names = [mixer, "swiglu", mixer, "swiglu"]
    layer_cfgs = [load_yml(f"configs/layers/{n}.yml") for n in names]
    for lc in layer_cfgs:  # benchmark.py make_model_fn
        lc["max_length"] = baseline["seq_len"]
        lc["dim"] = DIM
    model_cls = LanguageModel if backbone == "language-model" else AutoEncoder
    return model_cls(dim=DIM, vocab_size=baseline["vocab_size"],
                     layers=[modules[n] for n in names], layer_cfgs=layer_cfgs,
                     max_length=baseline["seq_len"]), baseline


def main() -> None:
    sys.path.insert(0, SRC)
    with open(os.path.join(SRC, "COMMIT"), encoding="utf-8") as f:
        commit = f.read().strip()
    out = {"commit": commit, "torch": torch.__version__, "seeds": len(SEEDS), "rows": {}}
    for row, (task, backbone, mixer) in ROWS.items():
        params = {}
        for seed in SEEDS:
            torch.manual_seed(seed)
            model, baseline = build(task, backbone, mixer)
            tied = model.unembed[1].weight is model.token_embeds.weight
            for name, p in model.named_parameters():
                x = p.detach().double().flatten()
                entry = params.setdefault(name, {"shape": list(p.shape), "seeds": []})
                entry["seeds"].append([x.numel(), x.sum().item(), (x * x).sum().item(),
                                       x.abs().max().item()])
        out["rows"][row] = {"task": task, "backbone": backbone, "mixer": mixer,
                            "vocab_size": baseline["vocab_size"],
                            "seq_len": baseline["seq_len"], "tied_head": tied,
                            "params": params}
        print(row, f"({backbone}, {mixer} + swiglu, vocab {baseline['vocab_size']}, "
              f"length {baseline['seq_len']}):", len(params), "parameters")
    with open(os.path.join(CMP_DIR, "mad_init.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
