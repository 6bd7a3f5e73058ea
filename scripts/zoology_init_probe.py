"""Probe (issue 68): the MQAR mini under Zoology's initialisation instead of ours.

Zoology's LanguageModel (HazyResearch/zoology d88d6f5 zoology/model.py, `_init_weights`,
applied to every module after the mixers are built) draws every nn.Linear weight and every
nn.Embedding table from N(0, 0.02), zeroes the biases, rescales the weights it names
out_proj / fc2 to N(0, 0.02 / sqrt(2 * n_layers)) and ties the LM head to the embedding.
Ours (models/layers.py) is LRA's: xavier-uniform kernels, which at width 64 have a standard
deviation of 0.125. This probe rebuilds our model with Zoology's draw for every nnx.Linear
and nnx.Embed (biases zero); it does not rescale any output projection (our layers are not
named as Zoology's) and does not tie the head: the first two of Zoology's four rules.

    scripts/jax_env.sh run latest env PYTHONPATH=/repo \
        python scripts/zoology_init_probe.py WORKDIR SEED MODEL [own] [lr=X]
    # own: our initialisation; lr=X: another learning rate than the mini's 3e-3

The probe's numbers (results/cpu/mqar_zoology_init_probe.md) were measured before the
scaffold declared an initialisation; the MQAR scaffold now declares Zoology's whole one
(configs/scaffold.py `init`, `tie_head`; models/init_schemes.py). The probe builds its
model with the scaffold's `init=own` and an untied head, as then, and redraws it itself,
so that it reproduces those numbers.
"""
import sys

import jax
import jax.numpy as jnp
from flax import nnx

import lra.train
from configs import mqar, scaffold
from lra.training import model as model_lib


def zoology_init(model, seed: int) -> None:
    """Every nnx.Linear kernel and nnx.Embed table N(0, 0.02), every Linear bias 0."""
    key = jax.random.key(1000 + seed)
    for _, module in nnx.iter_graph(model):
        if isinstance(module, nnx.Linear):
            key, sub = jax.random.split(key)
            kernel = module.kernel.value
            module.kernel.value = 0.02 * jax.random.normal(sub, kernel.shape, kernel.dtype)
            if module.bias is not None:
                module.bias.value = jnp.zeros_like(module.bias.value)
        elif isinstance(module, nnx.Embed):
            key, sub = jax.random.split(key)
            table = module.embedding.value
            module.embedding.value = 0.02 * jax.random.normal(sub, table.shape, table.dtype)


def main(workdir: str, seed: int, model: str, own: bool = False,
         learning_rate: float | None = None) -> None:
    if not own:
        build = model_lib.build_model

        def build_zoology(config, task, spec=None):
            built = build(config, task, spec)
            zoology_init(built, int(config.random_seed))
            return built

        lra.train.build_model = build_zoology  # lra.train builds every model through it
    lra.train.train_and_evaluate(config_for(model, seed, learning_rate), workdir)


def config_for(model: str, seed: int, learning_rate: float | None = None):
    """The probe's runs' config: the MQAR mini at L 128, with the scaffold's `init=own`
    and an untied head (the setting before the scaffold declared Zoology's)."""
    config = mqar.get_config(f"model={model},mini,seq_len=128")
    config.scaffold.init, config.scaffold.tie_head = "own", False
    config.random_seed = seed
    if learning_rate is not None:
        config.learning_rate = learning_rate
    return scaffold.resolve(config)


def parse(argv: list[str]) -> tuple:
    """(workdir, seed, model, own, learning_rate) from argv; SystemExit with the usage
    line for anything else."""
    usage = "usage: zoology_init_probe.py WORKDIR SEED MODEL [own] [lr=X]"
    if len(argv) < 4:
        raise SystemExit(usage)
    own, learning_rate = False, None
    try:
        seed = int(argv[2])
        for arg in argv[4:]:
            if arg == "own":
                own = True
            elif arg.startswith("lr="):
                learning_rate = float(arg[3:])
            else:
                raise ValueError(f"{arg!r}")
    except ValueError as e:
        raise SystemExit(f"{usage} (not understood: {e})")
    return argv[1], seed, argv[3], own, learning_rate


if __name__ == "__main__":
    workdir, seed, model, own, learning_rate = parse(sys.argv)
    main(workdir, seed, model, own=own, learning_rate=learning_rate)
