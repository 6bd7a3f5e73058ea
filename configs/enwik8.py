r"""enwik8: byte-level language modelling on Wikipedia (lra/tasks/enwik8.py: sources, split,
tokens, rows), bits per byte on the test split. Also the same reader on a Wikipedia dump
excerpt (gensim's test file): everything runs on real text on this CPU.

  python launch.py --config=configs/enwik8.py:model=transformer_xl,mini \
      --config.data_dir=data/enwik8 --workdir=workdirs/enwik8_mini/transformer_xl
  python launch.py --config=configs/enwik8.py:model=gla,runlocal --config.data_dir=... \
      --workdir=/tmp/enwik8_runlocal
  configs/text8.py: the same for text8 (27 characters, bits per character).

Arguments after the colon (comma separated):
  model=<name>   any causal variant (default transformer)
  mini           a CPU-sized setting: rows of 128 bytes, 64 wide, 2 layers (4 heads,
                 feed-forward 128), batch 32, 2,000 steps at lr 1e-3 (100 warm-up, cosine),
                 validation on 32 batches every 500 steps; the test split whole
  runlocal       a smoke test in seconds: rows of 32, 32 wide, 1 layer
  hybrid=<mixer> a hybrid stack (configs/hybrid.py)

The default is Transformer-XL base's enwik8 setting (kimiyoung/transformer-xl
pytorch/run_enwik8_base.sh; its flags and where ours differ: docs/tasks_and_data.md,
"enwik8's default beside Transformer-XL base"): 12 layers, width 512 (qkv 512 = 8 x 64),
feed-forward 2048, dropout 0.1, attention dropout 0, Adam lr 2.5e-4 without warm-up,
cosine to 0 over 400,000 steps of batch 22, rows of 512 bytes, gradient clipping 0.25.
"""
from configs import common, hybrid
from lra.errors import ConfigError

CORPUS = "enwik8"


def get_config(arg: str | None = None, corpus: str = CORPUS):
    arg = common.parse_arg(arg, model="transformer", runlocal=False, mini=False)
    given = [name for name in ("paper", "locality", "pretrain", "causal") if arg.get(name)]
    if given:
        raise ConfigError(f"config argument(s) {', '.join(map(repr, given))}: {corpus} is "
                          "next-token prediction already (causal); it has no published "
                          "recipe or locality baseline in this lab")
    c = common.base_config(task=corpus, model=arg.model)
    c.objective = "causal_lm"
    c.causal = True
    c.lm_loss = "xent"
    c.pooling = "MEAN"
    c.max_length = 512
    c.num_layers, c.emb_dim, c.qkv_dim, c.num_heads, c.mlp_dim = 12, 512, 512, 8, 2048
    c.dropout_rate, c.attention_dropout_rate = 0.1, 0.0
    c.learning_rate = 2.5e-4
    c.factors = "constant * cosine_decay"
    c.warmup = 0
    c.weight_decay = 0.0
    c.grad_clip_norm = 0.25
    c.batch_size = 22
    c.num_train_steps = 400_000
    c.eval_frequency = c.checkpoint_freq = 4000
    c.log_every_steps = 200
    if arg.mini:
        common.apply_mini(c, num_train_steps=2000, warmup=100, eval_frequency=500)
        c.max_length = 128
        c.learning_rate = 1e-3
        c.factors = "constant * linear_warmup * cosine_decay"
    if arg.runlocal:
        common.apply_runlocal(c)
        c.max_length = 32
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 1, 32, 64
    common.apply_attention_impl(c, arg)
    if arg.get("hybrid"):  # hybrid=<mixer>: that mixer's presets in config.hybrid
        hybrid.apply_arg(c, arg.hybrid)
    return common.finalize(c)
