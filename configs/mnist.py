r"""MNIST (not an LRA task): 28x28 digits as 784 pixel tokens, row by row. Two settings:
sequential-MNIST classification (10 classes, the default) and, with `generation`, pixel
generation in bits/dim, the setting of Katharopoulos et al. 2020 ("Transformers are
RNNs", Section 4.2.1 and Table 1; issue 34).

  python -m lra.download mnist --data_dir=data          # data/mnist/*-ubyte.gz (11 MB)
  python launch.py --config=configs/mnist.py:model=transformer \
      --workdir=workdirs/mnist/transformer                # classification
  python launch.py --config=configs/mnist.py:model=linear,generation \
      --workdir=workdirs/mnist_gen/linear                 # generation, bits/dim
  python -m lra.generate --workdir=workdirs/mnist_gen/linear --num_samples=8
      # completions of test half-images: top half given, bottom half sampled (samples.png)

Data (lra/tasks/mnist.py): the original IDX files (gzipped or not) or a TFDS `mnist/3.0.1`
folder; train = the first 55,000 training images, val = the last 5,000
(`--config.task_options.num_validation=N`: the last N), test = the 10,000 t10k images.
Variant presets are Image's (configs/common.py PRESET_TASK), scaled from 1024 to 784
tokens.

Arguments after the colon (comma separated):
  model=<name>   any name in models.registry.available() (default transformer)
  generation     next-pixel prediction of the whole image (configs/common.py
                 apply_generation): objective causal_lm, a causal model, a start token so
                 that all 784 pixels are predicted, a 256-way softmax per pixel (lm_loss
                 xent). Validation and test report bits per token = bits/dim: the mean
                 over all 784 pixels of every image of -log2 p(pixel | the pixels before
                 it). The model: 8 layers, 8 heads, 256 wide, feed-forward 1024, lr 1e-4,
                 250 epochs (the paper's MNIST model, learning rate and epochs as we recall
                 its Section 4.2.1, not checked against its text here; its output is, as
                 recalled, a mixture of 10 logistics and its optimizer RAdam: here a 256-way
                 softmax and Adam), batch 32 (ours), no dropout.
  mini           with `generation`: a 32-wide 2-layer model (4 heads, feed-forward 64),
                 300 steps of batch 16, lr 2e-3 (cosine), validation on 8 batches every 100
                 steps, the whole test split; its runs on a CPU (times per variant,
                 bits/dim, the commands): results/cpu/pixel_generation.md.
                 Without `generation`: the task configs' mini (64-wide, 2 layers, batch
                 32), 1000 steps.
  runlocal       tiny model, 20 steps of batch 8 (still 784 pixels): about a minute on
                 2 CPU cores
  pretrain, causal, locality, paper: as in every task config (configs/image.py); MNIST
                 has no published recipes (`paper` is refused).

Classification (no `generation`), ours: Image's LRA recipe (configs/image.py) on MNIST's
pixels: emb 128 / 8 heads / 1 layer / qkv 64 / mlp 128, CLS pooling, batch 256, lr 5e-4
with `constant * linear_warmup * cosine_decay`, 200 epochs of 55,000 images (214 steps an
epoch: 42,800 steps; warmup one epoch), dropout 0.3 (attention 0.2), no weight decay.
"""
from configs import common

TRAIN_IMAGES = 55_000
EPOCH_STEPS = TRAIN_IMAGES // 256
GENERATION_BATCH = 32
GENERATION_EPOCH_STEPS = TRAIN_IMAGES // GENERATION_BATCH


def get_config(arg: str | None = None):
    arg = common.parse_arg(arg, model="transformer", runlocal=False, mini=False,
                           pretrain=False, causal=False, generation=False)
    c = common.base_config(task="mnist", model=arg.model)
    c.task_options.num_validation = 5000
    c.max_length = 784
    if arg.generation:
        common.apply_generation(c, arg)
        c.batch_size = GENERATION_BATCH
        c.learning_rate = 1e-4
        c.factors = "constant * linear_warmup"
        c.warmup = 1000
        c.num_train_steps = 250 * GENERATION_EPOCH_STEPS
        c.eval_frequency = c.checkpoint_freq = GENERATION_EPOCH_STEPS
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 256, 8, 8, 256, 1024
        c.weight_decay = 0.0
        c.dropout_rate = c.attention_dropout_rate = 0.0
    else:
        c.batch_size = 256
        c.learning_rate = 5e-4
        c.factors = "constant * linear_warmup * cosine_decay"
        c.warmup = EPOCH_STEPS
        c.num_train_steps = 200 * EPOCH_STEPS
        c.eval_frequency = c.checkpoint_freq = EPOCH_STEPS
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 128, 8, 1, 64, 128
        c.pooling = "CLS"
        c.weight_decay = 0.0
        c.dropout_rate, c.attention_dropout_rate = 0.3, 0.2

    if arg.mini:
        if arg.generation:
            common.apply_mini(c, num_train_steps=300, warmup=30, eval_frequency=100)
            c.batch_size, c.num_eval_steps, c.learning_rate = 16, 8, 2e-3
            c.factors = "constant * linear_warmup * cosine_decay"
            c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 4, 2, 32, 64
        else:
            common.apply_mini(c, num_train_steps=1000, warmup=100, eval_frequency=250)
    if arg.runlocal:
        common.apply_runlocal(c)
        c.emb_dim, c.num_heads, c.num_layers, c.qkv_dim, c.mlp_dim = 32, 2, 1, 32, 64
    if arg.paper:
        from lra.errors import ConfigError

        raise ConfigError("config argument 'paper': MNIST has no published recipes "
                          "(configs/recipes.py covers LRA's tasks)")
    common.apply_objective_args(c, arg)
    return common.finalize(c)
