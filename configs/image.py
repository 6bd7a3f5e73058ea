r"""Image (LRA): CIFAR-10 (10 classes) as 1024 grayscale pixel tokens.

LRA's setting (the default here): batch 256, lr 5e-4 with `constant * linear_warmup *
cosine_decay`, 200 epochs (45,000 training images / 256 = 175 steps an epoch, so 35,000
steps; warmup one epoch), emb 128 / 8 heads / 1 layer / qkv 64 / mlp 128, CLS pooling.
Validation = the last 5,000 training images (`--config.task_options.validation=test` uses
the test set, as some LRA reproductions do); see lra/tasks/image.py.

  # unpack cifar-10-python.tar.gz into data/image (data/image/cifar-10-batches-py/...)
  python launch.py --config=configs/image.py:model=transformer \
      --workdir=workdirs/image/transformer

Arguments after the colon (comma separated):
  model=<name>   any name in models.registry.available() (default transformer)
  pretrain       self-pretraining on the task's own training inputs: 50% of the tokens
                 masked and predicted (L1 on the pixel intensity); then fine-tune with the same
                 arguments minus `pretrain` and --config.init_from=<its workdir>
                 (README, "Self-pretraining")
  causal         a causal encoder, MEAN pooling; with `pretrain`: next-token prediction
  runlocal       tiny model, 20 steps of batch 8 (still 1024 pixels): about a minute on
                 2 CPU cores
  mini           a 32-wide 1-layer model (LRA's image model has 1 layer), 2000 steps of
                 batch 32 over the same 1024 pixels. One training step on one CPU core
                 (`lra.benchmark --task=image --config_arg=mini --lengths=1024`):
                 transformer 3.1 s (1.7 hours a run), linear 0.29 s (10 minutes): on a
                 CPU, for the efficient variants; full attention wants a GPU
"""
from configs import common

EPOCH_STEPS = 45_000 // 256


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, model="transformer", runlocal=False, mini=False,
                           pretrain=False, causal=False)
    c = common.base_config(task="image", model=arg.model)
    c.task_options.validation = "holdout"
    c.max_length = 1024
    c.batch_size = 256
    c.learning_rate = 5e-4
    c.factors = "constant * linear_warmup * cosine_decay"
    c.warmup = EPOCH_STEPS
    c.num_train_steps = 200 * EPOCH_STEPS
    c.eval_frequency = EPOCH_STEPS
    c.checkpoint_freq = EPOCH_STEPS
    c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 128, 8, 1, 64, 128
    c.pooling = "CLS"

    if arg.mini:
        common.apply_mini(c, num_train_steps=2000, warmup=100, eval_frequency=250)
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 4, 1, 32, 64
    if arg.runlocal:
        common.apply_runlocal(c)
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 1, 32, 64
    common.apply_objective_args(c, arg)
    return common.finalize(c)
