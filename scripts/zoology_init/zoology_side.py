"""Zoology's side of the initialisation comparison (results/cpu/zoology_init_vs_zoology.md):
builds Zoology's own LanguageModel (zoology/model.py at d88d6f5, the verbatim copies
setup.sh makes in $CMP_DIR/zoology_init_src) for the MQAR rows attention, Based and Hyena
at our mini's size (L 128, width 64, 2 layers, vocabulary 256), each with its options from
zoology/experiments/models_repo.py and mqar_example_configs/original_mqar_configs.py (the
shared BaseConv of 3 taps before attention and Based, the Identity state mixer, no
positions), at several torch seeds, and writes each parameter's statistics after
Zoology's own _init_weights to $CMP_DIR/zoology_init.json. Run with the torch venv:

    bash scripts/zoology_init/setup.sh
    /tmp/torchvenv/bin/python scripts/zoology_init/zoology_side.py
    .venv/bin/python scripts/zoology_init/compare.py   # ours beside it: the table

Nothing of Zoology's is re-written. Stand-ins: zoology/utils.py imports wandb and pandas
(unused here: empty modules), model.py imports torchvision's StochasticDepth (drop_path
0.0 in these models, so an identity; torchvision is not installed in the torch venv), and
TokenEmbeddings' `device='cuda'` default is set to 'cpu' (a CPU build of torch).
"""
import json
import os
import sys
import types

import torch

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
SEEDS = range(4)
L, WIDTH, VOCAB = 128, 64, 256


def stand_ins() -> None:
    for name in ("wandb", "pandas"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["pandas"].DataFrame = getattr(sys.modules["pandas"], "DataFrame", object)
    ops = types.ModuleType("torchvision.ops")

    class StochasticDepth(torch.nn.Module):
        def __init__(self, p, mode):
            super().__init__()
            assert p == 0.0, p  # these models' drop_path

        def forward(self, x):
            return x

    ops.StochasticDepth = StochasticDepth
    sys.modules["torchvision"] = types.ModuleType("torchvision")
    sys.modules["torchvision.ops"] = ops


def rows():
    from zoology.config import ModelConfig, ModuleConfig

    conv_mixer = dict(name="zoology.mixers.base_conv.BaseConv",
                      kwargs={"l_max": L, "kernel_size": 3, "implicit_long_conv": True})
    common = dict(block_type="TransformerBlock", d_model=WIDTH, n_layers=2,
                  max_position_embeddings=0, vocab_size=VOCAB,
                  state_mixer=dict(name="torch.nn.Identity", kwargs={}))
    attention = dict(name="zoology.mixers.attention.MHA",
                     kwargs={"dropout": 0.1, "num_heads": 2})
    based = dict(name="zoology.mixers.based.Based",
                 kwargs={"l_max": L, "feature_dim": 16, "feature_name": "taylor_exp",
                         "num_key_value_heads": 1, "num_heads": 1, "train_view": "quadratic"})
    hybrid = lambda m: ModuleConfig(name="zoology.mixers.hybrid.Hybrid",  # noqa: E731
                                    kwargs={"configs": [conv_mixer, m]})
    return {
        "transformer": ModelConfig(sequence_mixer=hybrid(attention), name="attention", **common),
        "based": ModelConfig(sequence_mixer=hybrid(based), name="based", **common),
        "hyena": ModelConfig(sequence_mixer=ModuleConfig(name="zoology.mixers.hyena.Hyena",
                                                         kwargs={"l_max": L}),
                             name="hyena", **common),
    }


def main() -> None:
    sys.path.insert(0, os.path.join(CMP_DIR, "zoology_init_src"))
    stand_ins()
    from zoology import model as zoology_model
    from zoology.model import LanguageModel

    init = zoology_model.TokenEmbeddings.__init__
    init.__defaults__ = tuple("cpu" if d == "cuda" else d for d in init.__defaults__)

    out = {"commit": open(os.path.join(CMP_DIR, "zoology_init_src", "COMMIT")).read().strip(),
           "torch": torch.__version__, "seeds": len(SEEDS), "rows": {}}
    for row, config in rows().items():
        params = {}
        for seed in SEEDS:
            torch.manual_seed(seed)
            model = LanguageModel(config)
            tied = model.lm_head.weight is model.backbone.embeddings.word_embeddings.weight
            for name, p in model.named_parameters():
                x = p.detach().double().flatten()
                entry = params.setdefault(name, {"shape": list(p.shape), "values": []})
                entry["values"].append(x.tolist())
        out["rows"][row] = {"tied_head": tied, "n_layers": config.n_layers,
                            "params": {n: {"shape": e["shape"],
                                           "values": sum(e["values"], [])}
                                       for n, e in params.items()}}
        print(row, "tied head:", tied, "|", len(params), "parameters")
    with open(os.path.join(CMP_DIR, "zoology_init.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
