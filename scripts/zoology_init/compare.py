"""Ours beside Zoology's own model (results/cpu/zoology_init_vs_zoology.md): the MQAR
mini's model at L 128, width 64 (configs/mqar.py:model=<row>,mini,seq_len=128, its
zoology_mqar scaffold: init zoology, tied head) for the rows whose Zoology mixers build
without fla (attention, Based, Hyena), at the seeds zoology_side.py used, each parameter
of a role pooled over layers and seeds, beside Zoology's ($CMP_DIR/zoology_init.json,
written by zoology_side.py in the torch venv). Prints the markdown table; exits 1 when a
role's standard deviation or mean differs by more than 5 standard errors (or 5% of the
sd, for the small tensors) or the heads' tying differs.

    .venv/bin/python scripts/zoology_init/compare.py

Roles map Zoology's names to ours (one fused projection there may be several here:
Wqkv = query, key, value). Zoology's attention and Based rows are Hybrid(BaseConv, mixer)
models, so their mixer is in layer 1 and BaseConv in layer 0; ours has the mixer in both
layers behind the shared convolution (configs/scaffold.py ZOOLOGY_MQAR): the mixer roles
compare Zoology's layer 1 with our two layers, the shared-convolution role Zoology's
BaseConv conv with our ShortConv.
"""
from __future__ import annotations

import json
import os
import re
import sys

import numpy as np

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
MIXER = r"backbone\.layers\.\d+\.sequence_mixer\.(mixer\.)?"
# row -> [(role, Zoology's parameter names (regex), ours (regex over our paths))]
ROLES = {
    "transformer": [
        ("Wqkv.weight / query, key, value kernels", MIXER + r"Wqkv\.weight",
         r"mixer/(query|key|value)/kernel"),
        ("Wqkv.bias / their biases", MIXER + r"Wqkv\.bias", r"mixer/(query|key|value)/bias"),
        ("out_proj.weight / out kernel (rescaled)", MIXER + r"out_proj\.weight",
         r"mixer/out/kernel"),
        ("out_proj.bias / out bias", MIXER + r"out_proj\.bias", r"mixer/out/bias"),
    ],
    "based": [
        ("proj_q, proj_k / query, key kernels", MIXER + r"proj_[qk]\.weight",
         r"mixer/(query|key)/kernel"),
        ("proj_v / value kernel", MIXER + r"proj_v\.weight", r"mixer/value/kernel"),
        ("proj_o / out kernel (not rescaled)", MIXER + r"proj_o\.weight", r"mixer/out/kernel"),
    ],
    "hyena": [
        ("in_proj.weight", MIXER + r"in_proj\.weight", r"mixer/in_proj/kernel"),
        ("in_proj.bias", MIXER + r"in_proj\.bias", r"mixer/in_proj/bias"),
        ("out_proj.weight (rescaled)", MIXER + r"out_proj\.weight", r"mixer/out_proj/kernel"),
        ("out_proj.bias", MIXER + r"out_proj\.bias", r"mixer/out_proj/bias"),
        ("filter MLP first Linear / filter_in", MIXER + r"filter_fn\.implicit_filter\.0\.weight",
         r"mixer/filter_in/kernel"),
        ("filter MLP hidden Linears / filter_hidden",
         MIXER + r"filter_fn\.implicit_filter\.[24]\.weight", r"mixer/filter_hidden/\d+/kernel"),
        ("filter MLP biases", MIXER + r"filter_fn\.implicit_filter\.[024]\.bias",
         r"mixer/filter_(in|hidden/\d+)/bias"),
        ("filter MLP last Linear / filter_out", MIXER + r"filter_fn\.implicit_filter\.6\.weight",
         r"mixer/filter_out/kernel"),
        ("filter_fn.bias (kept: randn)", MIXER + r"filter_fn\.bias", r"mixer/bias"),
        ("Sin freq (kept: ones)", MIXER + r"filter_fn\.implicit_filter\.1\.freq", r"mixer/freq"),
        ("pos_emb z (kept)", MIXER + r"filter_fn\.pos_emb\.z", r"mixer/z"),
    ],
}
COMMON = [
    ("token embedding (head tied to it)", r"backbone\.embeddings\.word_embeddings\.weight",
     r"encoder/embeddings/token/embedding"),
    ("norms' scales (kept: ones)", r"backbone\.(layers\.\d+\.norm[12]|ln_f)\.weight",
     r"encoder/(norm|stack/blocks/\d+/mixer_norm)/scale"),
]
SHARED_CONV = ("shared short conv weight (kept: torch's Conv1d draw)",
               r"backbone\.layers\.0\.sequence_mixer\.mixer\.conv\.conv\.weight",
               r"short_conv/weight")


