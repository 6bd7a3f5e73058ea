r"""Pathfinder (LRA): are the two circles in a 32x32 image joined by one contour? (2 classes)

LRA's setting (the default here): the `hard` level (contour length 14), 1024 pixel tokens,
batch 512, lr 1e-3 with `constant * linear_warmup * cosine_decay`, 200 epochs of the 160k
training images (312 steps an epoch: 62,400 steps; warmup one epoch), no weight decay,
emb 32 / 4 heads / 4 layers / qkv 16 / mlp 32, dropout 0.2 (attention 0.1), MEAN pooling.
Splits: 80/10/10 of one difficulty folder.

  python -m lra.tasks.pathfinder --output_dir=data/pathfinder --resolution=32 \
      --difficulty=hard --num_images=200000 --workers=2
  python launch.py --config=configs/pathfinder.py:model=transformer \
      --workdir=workdirs/pathfinder/transformer

LRA's release works too: --config.data_dir=<...>/lra_release (the folder holding
pathfinder32/), and so does the original generator's own output (drewlinsley/pathfinder;
its np.save'd metadata is read unchanged). The generator here draws what the original
draws (dashed, crossing contours; see lra/tasks/pathfinder_generator.py; its speed:
docs/tasks_and_data.md). Other levels and sizes:
--config.task_options.difficulty=easy|intermediate, --config.task_options.resolution=64
--config.max_length=4096.

Arguments after the colon (comma separated):
  model=<name>   any name in models.registry.available() (default transformer)
  pretrain       self-pretraining on the task's own training inputs: 50% of the tokens
                 masked and predicted (L1 on the pixel intensity); then fine-tune with the same
                 arguments minus `pretrain` and --config.init_from=<its workdir>
                 (docs/pretraining.md)
  causal         a causal encoder, MEAN pooling; with `pretrain`: next-token prediction
  runlocal       tiny model, 20 steps of batch 8: about a minute on 2 CPU cores
  mini           the `easy` level (contour length 6) of 20k generated 32x32 images, a
                 32-wide 2-layer model, 3000 steps of batch 32. It does not separate
                 variants on a CPU budget: Pathfinder sits at chance for long (its
                 measured runs and times: docs/tasks_and_data.md, "LRA's minis on a
                 CPU"). Use it to check a variant trains end to end; comparisons need the
                 full config on an accelerator:
                   python -m lra.tasks.pathfinder --output_dir=data/pathfinder_mini \
                       --resolution=32 --difficulty=easy --num_images=20000
                   python launch.py --config=configs/pathfinder.py:mini \
                       --workdir=workdirs/pathfinder_mini/transformer
  locality       the task's locality baseline: one layer of `local_2d` attention whose
                 positions see a 3x3 patch (the pixel, the two rows above it and one
                 column on each side), rotary positions, MEAN pooling; the rest as above
                 (with `mini`: at mini's sizes). Whether the two circles are joined cannot
                 be read off 3x3 patches: its accuracy above chance measures what the
                 images give away locally. Its row in lra.report is `locality baseline`
                 (configs/common.py apply_locality; lra.sweep --locality_baseline)
  paper          the variant's own published LRA recipe (configs/recipes.py): s4d, s5, mega

Any field can be overridden: `--config.learning_rate=0.01`.

Where each full-size value comes from (`get_config("model=transformer")`; values as JSON;
tests/test_protocol.py checks every row against the config, so the two cannot drift):

  field                           | value           | source
  max_length                      | 1024            | [P] 32 x 32 pixels
  batch_size                      | 512             | [C]
  learning_rate                   | 0.001           | [C]
  factors                         | "constant * linear_warmup * cosine_decay" | [C]
  warmup                          | 312             | [C] one epoch, 160000 // 512
  num_train_steps                 | 62400           | [C] 200 epochs
  steps_per_cycle                 | 0               | ours (see 6.)
  weight_decay                    | 0.0             | [C]
  adam_b1                         | 0.9             | [T] create_optimizer
  adam_b2                         | 0.98            | [T] create_optimizer
  adam_eps                        | 1e-09           | [T] create_optimizer
  grad_clip_norm                  | 0.0             | [C] None: no clipping
  emb_dim                         | 32              | [X] (see 1.)
  num_heads                       | 4               | [X] (see 1.)
  num_layers                      | 4               | [X] (see 1.)
  qkv_dim                         | 16              | [X] (see 1.)
  mlp_dim                         | 32              | [X] (see 1.)
  pooling                         | "MEAN"          | [C] classifier_pool
  dropout_rate                    | 0.2             | [X]
  attention_dropout_rate          | 0.1             | [C]
  pos_emb                         | "learned"       | ours (see 3.)
  task_options.resolution         | 32              | [C] pathfinder32
  task_options.difficulty         | "hard"          | ours (see 2.)
  num_eval_steps                  | -1              | ours (see 5.)
  eval_frequency                  | 312             | [C] once an epoch
  checkpoint_freq                 | 312             | ours (no effect)
  random_seed                     | 0               | [C]
  data_dir                        | "data/pathfinder" | ours

  [C] google-research/long-range-arena,
      lra_benchmarks/image/configs/pathfinder32/base_pathfinder32_config.py at commit
      6d5e5ca277f11c851085672423ca8473c6272aa8 (2020-10-23, the first release; at the
      newest commit, cd31e5c6b8e5bceabd28de2d2afb23f7ae5d36d8, only the license header
      differs).
  [X] the same repository, lra_benchmarks/image/configs/pathfinder32/transformer_base.py
      at commit ee6649e0c5cabab560aa5e21be5b910d78c1b5a8 (2021-08-29; unchanged at
      cd31e5c6).
  [T] the same at cd31e5c6, lra_benchmarks/image/train.py: optim.Adam(beta1=0.9,
      beta2=0.98, eps=1e-9, weight_decay=config.weight_decay); the test split evaluated
      once, after the last step, with the final weights.
  [P] the same, lra_benchmarks/image/input_pipeline.py get_pathfinder_base_datasets:
      one level's TFDS split, [:80%] / [80%:90%] / [90%:], PNG decoded to integer tokens
      0..255 (no normalisation for transformer models), flattened row by row; levels in
      lra_benchmarks/data/pathfinder.py: easy = curv_baseline, intermediate =
      curv_contour_length_9, hard = curv_contour_length_14, with the generator settings
      listed there for 32 x 32.
  The data: LRA's release or our generator, which draws what the original draws with
  those settings (lra/tasks/pathfinder.py, lra/tasks/pathfinder_generator.py).

Where LRA's code, configs and history disagree, and what this config does:
  1. Model size: the first release's transformer_base.py (6d5e5ca) had 1 layer, 4 heads,
     emb 128, qkv 64, mlp 128; ee6649e (2021-08-29) set 4 layers, 4 heads, emb 32, qkv
     16, mlp 32 (dropout 0.2 in both). We follow ee6649e.
  2. Level: LRA's configs do not name it: train.py's --task_name chooses
     pathfinder32_easy, _inter or _hard (lra_benchmarks/image/task_registry.py). We use
     hard (contour length 14), the level later papers report: S4's loader reads
     curv_contour_length_14 only (state-spaces/s4 at
     ab287c63f4938a76d06a6b6868ee4a7163b50b05, src/dataloaders/lra.py PathFinderDataset).
     --config.task_options.difficulty=easy|intermediate for the others; the resolution
     is 32 (Path-X, 128: configs/pathx.py).
  3. Positions: pathfinder32's base config sets learn_pos_emb=False, a fixed sinusoidal
     table, unlike the Image and Path-X configs. LRA issue #60 (2023-09-25): transformer
     at about 50% with the fixed table, about 70% with a learned one. Ours is a learned
     table (the registry's Capabilities.pos_emb for transformer);
     --config.pos_emb=sinusoidal gives LRA's.
  4. Runs stuck at chance: LRA issue #37 (2021-08-31) ran pathfinder32 five times; three
     stayed at loss 0.6933 (ln 2) to the end, two reached 75% (bigbird): the outcome
     depends on the seed. lra.report counts such runs as not converged (training loss
     never below 98% of ln 2, or test accuracy within a point of the majority class) and
     shows converged seeds / seeds per cell, with the mean over both.
  5. Evaluation: LRA validates with num_eval_steps 39 (20000 // 512: 19,968 of the
     20,000 validation images) and tests the final weights; we evaluate the whole
     validation split and test the best-on-validation weights once. Our splits are
     80/10/10 of the level's folder in metadata order (the same sizes as LRA's, not the
     same images: TFDS keeps its own order).
  6. Cosine period: LRA sets steps_per_cycle to all 62,400 steps (the last step keeps
     6e-5 of the peak rate); ours (0) is num_train_steps - warmup, reaching 0 at the last
     step, and follows `mini` and --config.num_train_steps overrides.
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
    c.weight_decay = 0.0
    c.dropout_rate = 0.2

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
