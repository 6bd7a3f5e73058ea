"""The papers' own LRA recipes for the state-space rows: the `paper` config argument.

    python launch.py --config=configs/listops.py:model=s4d,paper --workdir=workdirs/s4d_paper

LRA's task configs give every variant the Transformer's budget (4 layers of 512, 5000
steps of batch 32 on ListOps). The state-space papers trained their rows otherwise: deeper
and narrower models, tens of epochs, AdamW with a cosine schedule, a smaller learning
rate for the SSM parameters, mean pooling. Their numbers (S4 86.1, S5 87.5, Mega 88.2
average) are for those recipes, so a comparison with them needs the recipe, and one with
LRA's Transformer needs LRA's budget: `paper` gives the first, the default the second.

A recipe sets config fields (sizes, optimiser, schedule, steps, dropout, pooling, block
form, and the input length where the paper's differs from LRA's config: Text), the
variant's hparams (state size, dt range, ...) and its parameter groups (lra/training/optim.py),
each from the file and commit named beside it. `common.finalize` merges the hparams over
the presets (which it rescales to max_length): a recipe's values are the paper's at the
paper's length, so `paper` refuses `mini`, `runlocal` and `locality`. Epochs become steps
as epochs x ceil(training examples / batch) with LRA's training-split sizes
(TRAIN_EXAMPLES). The config records the recipe's source in `config.recipe`.

Every recipe's `deviations` says what of the original it does not reproduce. Common to all:
- BatchNorm (S4's and S5's LRA configs, Mega's image tasks) and ScaleNorm (Mega's Text and
  Retrieval): the blocks here normalise with LayerNorm, which needs no running statistics
  across devices or an eval mode; the residual form (pre- or post-norm; Mega's prenorm
  layer x + u o (h - x) is block kind mega_pre_ln) and the presence of a feed-forward
  branch are reproduced (block.kind, block.ffn).
- The encoder ends with a LayerNorm and the head is LRA's, Dense(mlp_dim), ReLU, Dense
  (retrieval: on [x1, x2, x1 * x2, x1 - x2]); the recipes set mlp_dim to the originals'
  head width where they have one and to the model width where their head is one Dense.
- Pixels (Image, Pathfinder, Path-X) enter as tokens through an embedding table; the
  originals feed the normalised intensity through a linear encoder.
- Early stopping and validation schedules (S5's `lr_patience`, off by default) are not
  part of a recipe; nor are the originals' seeds and evaluation splits.
"""
from __future__ import annotations

import math
from typing import Any

import ml_collections

from configs import presets
from lra.errors import ConfigError

# LRA's training-split sizes (the tasks' generators and releases), to turn epochs into steps.
TRAIN_EXAMPLES = {"listops": 96_000, "text": 25_000, "retrieval": 147_086, "image": 45_000,
                  "pathfinder": 160_000, "pathx": 160_000}
PIXEL_TASKS = ("image", "pathfinder", "pathx")


def steps(task: str, epochs: float, batch_size: int) -> int:
    """`epochs` passes over `task`'s training split in batches of `batch_size` (the last,
    partial batch counted), as a number of steps."""
    return int(epochs * math.ceil(TRAIN_EXAMPLES[task] / batch_size))