def ours(row: str, seeds, init: str = "zoology") -> tuple[dict[str, np.ndarray], bool]:
    from flax import nnx

    import lra.tasks
    from configs import mqar, scaffold
    from lra.training import model as model_lib

    values: dict[str, list] = {}
    tied = True
    for seed in seeds:
        config = mqar.get_config(f"model={row},mini,seq_len=128")
        config.random_seed = seed
        if init != "zoology":  # the control: our own initialisation, an untied head
            config.scaffold.init, config.scaffold.tie_head = init, False
            config = scaffold.resolve(config)
        model = model_lib.build_model(config, lra.tasks.get(config.task).with_options(
            **config.task_options.to_dict()))
        tied &= model.lm_head is None
        for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            values.setdefault("/".join(map(str, path)), []).append(np.asarray(v).ravel())
    return {k: np.concatenate(v) for k, v in values.items()}, tied


def pool(params: dict, pattern: str, *, match) -> np.ndarray | None:
    found = [np.asarray(v, np.float64).ravel() for k, v in params.items() if match(pattern, k)]
    return np.concatenate(found) if found else None


def agrees(a: np.ndarray, b: np.ndarray) -> bool:
    sd = max(a.std(), b.std())
    if sd == 0:
        return abs(a.mean() - b.mean()) < 1e-12
    tol_sd = 5 * sd / np.sqrt(2 * min(a.size, b.size)) + 0.05 * sd
    tol_mean = 5 * sd / np.sqrt(min(a.size, b.size)) + 0.05 * sd
    return abs(a.std() - b.std()) <= tol_sd and abs(a.mean() - b.mean()) <= tol_mean


def main() -> int:
    with open(os.path.join(CMP_DIR, "zoology_init.json"), encoding="utf-8") as f:
        zoology = json.load(f)
    seeds = range(zoology.get("seeds", 4))
    bad = 0
    print(f"Zoology {zoology['commit'][:7]} (torch {zoology['torch']}) beside ours, "
          f"{len(seeds)} seeds each\n")
    print("| row | parameter (Zoology / ours) | Zoology sd | ours sd | Zoology mean | "
          "ours mean | agree |")
    print("|---|---|---|---|---|---|---|")
    for row, roles in ROLES.items():
        z = {k: np.asarray(v["values"]) for k, v in zoology["rows"][row]["params"].items()}
        o, tied = ours(row, seeds)
        shared = [SHARED_CONV] if row != "hyena" else []
        for role, zpat, opat in COMMON[:1] + roles + shared + COMMON[1:]:
            a = pool(z, zpat, match=lambda p, k: re.fullmatch(p, k))
            b = pool(o, opat, match=lambda p, k: re.search(p + "$", k))
            if a is None or b is None:
                print(f"| {row} | {role} | {'-' if a is None else 'found'} | "
                      f"{'-' if b is None else 'found'} | | | MISSING |")
                bad += 1
                continue
            ok = agrees(a, b)
            bad += not ok
            print(f"| {row} | {role} | {a.std():.4f} | {b.std():.4f} | {a.mean():+.4f} | "
                  f"{b.mean():+.4f} | {'yes' if ok else 'NO'} |")
        same_tie = tied == zoology["rows"][row]["tied_head"]
        bad += not same_tie
        print(f"| {row} | LM head tied to the embedding | "
              f"{zoology['rows'][row]['tied_head']} | {tied} | | | "
              f"{'yes' if same_tie else 'NO'} |")
    # CONTROL (must read NO): the same comparison, ours under scaffold.init=own.
    z = {k: np.asarray(v["values"]) for k, v in zoology["rows"]["transformer"]["params"].items()}
    o, _ = ours("transformer", seeds, init="own")
    role, zpat, opat = ROLES["transformer"][0]
    a = pool(z, zpat, match=lambda p, k: re.fullmatch(p, k))
    b = pool(o, opat, match=lambda p, k: re.search(p + "$", k))
    control = agrees(a, b)
    bad += control
    print(f"| CONTROL: transformer, ours with init own | {role} | {a.std():.4f} | "
          f"{b.std():.4f} | {a.mean():+.4f} | {b.mean():+.4f} | "
          f"{'yes (the check cannot fail: FAIL)' if control else 'NO (as it must)'} |")
    print(f"\n{bad} role(s) differ" if bad else "\nevery role agrees")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    sys.exit(main())
