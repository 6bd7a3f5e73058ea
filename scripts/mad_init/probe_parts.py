"""Probe (issue 68, results/cpu/mad_init_probe.md): which part of mad-lab's
initialisation moves a MAD cell. The run is the MAD mini (configs/mad.py:task=<task>,mini)
under one scheme (BASE: mad or own) with one part of its parameters taken from the other
scheme's build of the same seed:

  embedding  the token embedding table (mad: N(0, 0.02); own: N(0, 1))
  kernels    every Linear kernel (mad: torch's draw where a layer leaves it to torch,
             mad-lab's GLA's xavier 2^-2.5; own: LRA's xavier and the layers' own laws)
  biases     every Linear bias (mad: zero; own: the layers' own, e.g. Hyena's torch draw)

Everything else is BASE's. Nothing here is a scheme a config can name: a probe. Its
runs record BASE's config, so a report cannot tell them from BASE's own runs: keep their
WORKDIRs out of any folder a report reads (results/cpu/mad_init_probe.md uses
workdirs/mad_init_parts/).

    scripts/jax_env.sh run latest env PYTHONPATH=/repo \
        python scripts/mad_init/probe_parts.py WORKDIR TASK MODEL SEED BASE PART
"""
import sys

from flax import nnx

import lra.train
from configs import mad, scaffold
from lra.training import model as model_lib

PARTS = ("embedding", "kernels", "biases")
SCHEMES = ("mad", "own")


def config_for(task: str, model: str, seed: int, init: str):
    config = mad.get_config(f"task={task},model={model},mini")
    config.scaffold.init, config.scaffold.ablate = init, "init"
    config.random_seed = seed
    return scaffold.resolve(config)


def part_of(module, part: str) -> list[nnx.Param]:
    """The Params of `part` in `module` (one nnx node)."""
    if part == "embedding" and isinstance(module, nnx.Embed):
        return [module.embedding]
    if isinstance(module, nnx.Linear):
        if part == "kernels":
            return [module.kernel]
        if part == "biases" and module.bias is not None:
            return [module.bias]
    return []


def swap(built, other, part: str) -> int:
    """Copies `part` of `other` into `built` (the same architecture); the count copied."""
    others = dict((tuple(p), n) for p, n in nnx.iter_graph(other))
    copied = 0
    for path, module in nnx.iter_graph(built):
        for mine, theirs in zip(part_of(module, part), part_of(others[tuple(path)], part)):
            mine[...] = theirs[...]
            copied += 1
    return copied


def main(workdir: str, task: str, model: str, seed: int, base: str, part: str) -> None:
    other_scheme = SCHEMES[1 - SCHEMES.index(base)]
    build = model_lib.build_model

    def build_swapped(config, task_, spec=None):
        built = build(config, task_, spec)
        other = build(config_for(task, model, seed, other_scheme), task_)
        print(f"probe: {base} with the {part} of {other_scheme}: "
              f"{swap(built, other, part)} tensors", flush=True)
        return built

    lra.train.build_model = build_swapped  # lra.train builds every model through it
    lra.train.train_and_evaluate(config_for(task, model, seed, base), workdir)


if __name__ == "__main__":
    usage = ("usage: probe_parts.py WORKDIR TASK MODEL SEED BASE PART "
             f"(BASE: {'|'.join(SCHEMES)}; PART: {'|'.join(PARTS)})")
    if len(sys.argv) != 7 or sys.argv[5] not in SCHEMES or sys.argv[6] not in PARTS \
            or not sys.argv[4].isdigit():
        raise SystemExit(usage)
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6])
