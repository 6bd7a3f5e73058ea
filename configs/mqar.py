r"""MQAR, multi-query associative recall (Arora, Eyuboglu et al. 2023, "Zoology"), as a task
of the loop: objective `sequence_labels` (loss and accuracy at the queried positions only),
a causal model, the data generated on the fly by `lra.tasks.mqar.generate` (no files).

  python launch.py --config=configs/mqar.py:model=transformer,seq_len=128,d_model=64 \
      --workdir=workdirs/mqar/transformer-L128-d64
  python launch.py --config=configs/mqar.py:model=gla,mini --workdir=workdirs/mqar_mini/gla
  python -m lra.tasks.mqar --seq_len=64 --num_kv_pairs=4 --random_non_queries=false
      # prints a few rows (labels: '.' = ignored) and their statistics

results.json: `test_accuracy` is per queried position, `test_example_accuracy` per
example (all its queries right), `majority_baseline_accuracy` the most frequent training
label's share of the test labels.

Arguments after the colon (comma separated):
  model=<name>      any causal variant of models.registry.available() (default transformer)
  seq_len=<L>       64 (default), 128, 256, 512: figure 2's lengths
  num_kv_pairs=<n>  default: figure 2's for the length (64: 4, 128: 8, 256: 16, 512: 64;
                    others L / 16)
  d_model=<d>       the width (emb_dim = qkv_dim), default 128 (mini: 64); figure 2
                    sweeps 64, 128, 256, 512
  mini              a CPU-sized setting: L 64 (seq_len=), 4 pairs, V 256 (512 at L 256,
                    2 L from there: Zoology asserts V > L), d_model 64, 20,000 train /
                    500 validation / 1,000 test examples, batch 64, 1,200 steps (from L 256
                    on 3,600 with Zoology's early stop at 99% validation accuracy), lr 3e-3
                    (cosine), validation every 300 steps; its measured accuracies and why
                    V is not 8,192: docs/tasks_and_data.md ("MQAR beside Zoology's figure
                    2"); scripts/mqar_scaffold_grid.sh runs the controlled grid
  scaffold=<name>   what every mixer shares (configs/scaffold.py): `zoology` (default),
                    Zoology's MQAR models (models_repo.py at d88d6f5): no positions in any
                    layer, one shared short convolution of 3 taps before every mixer, the
                    variants' own short convolutions off, 2 heads (RetNet keeps its 8:
                    its decays live in its heads), no MLP, Zoology's initialisation
                    (zoology/model.py _init_weights; models/init_schemes.py) and its LM
                    head tied to the embedding (both since 2026-12-07: the runs before
                    are `--config.scaffold.init=own --config.scaffold.tie_head=False`).
                    `own`: each variant's own positions, convolutions, initialisation
                    and the config's 1 head, the setting of the runs before 2026-12-03
                    (results/cpu/mqar_grid.md's first tables);
                    a report does not rank its cells against each other where their
                    scaffolds differ. Per field: --config.scaffold.short_conv=0 etc.
  short_conv=<k>    the shared short causal depthwise convolution's taps (block.short_conv,
                    zoology/mixers/convolution.py ShortConvolution): with scaffold=zoology
                    its scaffold.short_conv (default 3; 0 = none), with `own` the block's
                    (default 0); results.json records it (`short_conv`, `scaffold_card`)
  runlocal          a smoke test in seconds: L 32, 2 pairs, V 128 (2 L from L 64),
                    d_model 32, 20 steps of batch 8, 256 / 32 / 32 examples; a seq_len=,
                    num_kv_pairs= or d_model= given with it is kept (seq_len alone brings
                    figure 2's pairs for it)

The full-size setting follows Zoology's figure 2 (data, model and training, each beside
Zoology's own: docs/tasks_and_data.md, "MQAR beside Zoology's figure 2").
"""
from configs import common, hybrid, scaffold
from lra.errors import ConfigError
from lra.tasks import mqar as mqar_task

# Figure 2's (input_seq_len, num_kv_pairs) and batch size per length.
FIGURE2_KV = {64: 4, 128: 8, 256: 16, 512: 64}
FIGURE2_BATCH = {64: 512, 128: 512, 256: 256, 512: 128, 1024: 64}
NUM_TRAIN, NUM_TEST, EPOCHS = 100_000, 3_000, 64
LR_GRID = (1e-4, 4.641588833612782e-4, 2.1544346900318843e-3, 1e-2)  # np.logspace(-4, -2, 4)


def apply_sequence_labels(c) -> None:
    """What every synthetic token task shares: the task's own label per position
    (objective sequence_labels, a softmax over the vocabulary), a causal model (MEAN
    pooling: no CLS slot, which a causal model refuses)."""
    c.objective = "sequence_labels"
    c.lm_loss = "xent"
    c.causal = True
    c.pooling = "MEAN"
    c.data_dir = ""  # generated on the fly from config.task_options


