r"""ListOps (LRA): 10-way classification of nested MIN/MAX/MED/SM expressions.

LRA's setting (the default here): 96k/2k/2k expressions of 500-2000 tokens, batch 32,
lr 0.05 with `constant * linear_warmup * rsqrt_decay` (warmup 1000), 5000 steps,
emb 512 / 8 heads / 4 layers / qkv 512 / mlp 1024, CLS pooling.

  python -m lra.tasks.listops --output_dir=data/listops
  python launch.py --config=configs/listops.py:model=transformer \
      --workdir=workdirs/listops/transformer

Arguments after the colon (comma separated):
  model=<name>   any name in models.registry.available() (default transformer)
  pretrain       self-pretraining on the task's own training inputs: 10% of the tokens
                 masked and predicted (cross-entropy); then fine-tune with the same
                 arguments minus `pretrain` and --config.init_from=<its workdir>
                 (README, "Self-pretraining")
  causal         a causal encoder, MEAN pooling; with `pretrain`: next-token prediction
  runlocal       tiny model and steps: about a minute on 2 CPU cores (smoke test)
  mini           small expressions and model that train in minutes on a laptop
                 (transformer: 0.08 s a step on one CPU core, 4 minutes a run):
                   python -m lra.tasks.listops --output_dir=data/listops_mini \
                       --num_train_samples=20000 --num_valid_samples=1000 \
                       --num_test_samples=1000 --min_length=10 --max_length=60 --max_depth=4
                   python launch.py --config=configs/listops.py:mini \
                       --workdir=workdirs/listops_mini/transformer
                 The variants' windows, blocks and chunks are scaled to the 64 tokens
                 (configs/presets.py): a window of 128 would be dense attention; ranks
                 (Linformer's k, inducing points, ...) keep their value, at most 16.

Sequences longer than `max_length` are truncated to their first `max_length` tokens, as
LRA does. Any field can be overridden: `--config.learning_rate=0.01`.
"""
from configs import common


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, model="transformer", runlocal=False, mini=False,
                           pretrain=False, causal=False)
    c = common.base_config(task="listops", model=arg.model)
    # Keep ']' as a token (LRA's alphanumeric tokenizer silently dropped it; set True to
    # reproduce LRA's inputs exactly).
    c.task_options.drop_close_bracket = False

    if arg.mini:
        c.data_dir = "data/listops_mini"
        c.max_length = 64
        c.batch_size = 32
        c.warmup = 200
        c.num_train_steps = 3000
        c.eval_frequency = 500
        c.checkpoint_freq = 500
        c.log_every_steps = 250
        # Dropout costs ~40% of a step on CPU (random bits) and a model this small on 20k
        # examples does not overfit within the run.
        c.dropout_rate = c.attention_dropout_rate = 0.0
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 64, 4, 2, 64, 128
    if arg.runlocal:
        c.max_length = 128
        common.apply_runlocal(c)
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 1, 32, 64
    common.apply_objective_args(c, arg)
    return common.finalize(c)