# ------------------------------------------------------------------------------ S4 (s4d)
# state-spaces/s4 at e757cef57d89e448c413de7325ed5601aceaac13,
# configs/experiment/lra/s4-<task>.yaml (task: listops, imdb, aan, cifar, pathfinder,
# pathx); configs/optimizer/adamw.yaml (betas 0.9, 0.999; torch's eps 1e-8);
# configs/scheduler/cosine_warmup.yaml (HF get_cosine_schedule_with_warmup: our
# constant * linear_warmup * cosine_decay); configs/model/s4.yaml + base: layers of the
# S4 layer alone (no feed-forward), `decoder.mode: pool` (mean pooling), a Dense head
# (mlp_dim = d_model here); configs/dataset/imdb.yaml l_max 4096 (Text; LRA's config 1000).
#
# Updates: PyTorch Lightning stops at trainer.max_epochs, each epoch
# floor(training examples / batch) updates (configs/loader/default.yaml drop_last: True),
# while the cosine spans scheduler.num_training_steps: IMDB 32 x 1,562 = 49,984 and AAN
# 20 x 2,298 = 45,960 updates of a cosine over 50,000 (steps_per_cycle), the other tasks
# exactly num_training_steps.
#
# Optimiser, per parameter (train.py configure_optimizers; a parameter's `_optim` dict
# overrides the optimizer's lr and weight_decay in a group of its own):
# - kernel.py Kernel.__init__/register(): `layer.lr` a dict gives the listed SSM
#   parameters that lr and the others None (the optimizer's); a number gives it to all of
#   dt, A, B and C (SSMKernelDiag.register_params: inv_dt <- lr['dt'], A_real/A_imag (and
#   DPLR's P) <- lr['A'], B <- lr['B'], C <- lr['C']). Weight decay: layer.wd 0.0
#   (configs/model/layer/s4.yaml) for dt, A, B; C is registered with wd None, i.e. the
#   optimizer's 0.05. Our groups: dt "ssm_step", A "ssm", B "ssm_b", C "ssm_c"
#   (models/mixers/ssm.py).
# - configs/config.yaml train.optimizer_param_grouping {bias_weight_decay: False,
#   normalization_weight_decay: False} -> src/utils/optim_groups.py add_optimizer_hooks,
#   applied to the backbone only (`add_optimizer_hooks(self.model, ...)`): every
#   parameter named *bias and every norm module's parameters (BatchNorm; and nn.Embedding,
#   of which the backbone has none) get weight decay 0. The encoder (nn.Embedding for
#   text, nn.Linear for pixels) and the decoder are not in self.model: decayed, biases
#   too. Here: the stack's biases and norms and the encoder's final norm are exempt
#   (weight_decay_exempt); the embedding table and the head are decayed.
# - Everything else (D, the output Linear's weight, encoder, decoder): the optimizer's
#   lr and weight decay 0.05.
_S4_COMMON = dict(factors="constant * linear_warmup * cosine_decay", adam_b1=0.9,
                  adam_b2=0.999, adam_eps=1e-8, grad_clip_norm=0.0, pooling="MEAN",
                  weight_decay=0.05,
                  weight_decay_exempt=("encoder/stack/*bias", "encoder/stack/*norm/scale",
                                       "encoder/norm/*"))
# S4's kernel parameters -> the s4d mixer's groups (kernel.py's lr-dict keys).
S4_GROUPS = {"dt": "ssm_step", "A": "ssm", "B": "ssm_b", "C": "ssm_c"}
_S4_DEVIATIONS = ("norm: batch is LayerNorm; mode nplr, init legs (S4's DPLR kernel: "
                  "HiPPO-LegS A with a low-rank term P trained as A, bilinear "
                  "discretisation) is s4d's diagonal S4D-Lin (ZOH, B = 1 at init)")


def s4_param_groups(layer_lr: float | dict[str, float | None],
                    lr: float) -> dict[str, dict[str, float]]:
    """config.param_groups of the s4d mixer for S4's `model.layer.lr` (`layer_lr`: one
    number, or a dict over dt, A, B, C) under optimizer lr `lr`, as kernel.py's
    register() assigns them: lr None is the optimizer's (lr_scale 1), weight decay 0 for
    dt, A, B (layer.wd 0.0) and the optimizer's for C (no weight_decay entry)."""
    groups = {}
    for key, group in S4_GROUPS.items():
        rate = layer_lr.get(key) if isinstance(layer_lr, dict) else layer_lr
        settings = {"lr_scale": 1.0 if rate is None else round(rate / lr, 12)}
        if key != "C":
            settings["weight_decay"] = 0.0
        groups[group] = settings
    return groups


