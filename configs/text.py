r"""Text (LRA): IMDB sentiment (2 classes) from raw bytes.

LRA's setting (the default here): byte-level tokens, max_length 1000 (the paper: 4000),
batch 32, lr 0.05 with `constant * linear_warmup * rsqrt_decay` (warmup 8000), 20000 steps,
emb 256 / 4 heads / 4 layers / qkv 256 / mlp 1024, CLS pooling. Validation = test split, as
in LRA (see lra/tasks/text.py).

  # unpack aclImdb_v1.tar.gz into data/text (data/text/aclImdb/{train,test}/{pos,neg})
  python launch.py --config=configs/text.py:model=transformer \
      --workdir=workdirs/text/transformer

Arguments after the colon (comma separated):
  model=<name>   any name in models.registry.available() (default transformer)
  pretrain       self-pretraining on the task's own training inputs: 15% of the tokens
                 masked and predicted (cross-entropy); then fine-tune with the same
                 arguments minus `pretrain` and --config.init_from=<its workdir>
                 (README, "Self-pretraining")
  causal         a causal encoder, MEAN pooling; with `pretrain`: next-token prediction
  runlocal       tiny model, 128 bytes and 20 steps: about a minute on 2 CPU cores
  mini           the first 256 bytes of each review, a 64-wide 2-layer model, 2000 steps of
                 batch 32 (same data folder). One training step on one CPU core (measured
                 with `lra.benchmark --task=text --config_arg=mini --lengths=256`):
                 transformer 0.57 s, linear 0.29 s, i.e. 19 and 10 minutes a run
"""
from configs import common


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, model="transformer", runlocal=False, mini=False,
                           pretrain=False, causal=False)
    c = common.base_config(task="text", model=arg.model)
    c.max_length = 1000
    c.batch_size = 32
    c.learning_rate = 0.05
    c.warmup = 8000
    c.num_train_steps = 20000
    c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 256, 4, 4, 256, 1024
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
