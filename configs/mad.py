r"""MAD's synthetic tasks (Poli et al. 2024, athms/mad-lab) as tasks of the loop: objective
`sequence_labels` (loss and accuracy at the labelled positions only), a causal model, the
data generated on the fly by lra/tasks/mad.py (MAD's instance functions, rows identical to
MAD's at the same seed; no files).

  python launch.py --config=configs/mad.py:task=in_context_recall,model=transformer \
      --workdir=workdirs/mad/in_context_recall/transformer
  python launch.py --config=configs/mad.py:task=selective_copying,model=gla,mini \
      --workdir=workdirs/mad_mini/selective_copying/gla
  # a difficulty setting of MAD's benchmark (configs/tasks/<task>.yml `changes`):
  python launch.py --config=configs/mad.py:task=in_context_recall \
      --config.task_options.vocab_size=64 --workdir=...
  python launch.py --config=configs/mad.py:task=in_context_recall \
      --config.max_length=256 --workdir=...            # seq_len is config.max_length

Arguments after the colon (comma separated):
  task=<name>    in_context_recall (default), fuzzy_in_context_recall,
                 noisy_in_context_recall, selective_copying, compression (MAD's
                 auto-encoder: models/autoencoder.py, the encoder of the variant, the row
                 decoded from the last position's output), memorization
  model=<name>   any causal variant of models.registry.available() (default transformer)
  mini           a 64-wide model on MAD's baseline data, 1,000 steps of batch 64, lr 1e-3
                 (cosine), validation on 8 batches every 250 steps (a measured run:
                 docs/tasks_and_data.md, "MAD beside mad-lab's benchmark")
  scaffold=<name> what every mixer shares (configs/scaffold.py): `mad` (default), MAD's
                 models (mad-lab benchmark.py at 0f49a45): no positions but in the
                 softmax-attention layers (transformer, local, nsa, moba: rotary, as
                 mh-attention), no short
                 convolution (the variants' own off), 16 heads (RetNet keeps 8),
                 mad-lab's initialisation (init mad, since 2026-12-07: torch's draw for
                 the Linears a layer leaves to torch, biases 0, embedding N(0, 0.02);
                 models/init_schemes.py); `own`: each variant's own (the runs before
                 2026-12-03)
  short_conv=<k> a shared short causal convolution of kernel k before every mixer
                 (scaffold.short_conv; default 0, none)
  runlocal       a smoke test in seconds: 64 / 16 / 16 examples (memorization: its 256
                 training rows), seq_len 32 (selective copying: 8 tokens to copy, since
                 16 need more than 33), 20 steps of batch 8, a 32-wide 1-layer model

The task settings are MAD's baseline (configs/tasks/<task>.yml, last changed in d27bf5c,
over mad/configs.py MADConfig's defaults at 35772e8): config.task_options holds them under
MAD's names (vocab_size, frac_noise, noise_vocab_size, num_tokens_to_copy, k_motif_size,
v_motif_size, multi_query, num_train_examples, num_test_examples 1,280, seed 12,345) and
num_valid_examples (ours: 1,280 test-like rows drawn after the test set; MAD monitors its
test set). results.json: `test_accuracy` per labelled position (micro),
`test_macro_accuracy` MAD's own metric (torchmetrics' MulticlassAccuracy, average='macro'
by default: the mean over classes of per-class accuracy; checked against torchmetrics
1.9.0), `test_example_accuracy` per example.

The default (ours; each setting beside MAD's own training: docs/tasks_and_data.md, "MAD
beside mad-lab's benchmark"): 2 layers of the variant, 128 wide, each with a GELU
feed-forward of 4 x 128 (pre-LN), 16 heads for the variants that take heads, positions as
MAD's layers have them (scaffold `mad`); batch 128, 200 epochs of
floor(num_train_examples / 128) steps, AdamW (b2 0.999, eps 1e-8) lr 5e-4, wd 0.0,
`constant * cosine_decay` per step to 0, float32, the early stop at 99.9% validation
accuracy (per position); the test takes the last step's weights (test_weights last) and
the batch-weighted mean of per-batch macro accuracies (macro_accuracy batch_mean),
test_pooled_macro_accuracy beside it; the seed is the data's too (data_seed_from_run).
"""
from configs import common, hybrid, scaffold
from configs.mqar import apply_sequence_labels, refuse_lra_args
from lra.errors import ConfigError

TASKS = ("in_context_recall", "fuzzy_in_context_recall", "noisy_in_context_recall",
         "selective_copying", "compression", "memorization")
