"""How much a decoding cache holds, per causal variant: the arrays `init_cache` allocates.

  python -m lra.cache_memory --task=listops --lengths=1024,2048,4096
  python -m lra.cache_memory --models=transformer,local,linear --lengths=512,8192 --args=mini
  python -m lra.cache_memory --models=gla,gla+transformer@1 --args=mini    (a hybrid)

Builds each causal variant's `causal_lm` model from `configs/<task>.py:model=<name>,causal,
pretrain[,<args>]` (the presets, block and stack a user gets; abstractly: nothing is
computed or allocated) at every max_length, takes the shapes of `model.init_cache(1)`
and prints, per variant, its decoding form, the cache bytes of one sequence (all layers)
at each length, and the bytes each further cached token adds, (bytes(L_max) -
bytes(L_min)) / (L_max - L_min): 0 for a recurrent state or a full ring, 2 x layers x
qkv_dim x 4 for a kv cache. A markdown table, for results/cpu/.
"""
from __future__ import annotations

import sys

import jax
import numpy as np
from absl import app, flags

from lra.runs import cli

FLAGS = flags.FLAGS


def cache_bytes(model, batch: int = 1) -> int:
    """Bytes of the arrays `model.init_cache(batch)` allocates, computed from shapes only."""
    shapes = jax.eval_shape(lambda: model.init_cache(batch))
    return int(sum(np.prod(s.shape) * s.dtype.itemsize for s in jax.tree.leaves(shapes)))


def config_for(task: str, name: str, args: str):
    """The causal_lm config of `name`: a variant, or a hybrid's name such as
    `gla+transformer@1` (configs/hybrid.py; layers at the config's num_layers)."""
    import importlib

    from configs import hybrid

    module = importlib.import_module(f"configs.{task}")
    config = module.get_config(",".join(a for a in (
        f"model={hybrid.base_of(name)},causal,pretrain", args) if a))
    hybrid.apply_name(config, name)
    return config


def measure(task_name: str, args: str, models: list[str], lengths: list[int]) -> list[dict]:
    """One row per model: form, bytes per sequence at each length, bytes per token."""
    from flax import nnx

    import lra.tasks
    from configs import hybrid
    from lra import train

    task = lra.tasks.get(task_name)
    rows = []
    for name in models:
        sizes = []
        for length in lengths:
            c = config_for(task_name, name, args)
            c.max_length = length
            model = nnx.eval_shape(lambda c=c: train.build_model(c, task))
            sizes.append(cache_bytes(model))
        per_token = (sizes[-1] - sizes[0]) / max(lengths[-1] - lengths[0], 1)
        rows.append({"model": name, "form": hybrid.decode_forms(c),
                     "bytes": sizes, "per_token": per_token})
    return rows


def mixers_of(model: str) -> list[str]:
    """The mixers a --models entry names: itself, or a hybrid's (gla+transformer@1)."""
    from configs import hybrid

    if not hybrid.is_name(model):
        return [model]
    base, others = hybrid.parse_name(model)
    return [base, *(m for m, _ in others)]


def table(rows: list[dict], lengths: list[int]) -> str:
    head = ("| model | form | " + " | ".join(f"cache at {n}" for n in lengths)
            + " | bytes per further token |")
    lines = [head, "|" + "---|" * (3 + len(lengths))]
    for r in rows:
        cells = " | ".join(f"{b / 2**20:.2f} MiB" for b in r["bytes"])
        lines.append(f"| {r['model']} | {r['form']} | {cells} | {r['per_token']:.0f} |")
    return "\n".join(lines)


def main(argv):
    del argv
    from lra.errors import UserError
    from models import registry

    config = config_for(FLAGS.task, "transformer", FLAGS.args)
    from configs import hybrid

    causal = [n for n in registry.available() if registry.capabilities(n).causal]
    models = causal if FLAGS.models == ["all"] else hybrid.split_models(FLAGS.models)
    unknown = [m for m in models if not set(mixers_of(m)) <= set(causal)]
    if unknown:
        raise UserError(f"--models: {', '.join(unknown)} not causal variants (or unknown); "
                        f"causal: {', '.join(causal)}")
    try:
        lengths = sorted(int(n) for n in FLAGS.lengths)
    except ValueError:
        lengths = []
    if not lengths or lengths[0] < 2:  # a CLS slot and one token at least
        raise UserError(f"--lengths={','.join(FLAGS.lengths)}: give integers of at least 2")
    print(f"decoding cache of one sequence, task {config.task}, emb {config.emb_dim}, "
          f"{config.num_layers} layers, {config.num_heads} heads, qkv {config.qkv_dim}",
          flush=True)
    print(table(measure(FLAGS.task, FLAGS.args, models, lengths), lengths))


def run() -> None:
    flags.DEFINE_enum("task", "listops", ["listops", "text", "retrieval", "image",
                                          "pathfinder", "pathx"], "Task config.")
    flags.DEFINE_string("args", "", "More config arguments, e.g. 'mini'.")
    flags.DEFINE_list("models", ["all"], "Causal variants, or 'all'; a hybrid by its name, "
                      "e.g. gla+transformer@1 (configs/hybrid.py).")
    flags.DEFINE_list("lengths", ["1024", "2048", "4096"], "max_length values.")
    try:
        app.run(main, flags_parser=cli.parse_flags_or_refuse)
    except Exception as e:  # noqa: BLE001
        from lra.errors import UserError

        if isinstance(e, UserError):
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    run()
