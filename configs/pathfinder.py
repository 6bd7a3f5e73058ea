r"""Pathfinder (LRA): are the two circles in a 32x32 image joined by one contour? (2 classes)

LRA's setting (the default here): the `hard` level (contour length 14), 1024 pixel tokens,
batch 512, lr 1e-3 with `constant * linear_warmup * cosine_decay`, 200 epochs of the 160k
training images (312 steps an epoch: 62,500 steps; warmup one epoch), emb 32 / 4 heads /
4 layers / qkv 16 / mlp 32, MEAN pooling. Splits: 80/10/10 of one difficulty folder.

  python -m lra.tasks.pathfinder --output_dir=data/pathfinder --resolution=32 \
      --difficulty=hard --num_images=200000 --workers=2
  python launch.py --config=configs/pathfinder.py:model=transformer \
      --workdir=workdirs/pathfinder/transformer

LRA's release works too: --config.data_dir=<...>/lra_release (the folder holding
pathfinder32/), and so does the original generator's own output (drewlinsley/pathfinder;
its np.save'd metadata is read unchanged). The generator here draws what the original
draws (dashed, crossing contours; see lra/tasks/pathfinder_generator.py), at about 60
images/s per core at 32x32 for `hard` (about an hour on 2 cores for 200k images). Other levels and sizes: --config.task_options.difficulty=easy|intermediate,
--config.task_options.resolution=64 --config.max_length=4096.

Arguments after the colon (comma separated):
  model=<name>   any name in models.registry.available() (default transformer)
  pretrain       self-pretraining on the task's own training inputs: 50% of the tokens
                 masked and predicted (L1 on the pixel intensity); then fine-tune with the same
                 arguments minus `pretrain` and --config.init_from=<its workdir>
                 (README, "Self-pretraining")
  causal         a causal encoder, MEAN pooling; with `pretrain`: next-token prediction
  runlocal       tiny model, 20 steps of batch 8: about a minute on 2 CPU cores
  mini           the `easy` level (contour length 6) of 20k generated 32x32 images (about
                 2 minutes to generate on one core), a 32-wide 2-layer model, 3000 steps of
                 batch 32. On this repository's 2-core CPU, shared, transformer ran 0.6
                 steps/s (3000 steps: about 1.5 hours). It does not separate variants on a
                 CPU budget: Pathfinder sits at chance for long (transformer: 50.4% test
                 accuracy after 600 steps, majority 50.4%; on the old, easier stimulus
                 linformer was at 51% after 3000 steps). Use it to check a variant trains
                 end to end; comparisons need the full config on an accelerator:
                   python -m lra.tasks.pathfinder --output_dir=data/pathfinder_mini \
                       --resolution=32 --difficulty=easy --num_images=20000
                   python launch.py --config=configs/pathfinder.py:mini \
                       --workdir=workdirs/pathfinder_mini/transformer
"""
from configs import common

EPOCH_STEPS = 160_000 // 512


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, model="transformer", runlocal=False, mini=False,
                           pretrain=False, causal=False)
    c = common.base_config(task="pathfinder", model=arg.model)
    c.task_options.resolution = 32
    c.task_options.difficulty = "hard"
    c.max_length = 32 * 32
    c.batch_size = 512
    c.learning_rate = 1e-3
    c.factors = "constant * linear_warmup * cosine_decay"
    c.warmup = EPOCH_STEPS
    c.num_train_steps = 200 * EPOCH_STEPS
    c.eval_frequency = EPOCH_STEPS
    c.checkpoint_freq = EPOCH_STEPS
    c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 4, 4, 16, 32
    c.pooling = "MEAN"

    if arg.mini:
        c.data_dir = "data/pathfinder_mini"
        c.task_options.difficulty = "easy"
        common.apply_mini(c, num_train_steps=3000, warmup=300, eval_frequency=500)
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 2, 32, 64
    if arg.runlocal:
        common.apply_runlocal(c)
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 1, 16, 32
    common.apply_objective_args(c, arg)
    return common.finalize(c)