BATCH, EPOCHS = 128, 200


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, task="in_context_recall", model="transformer",
                           short_conv=-1, scaffold="mad", runlocal=False, mini=False)
    refuse_lra_args(arg, "MAD")
    if arg.scaffold not in SCAFFOLDS:
        raise ConfigError(f"config argument scaffold={arg.scaffold!r}; choose one of "
                          f"{', '.join(SCAFFOLDS)} (configs/scaffold.py)")
    if arg.task not in TASKS:
        raise ConfigError(f"task={arg.task!r}; MAD's tasks here: {', '.join(TASKS)}")
    from lra.tasks import mad  # numpy only

    c = common.base_config(task=f"mad_{arg.task}", model=arg.model)
    apply_sequence_labels(c)
    b = mad.baseline(arg.task)
    o = c.task_options
    for key in mad.PARAMS:
        if key != "seq_len":
            o[key] = b[key]
    o.num_train_examples = b["num_train_examples"]
    o.num_test_examples = o.num_valid_examples = mad.NUM_TEST_EXAMPLES
    o.seed = mad.SEED
    # MAD's seed sets data and model (its train.py seeds both from one seed): the data's
    # seed is the run's (common.resolve writes random_seed into task_options.seed), so
    # lra.sweep --seeds varies both; 12,345, the default, is MAD's.
    # --config.data_seed_from_run=false holds the data at task_options.seed.
    c.data_seed_from_run = True

    c.max_length = b["seq_len"]
    c.emb_dim = c.qkv_dim = 128
    c.mlp_dim = 4 * 128
    c.num_layers, c.num_heads = 2, 16
    c.block.short_conv = max(arg.short_conv, 0)
    c.dropout_rate = c.attention_dropout_rate = 0.0
    c.batch_size = BATCH
    epoch = max(1, o.num_train_examples // BATCH)
    c.num_train_steps = EPOCHS * epoch
    c.eval_frequency = c.checkpoint_freq = max(epoch, 100)
    c.log_every_steps = max(1, min(epoch, 100) // 2)
    c.num_eval_steps = -1
    c.learning_rate = 5e-4
    c.factors = "constant * cosine_decay"
    c.warmup = 0
    c.weight_decay = 0.0
    c.adam_b1, c.adam_b2, c.adam_eps = 0.9, 0.999, 1e-8
    c.random_seed = mad.SEED
    # MAD's evaluation: its train.py tests the last epoch's weights, and its Lightning
    # wrapper logs the batch-size-weighted mean of each test batch's macro accuracy
    # (mad/model/pl_model_wrapper.py, self.log(..., on_epoch=True)). `pooled` / `best`
    # (one macro over the split, the best-on-validation checkpoint: ours before
    # 2026-12-03) remain as --config.macro_accuracy=pooled --config.test_weights=best.
    c.test_weights = "last"
    c.macro_accuracy = "batch_mean"
    # train.py's EarlyStopping(monitor='test/Accuracy_epoch', stopping_threshold=0.999):
    # training ends once the monitored accuracy reaches 99.9% (patience = epochs: no other
    # stop). Ours watches the validation split's per-position accuracy (test-like rows).
    c.early_stop_accuracy = 0.999

    if arg.mini:
        c.emb_dim = c.qkv_dim = 64
        c.mlp_dim, c.num_heads = 256, 4
        c.batch_size = 64
        c.num_train_steps = 1000
        c.eval_frequency = c.checkpoint_freq = 250
        c.log_every_steps = 125
        c.num_eval_steps = 8
        c.learning_rate = 1e-3
    if arg.runlocal:
        if arg.task != "memorization":
            o.num_train_examples = 64
        o.num_test_examples = o.num_valid_examples = 16
        c.max_length = 32
        if arg.task == "selective_copying":
            o.num_tokens_to_copy = 8
        common.apply_runlocal(c)
        c.emb_dim = c.qkv_dim = 32
        c.mlp_dim, c.num_heads, c.num_layers = 64, 2, 1
        c.warmup = 0
        c.learning_rate = 1e-3
    common.apply_attention_impl(c, arg)
    if arg.hybrid:  # hybrid=<mixer>: that mixer's presets in config.hybrid
        hybrid.apply_arg(c, arg.hybrid)
    c = common.finalize(c)
    if SCAFFOLDS[arg.scaffold] is not None:
        # The scaffold's heads at MAD's width; the smaller models keep their own.
        changes = {"num_heads": c.num_heads} if (arg.mini or arg.runlocal) else {}
        if arg.short_conv >= 0:
            changes["short_conv"] = arg.short_conv
        c = scaffold.declare(c, SCAFFOLDS[arg.scaffold], **changes)
    return c


# The config argument scaffold=: a declared scaffold, or None for each variant's own.
SCAFFOLDS = {"mad": scaffold.MAD, "own": None}