def _s4(task, s4_task, *, layers, width, prenorm, batch, lr, layer_lr, n_ssm, train_steps,
        warmup, epochs, dropout, d_state, dt_min=1e-3, max_length=None, deviations=""):
    length = {} if max_length is None else {"max_length": max_length}
    updates = min(train_steps, epochs * (TRAIN_EXAMPLES[task] // batch))
    hparams = dict(d_state=d_state, dt_min=dt_min, dt_max=0.1, dt_transform="softplus",
                   conv_dropout=dropout)
    if n_ssm is not None:  # n_ssm: null is one (A, B) per channel, the mixer's default
        hparams["n_ssm"] = n_ssm
    return dict(
        source=f"state-spaces/s4@e757cef configs/experiment/lra/s4-{s4_task}.yaml",
        fields=dict(_S4_COMMON, num_layers=layers, emb_dim=width, qkv_dim=width,
                    mlp_dim=width, batch_size=batch, learning_rate=lr,
                    num_train_steps=updates, steps_per_cycle=train_steps - warmup,
                    warmup=warmup, dropout_rate=dropout, attention_dropout_rate=dropout,
                    **length),
        block={"kind": "pre_ln" if prenorm else "post_ln", "ffn": False},
        model_hparams=hparams,
        param_groups=s4_param_groups(layer_lr, lr),
        deviations="; ".join(filter(None, (_S4_DEVIATIONS, _HEAD[s4_task == "aan"] % "S4",
                                           deviations))))


# The head clause of a recipe's deviations, for a classifier and for retrieval.
_HEAD = ("LRA's two-layer head (ReLU) for %s's one Dense",
         "LRA's head (ReLU) for %s's Dense(d_model), GELU, Dense on the same four features")
_S4_PIXELS = "pixel tokens through an embedding table (S4: encoder: linear on the intensity)"
_S4_LR_DICT = {"dt": None, "A": 0.001, "B": 0.001}

# ------------------------------------------------------------------------------ S5
# lindermanlab/S5 at 3c18fdb6b06414da35e77b94b9cd855f6a95ef17, bin/run_experiments/
# run_lra_<script>.sh: the rows below are the scripts' flags, under their own names; the
# flags a script leaves out take run_train.py's defaults (activation_fn half_glu1,
# clip_eigs False, dt_min 1e-3, dt_max 0.1, discretization zoh, mode pool, prenorm True,
# conj_sym True). Every script sets bidirectional=True (our causal=False) and
# batchnorm=True (not reproduced).
_S5_SCRIPTS: dict[str, tuple[str, dict[str, Any]]] = {
    "listops": ("listops", dict(
        C_init="lecun_normal", activation_fn="half_glu2", blocks=8, bsz=50, d_model=128,
        epochs=40, lr_factor=3, n_layers=8, opt_config="BfastandCdecay", p_dropout=0.0,
        ssm_lr_base=0.001, ssm_size_base=16, warmup_end=1, weight_decay=0.04)),
    "text": ("imdb", dict(
        C_init="lecun_normal", activation_fn="half_glu2", blocks=12, bsz=50, d_model=256,
        dt_global=True, epochs=35, lr_factor=4, n_layers=6, opt_config="standard",
        p_dropout=0.1, ssm_lr_base=0.001, ssm_size_base=192, warmup_end=0,
        weight_decay=0.07)),
    "retrieval": ("aan", dict(
        C_init="trunc_standard_normal", blocks=16, bsz=32, d_model=128, dt_global=True,
        epochs=20, lr_factor=2, n_layers=6, opt_config="standard", p_dropout=0.0,
        ssm_lr_base=0.001, ssm_size_base=256, warmup_end=1, weight_decay=0.05)),
    "image": ("cifar", dict(
        C_init="lecun_normal", blocks=3, bsz=50, clip_eigs=True, d_model=512, epochs=250,
        lr_factor=4.5, n_layers=6, opt_config="BfastandCdecay", p_dropout=0.1,
        ssm_lr_base=0.001, ssm_size_base=384, warmup_end=1, weight_decay=0.07)),
    "pathfinder": ("pathfinder", dict(
        C_init="trunc_standard_normal", blocks=8, bsz=64, d_model=192, epochs=200,
        lr_factor=5, n_layers=6, opt_config="standard", p_dropout=0.05,
        ssm_lr_base=0.0009, ssm_size_base=256, warmup_end=1, weight_decay=0.03)),
    "pathx": ("pathx", dict(
        C_init="complex_normal", blocks=16, bsz=32, d_model=128, dt_min=0.0001, epochs=75,
        lr_factor=3, n_layers=6, opt_config="BandCdecay", p_dropout=0.0,
        ssm_lr_base=0.0006, ssm_size_base=256, warmup_end=1, weight_decay=0.06)),
}
# S5's IMDB loader (s5/dataloaders/lra.py IMDB, l_max 4096); LRA's Text config has 1000.
_S5_MAX_LENGTH = {"text": 4096}
_S5_DEVIATIONS = (
    "batchnorm=True is LayerNorm; S5's cosine counts the global step (at the end of the "
    "warmup it is already at phase warmup / (T - warmup), and the last warmup steps run "
    "at 0), ours starts at the end of the warmup")

# The token tasks (s5/train.py: `padded` for imdb, listops, aan; s5/train_helpers.py
# prep_batch; s5/seq_model.py StackedEncoderModel and ClassificationModel).
_S5_TEXT_DEVIATIONS = (
    "tokens through LRA's embedding table (std 1, no bias; S5: one-hot tokens through its "
    "encoder nn.Dense, flax's lecun_normal kernel, std 1/sqrt(vocab), and a bias)",
    "padded positions are zeroed before the scans (S5 scans the padding, <pad> = 0 "
    "embedded as a token, and masks only the mean pool: its reverse scan carries the "
    "padding into the real positions)")


def _s5(task: str) -> dict[str, Any]:
    """S5's recipe for `task` from its script's flags (_S5_SCRIPTS).

    Learning rates: S5 trains group "ssm" at ssm_lr_base (Adam, no decay) and the rest at
    lr_factor x ssm_lr_base (AdamW): config.learning_rate is the latter, and the groups
    (presets.TASK_PARAM_GROUPS, from the same scripts' opt_config) scale it by
    1 / lr_factor. Schedule (s5/train.py, s5/train_helpers.py): linear warmup for
    `warmup_end` epochs, then cosine annealing to lr_min = 0 over the remaining epochs,
    every step; warmup_end=0 (imdb) skips the warmup (warmup 0 here: the rate is 0 at
    step 0 only). Adam's b1, b2, eps: optax's defaults. No gradient clipping.
    Dropout: S5's SequenceLayer drops after the GELU and after the gate, inside our s5
    mixer (its attention_dropout: config.attention_dropout_rate), and nowhere else (no
    dropout on the encoder's output): config.dropout_rate, which would drop the
    embeddings and the mixer's output once more, is 0."""
    script, f = _S5_SCRIPTS[task]
    lr = round(f["lr_factor"] * f["ssm_lr_base"], 12)  # 5 x 0.0009 is 0.0045000000000000005
    hparams = dict(d_state=f["ssm_size_base"], blocks=f["blocks"], c_init=f["C_init"],
                   activation=f.get("activation_fn", "half_glu1"),
                   dt_min=f.get("dt_min", 1e-3), dt_max=0.1, discretization="zoh")
    if "clip_eigs" in f:  # else build_s5's default: unclipped for the bidirectional form
        hparams["clip_eigs"] = f["clip_eigs"]
    deviations = [_S5_DEVIATIONS, _HEAD[task == "retrieval"] % "S5"]
    if TRAIN_EXAMPLES[task] % f["bsz"]:
        floor = f["epochs"] * (TRAIN_EXAMPLES[task] // f["bsz"])
        deviations.append(f"S5's loader drops each epoch's last partial batch ({floor} "
                          f"steps); steps() counts it")
    if task in PIXEL_TASKS:
        deviations.append("pixel tokens through an embedding table (S5: the normalised "
                          "intensity through its Dense encoder)")
    else:
        deviations.extend(_S5_TEXT_DEVIATIONS)
    return dict(
        source=f"lindermanlab/S5@3c18fdb bin/run_experiments/run_lra_{script}.sh",
        fields=dict(
            num_layers=f["n_layers"], emb_dim=f["d_model"], qkv_dim=f["d_model"],
            mlp_dim=f["d_model"], num_heads=1,  # one MIMO SSM: num_heads is unused
            batch_size=f["bsz"], learning_rate=lr, weight_decay=f["weight_decay"],
            adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8, grad_clip_norm=0.0,
            factors="constant * linear_warmup * cosine_decay", steps_per_cycle=0,
            warmup=steps(task, f["warmup_end"], f["bsz"]),
            num_train_steps=steps(task, f["epochs"], f["bsz"]),
            dropout_rate=0.0, attention_dropout_rate=f["p_dropout"], pooling="MEAN",
            **({"max_length": _S5_MAX_LENGTH[task]} if task in _S5_MAX_LENGTH else {})),
        block={"kind": "pre_ln", "ffn": False},  # prenorm=True; s5/layers.py has no FFN
        model_hparams=hparams,
        param_groups=presets.param_groups("s5", task),
        deviations="; ".join(deviations))


# ------------------------------------------------------------------------------ Mega
# facebookresearch/mega at aeaa4b44592cd1d60a9a34554e359eda2a62b03b:
# examples/mega/README.lra.md (one training command per task) and
# fairseq/models/lra/model.py (the architecture each command names: mega_lra_listop,
# _imdb, _aan, _cifar10, _pf32, _pf128; a command-line flag wins over the architecture's
# default). Every command: Adam (fairseq's, decoupled weight decay: AdamW) with betas
# (0.9, 0.98), eps 1e-8, clip-norm 1.0, lr-scheduler linear_decay to 0 at max-update,
# sen-rep-type mp (mean pooling), n-dim 16. The FFN's hidden width
# (encoder_ffn_embed_dim) and Mega's hidden_dim both default to encoder_hidden_dim, 2 x
# embed in every architecture, as the classifier's width (classifier_out_dim).
# batch = batch-size x update-freq (x 8 GPUs for Path-X, "tested on 8 x A100").
# chunk-size is the user's ($CHUNK): -1 (full attention) is Mega's row of the paper;
# Mega-chunk is --config.model_hparams.chunk_size=<c>.
_MEGA_COLUMNS = ("arch", "layers", "embed", "z_dim", "norm", "prenorm", "attn_fn", "lr",
                 "wd", "dropout", "batch", "updates", "warmup", "truncation")
_MEGA_ROWS: dict[str, tuple] = {
    "listops": ("mega_lra_listop", 6, 80, 64, "layernorm", False, "softmax", 0.001, 0.01,
                0.1, 64, 90_000, 3_000, 1024),
    "text": ("mega_lra_imdb", 4, 128, 64, "scalenorm", False, "softmax", 0.004, 0.01,
             0.1, 25 * 2, 25_000, 10_000, 1024),
    "retrieval": ("mega_lra_aan", 6, 128, 64, "scalenorm", False, "softmax", 0.003, 0.04,
                  0.1, 8 * 8, 91_960, 10_000, 1024),
    "image": ("mega_lra_cifar10", 8, 160, 96, "batchnorm", True, "laplace", 0.01, 0.02,
              0.0, 50, 180_000, 9_000, 1024),
    "pathfinder": ("mega_lra_pf32", 6, 128, 64, "batchnorm", True, "laplace", 0.01, 0.01,
                   0.0, 128, 250_000, 50_000, 1024),
    "pathx": ("mega_lra_pf128", 4, 64, 32, "syncbatchnorm", True, "laplace", 0.01, 0.01,
              0.0, 2 * 8 * 8, 125_000, 25_000, 4096),
}
# max_positions 4002 of mega_lra_imdb: reviews of 4000 bytes (LRA's Text config: 1000).
_MEGA_MAX_LENGTH = {"text": 4000}
_MEGA_DEVIATIONS = (
    "linear_decay's warmup starts at 0 (Mega: at 1e-7); the FFN is the tanh-approximate "
    "GELU (Mega: SiLU) and dropout_rate also drops its hidden (Mega: act-dropout 0) and the "
    "mixer's output (Mega: no dropout there)")


def _mega(task: str) -> dict[str, Any]:
    """Mega's recipe for `task` from its README command and architecture (_MEGA_ROWS).

    Dropouts (every command: attention-dropout 0, act-dropout 0): `dropout` drops the
    embeddings, Mega's EMA output and h, and the FFN's output; here config.dropout_rate
    (embeddings, the block's branches) and the mixer's `dropout` hparam;
    attention_dropout_rate and the mixer's `hidden_dropout` (on v) are 0."""
    r = dict(zip(_MEGA_COLUMNS, _MEGA_ROWS[task]))
    width = r["embed"]
    deviations = [_MEGA_DEVIATIONS, "LRA's head: ReLU, no dropout (Mega: GELU, dropout)"
                  + (", on [x1, x2, x1 * x2, x1 - x2] (Mega: [x1, x2])"
                     if task == "retrieval" else "")]
    if r["norm"] != "layernorm":
        deviations.append(f"norm-type {r['norm']} is LayerNorm")
    else:  # results/cpu/mega_prenorm_vs_original.md sets theirs to ours to compare
        deviations.append("LayerNorm eps 1e-6 (Mega's SequenceNorm: 1e-5)")
    if task in PIXEL_TASKS:
        deviations.append("pixel tokens through an embedding table (Mega: the normalised "
                          "intensity, --pixel-normalization, through a linear embedding)")
    if task == "pathx":
        deviations.append("--warmup-power 2 (a quadratic warmup) is linear here")
    return dict(
        source=(f"facebookresearch/mega@aeaa4b4 examples/mega/README.lra.md "
                f"({r['arch']}, fairseq/models/lra/model.py)"),
        fields=dict(
            num_layers=r["layers"], emb_dim=width, qkv_dim=width, mlp_dim=2 * width,
            num_heads=1,  # Mega's gated attention has one head
            batch_size=r["batch"], learning_rate=r["lr"], weight_decay=r["wd"],
            adam_b1=0.9, adam_b2=0.98, adam_eps=1e-8, grad_clip_norm=1.0,
            factors="constant * linear_warmup * linear_decay", steps_per_cycle=0,
            warmup=r["warmup"], num_train_steps=r["updates"],
            dropout_rate=r["dropout"], attention_dropout_rate=0.0, pooling="MEAN",
            **({"max_length": _MEGA_MAX_LENGTH[task]} if task in _MEGA_MAX_LENGTH else {})),
        # normalize_before False (the text tasks) is post-norm; the image tasks pass
        # --encoder-normalize-before: Mega's prenorm layer x + u o (h - x), the norm on
        # the mixer's input only (block kind mega_pre_ln; pre_ln would interpolate from
        # LN(x)). Mega's layer is followed by its normalised FFN (pre- or post-norm too).
        block={"kind": "mega_pre_ln" if r["prenorm"] else "post_ln", "ffn": True},
        model_hparams=dict(ndim=16, z_dim=r["z_dim"], hidden_dim=2 * width, chunk_size=-1,
                           truncation=r["truncation"], attention_activation=r["attn_fn"],
                           dropout=r["dropout"], hidden_dropout=0.0),
        param_groups={},  # one Adam group: every parameter at lr, decayed
        deviations="; ".join(deviations))


# (model, task) -> {"source", "fields", "block", "model_hparams", "param_groups",
# "deviations"}.
RECIPES: dict[tuple[str, str], dict[str, Any]] = {
    # layer.lr {dt: null, A: 0.001, B: 0.001}, n_ssm 1: ListOps, IMDB, AAN.
    ("s4d", "listops"): _s4("listops", "listops", layers=6, width=256, prenorm=False,
                            batch=32, lr=0.01, layer_lr=_S4_LR_DICT, n_ssm=1,
                            train_steps=120_000, warmup=12_000, epochs=40, dropout=0.0,
                            d_state=4),
    ("s4d", "text"): _s4("text", "imdb", layers=6, width=256, prenorm=True, batch=16,
                         lr=0.01, layer_lr=_S4_LR_DICT, n_ssm=1, train_steps=50_000,
                         warmup=5_000, epochs=32, dropout=0.0, d_state=4, max_length=4096),
    ("s4d", "retrieval"): _s4("retrieval", "aan", layers=6, width=256, prenorm=True,
                              batch=64, lr=0.01, layer_lr=_S4_LR_DICT, n_ssm=1,
                              train_steps=50_000, warmup=5_000, epochs=20, dropout=0.0,
                              d_state=4),
    # layer.lr 0.001 (dt, A, B and C); n_ssm 1 on CIFAR, null on Pathfinder and Path-X.
    ("s4d", "image"): _s4("image", "cifar", layers=6, width=512, prenorm=False, batch=50,
                          lr=0.01, layer_lr=0.001, n_ssm=1, train_steps=180_000,
                          warmup=18_000, epochs=200, dropout=0.1, d_state=64,
                          deviations=_S4_PIXELS + "; dropout_rate also drops the "
                          "embeddings (S4: dropinp 0), and the layer's output before the "
                          "residual sum with one mask per element (S4: tie_dropout, one "
                          "mask per channel across the sequence)"),
    ("s4d", "pathfinder"): _s4("pathfinder", "pathfinder", layers=6, width=256,
                               prenorm=True, batch=64, lr=0.004, layer_lr=0.001, n_ssm=None,
                               train_steps=500_000, warmup=50_000, epochs=200, dropout=0.0,
                               d_state=64, deviations=_S4_PIXELS),
    ("s4d", "pathx"): _s4("pathx", "pathx", layers=6, width=256, prenorm=True, batch=16,
                          lr=0.001, layer_lr=0.001, n_ssm=None, train_steps=500_000,
                          warmup=50_000, epochs=50, dropout=0.0, d_state=64, dt_min=1e-4,
                          deviations=_S4_PIXELS),
    **{("s5", task): _s5(task) for task in _S5_SCRIPTS},
    **{("mega", task): _mega(task) for task in _MEGA_ROWS},
}


def recipe(model: str, task: str) -> dict[str, Any]:
    """The recipe of `model` on `task`; ConfigError naming the ones there are."""
    if (model, task) not in RECIPES:
        have = sorted({m for m, _ in RECIPES})
        tasks = sorted(t for m, t in RECIPES if m == model)
        where = (f"{model} has recipes for {', '.join(tasks)}" if tasks
                 else f"recipes exist for {', '.join(have)}")
        raise ConfigError(f"no published recipe for model={model} on task={task} (the "
                          f"`paper` config argument); {where}")
    return RECIPES[(model, task)]


def apply_recipe(c: ml_collections.ConfigDict) -> None:
    """Sets c's fields, block and parameter groups to the paper's recipe for c.model on
    c.task, and c.recipe to its source; `common.finalize` then merges the recipe's
    model_hparams over the presets it rescales (the recipes are for the full-size task
    lengths)."""
    r = recipe(c.model, c.task)
    for key, value in r["fields"].items():
        c[key] = value
    for key, value in r["block"].items():
        c.block[key] = value
    c.param_groups = ml_collections.ConfigDict(r["param_groups"])
    c.recipe = r["source"]
