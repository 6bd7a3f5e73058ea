r"""Path-X (LRA): Pathfinder at 128x128, i.e. 16,384 pixel tokens (2 classes).

LRA's setting (the default here): the `hard` level, batch 64, lr 1e-3 with
`constant * linear_warmup * cosine_decay`, gradient clipping at norm 1, emb 32 / 2 heads /
1 layer / qkv 16 / mlp 32, MEAN pooling. LRA does not list Path-X's step count; this uses
Pathfinder's 200 epochs of 160k images at batch 64 (500,000 steps). Every LRA model failed
Path-X (chance accuracy).

  python -m lra.tasks.pathfinder --output_dir=data/pathx --resolution=128 \
      --difficulty=hard --num_images=200000 --workers=2
  # or LRA's own images: python -m lra.download pathx  (data/pathx/pathfinder128/)
  python launch.py --config=configs/pathx.py:model=transformer \
      --workdir=workdirs/pathx/transformer

Arguments after the colon (comma separated):
  model=<name>   any name in models.registry.available() (default transformer)
  pretrain       self-pretraining on the task's own training inputs: 50% of the tokens
                 masked and predicted (L1 on the pixel intensity); then fine-tune with the same
                 arguments minus `pretrain` and --config.init_from=<its workdir>
                 (README, "Self-pretraining")
  causal         a causal encoder, MEAN pooling; with `pretrain`: next-token prediction
  mini           Path-X's difficulty at a CPU-sized length: 64x64 images (4096 tokens) of
                 the `easy` level, LRA's Path-X model, 2000 steps of batch 16; meant for the
                 efficient variants (full attention at 4096 is slow on a CPU):
                   python -m lra.tasks.pathfinder --output_dir=data/pathfinder_mini \
                       --resolution=64 --difficulty=easy --num_images=20000
  runlocal       tiny model on 32x32 images (task_options.resolution=32, max_length 1024),
                 20 steps of batch 8: about a minute on 2 CPU cores. 128x128 images are
                 too long for a CPU smoke test.
"""
from configs import common

EPOCH_STEPS = 160_000 // 64


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, model="transformer", runlocal=False, mini=False,
                           pretrain=False, causal=False)
    c = common.base_config(task="pathx", model=arg.model)
    c.task_options.resolution = 128
    c.task_options.difficulty = "hard"
    c.max_length = 128 * 128
    c.batch_size = 64
    c.learning_rate = 1e-3
    c.factors = "constant * linear_warmup * cosine_decay"
    c.grad_clip_norm = 1.0
    c.warmup = EPOCH_STEPS
    c.num_train_steps = 200 * EPOCH_STEPS
    c.eval_frequency = EPOCH_STEPS
    c.checkpoint_freq = EPOCH_STEPS
    c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 1, 16, 32
    c.pooling = "MEAN"

    if arg.mini:
        c.data_dir = "data/pathfinder_mini"
        c.task_options.resolution = 64
        c.task_options.difficulty = "easy"
        c.max_length = 64 * 64
        common.apply_mini(c, num_train_steps=2000, warmup=200, eval_frequency=250)
        c.batch_size = 16
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 1, 16, 32
    if arg.runlocal:
        c.task_options.resolution = 32
        c.max_length = 32 * 32
        common.apply_runlocal(c)
    common.apply_objective_args(c, arg)
    return common.finalize(c)