def refuse_lra_args(arg, task: str) -> None:
    """`paper`, `locality` (every task config's shared arguments) mean nothing here."""
    given = [name for name in ("paper", "locality") if arg.get(name)]
    if given:
        raise ConfigError(f"config argument(s) {', '.join(map(repr, given))}: {task} has no "
                          "published recipe or locality baseline in this lab")


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, model="transformer", seq_len=64, num_kv_pairs=0,
                           d_model=0, short_conv=-1, scaffold="zoology", runlocal=False,
                           mini=False)
    refuse_lra_args(arg, "MQAR")
    if arg.scaffold not in SCAFFOLDS:
        raise ConfigError(f"config argument scaffold={arg.scaffold!r}; choose one of "
                          f"{', '.join(SCAFFOLDS)} (configs/scaffold.py)")
    c = common.base_config(task="mqar", model=arg.model)
    apply_sequence_labels(c)
    L = arg.seq_len
    kv = arg.num_kv_pairs or FIGURE2_KV.get(L, max(1, L // 16))
    o = c.task_options
    o.vocab_size = 8192
    o.num_kv_pairs = kv
    o.power_a = 0.01
    o.random_non_queries = False
    o.num_train_examples, o.num_valid_examples, o.num_test_examples = (
        NUM_TRAIN, NUM_TEST, NUM_TEST)
    o.seed = 123  # DataConfig's: the splits are Zoology's own rows at this seed
    # The data's seed is the run's (common.resolve writes random_seed into
    # task_options.seed before the run is built): lra.sweep --seeds varies data and
    # initialisation together; random_seed 123, the default, is DataConfig's seed.
    # --config.data_seed_from_run=false holds the data at task_options.seed.
    c.data_seed_from_run = True

    c.max_length = L
    c.emb_dim = c.qkv_dim = arg.d_model or 128
    c.mlp_dim = 4 * c.emb_dim  # unused: block.ffn is off
    c.num_layers, c.num_heads = 2, 1
    c.block.ffn = False
    c.block.short_conv = max(arg.short_conv, 0)
    c.dropout_rate, c.attention_dropout_rate = 0.0, 0.1
    c.batch_size = FIGURE2_BATCH.get(L, 128)
    epoch = NUM_TRAIN // c.batch_size
    c.num_train_steps = EPOCHS * epoch
    c.eval_frequency = c.checkpoint_freq = epoch
    c.log_every_steps = max(1, epoch // 4)
    c.num_eval_steps = -1
    c.learning_rate = LR_GRID[2]
    c.factors = "constant * cosine_decay"
    c.warmup = 0
    c.weight_decay = 0.1
    c.adam_b1, c.adam_b2, c.adam_eps = 0.9, 0.999, 1e-8
    c.early_stop_accuracy = 0.99  # zoology/train.py: stop once valid accuracy > 0.99
    c.random_seed = 123

    if arg.mini:
        # 256, or from L 256 on twice L: Zoology asserts vocab_size > seq_len (the row's
        # random tokens come from the whole vocabulary), so V 256 cannot hold L 256.
        o.vocab_size = max(256, 2 * L)
        c.emb_dim = c.qkv_dim = arg.d_model or 64  # d_model= still sets the width
        c.mlp_dim = 4 * c.emb_dim
        o.num_train_examples, o.num_valid_examples, o.num_test_examples = 20_000, 500, 1_000
        c.batch_size = 64
        c.num_train_steps = 1200
        c.early_stop_accuracy = 0.0
        if L >= 256:
            # 16 pairs and more: attention forms the binding later than the 1,200 steps'
            # schedule allows (transformer at L 256: 6.2% test accuracy after 1,200
            # steps, 99.96% after 3,600, validation 99.86% at step 1,200 of those;
            # results/cpu/mqar_grid.md). Zoology's early stop spares the runs that recall
            # the steps they do not need.
            c.num_train_steps = 3600
            c.early_stop_accuracy = 0.99
        c.eval_frequency = c.checkpoint_freq = 300
        c.log_every_steps = 100
        c.learning_rate = 3e-3
        c.dropout_rate = c.attention_dropout_rate = 0.0
    if arg.runlocal:
        # A smoke test's sizes, where the arguments give none: runlocal,seq_len=128 runs
        # at L 128 with figure 2's pairs for it (a preset that overrode a given argument
        # ran another length than asked, silently).
        L = L if common.given(arg, "seq_len") else 32
        o.num_kv_pairs = arg.num_kv_pairs or (kv if common.given(arg, "seq_len") else 2)
        o.vocab_size = max(128, 2 * L)
        o.num_train_examples, o.num_valid_examples, o.num_test_examples = 256, 32, 32
        c.max_length = L
        common.apply_runlocal(c)
        c.emb_dim = c.qkv_dim = arg.d_model or 32
        c.mlp_dim = 64
        c.learning_rate = 3e-3
        c.warmup = 0
        c.dropout_rate = c.attention_dropout_rate = 0.0
    # Zoology's asserts on the sizes, here rather than when the data is made: a length or
    # pair count the task cannot hold is refused before anything is built.
    mqar_task.check(o.vocab_size, c.max_length, o.num_kv_pairs, 1, o.power_a)
    common.apply_attention_impl(c, arg)
    if arg.hybrid:  # hybrid=<mixer>: that mixer's presets in config.hybrid
        hybrid.apply_arg(c, arg.hybrid)
    c = common.finalize(c)
    if SCAFFOLDS[arg.scaffold] is not None:
        changes = {"short_conv": arg.short_conv} if arg.short_conv >= 0 else {}
        c = scaffold.declare(c, SCAFFOLDS[arg.scaffold], **changes)
    return c


# The config argument scaffold=: a declared scaffold, or None for each variant's own.
SCAFFOLDS = {"zoology": scaffold.ZOOLOGY_MQAR, "own": None}
