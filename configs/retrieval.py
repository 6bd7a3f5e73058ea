r"""Retrieval (LRA): do two AAN papers cite each other? Two byte sequences, dual encoder.

LRA's setting (the default here): byte-level tokens, max_length 4000 per document,
batch 32, lr 0.05 with `constant * linear_warmup * rsqrt_decay` (warmup 8000), 5000 steps,
emb 128 / 4 heads / 4 layers / qkv 128 / mlp 512, CLS pooling; both documents go through
one shared encoder and the head sees [x1, x2, x1 * x2, x1 - x2].

  # unpack lra_release.gz; data_dir = the folder with new_aan_pairs.{train,eval,test}.tsv
  python launch.py --config=configs/retrieval.py:model=transformer \
      --config.data_dir=lra_release/tsv_data --workdir=workdirs/retrieval/transformer

Arguments after the colon (comma separated):
  model=<name>   any name in models.registry.available() (default transformer)
  pretrain       self-pretraining on the task's own training inputs: 15% of the tokens
                 masked and predicted (cross-entropy; both documents); then fine-tune with the same
                 arguments minus `pretrain` and --config.init_from=<its workdir>
                 (README, "Self-pretraining")
  causal         a causal encoder, MEAN pooling; with `pretrain`: next-token prediction
  runlocal       tiny model, 128 bytes per document, 20 steps: about a minute on 2 CPU cores
  mini           the first 256 bytes of each document, a 64-wide 2-layer model, 2000 steps
                 of batch 32 (same data folder). One training step on one CPU core
                 (`lra.benchmark --task=retrieval --config_arg=mini --lengths=256`):
                 transformer 1.14 s, linear 0.55 s, i.e. 38 and 18 minutes a run
"""
from configs import common


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, model="transformer", runlocal=False, mini=False,
                           pretrain=False, causal=False)
    c = common.base_config(task="retrieval", model=arg.model)
    c.max_length = 4000
    c.batch_size = 32
    c.learning_rate = 0.05
    c.warmup = 8000
    c.num_train_steps = 5000
    c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 128, 4, 4, 128, 512
    c.pooling = "CLS"

    if arg.mini:
        c.max_length = 256
        common.apply_mini(c, num_train_steps=2000, warmup=200, eval_frequency=250)
    if arg.runlocal:
        c.max_length = 128
        common.apply_runlocal(c)
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 1, 32, 64
    common.apply_objective_args(c, arg)
    return common.finalize(c)
