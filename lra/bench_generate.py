r"""Generation speed: time per generated token against the position, every causal variant.

  python -m lra.bench_generate --lengths=256,1024,3072,8192 --plot=results/cpu/generation_speed.png
  python -m lra.bench_generate --models=all --lengths=256,1024 --steps=16      (every variant)
  python -m lra.bench_generate --models=gla,gla+transformer@1 --lengths=256,1024  (a hybrid)

The Linear Transformer's Table 2 (Katharopoulos et al., our seed) for the whole catalogue.
For each model and length L: the `causal_lm` model of `configs/listops.py:model=<name>,
mini,causal,pretrain` built with max_length = L (sizes `--emb_dim` etc. replace the mini's
if given), random weights, a prompt of L - steps tokens prefilled, then `--steps` tokens
decoded by one jitted `jax.lax.scan` over `model.step` (the cache donated, no Python per
token): the time per token is that scan's median wall time over `--repeats` runs (after
compilation) divided by steps, i.e. the cost of a token at position ~L. Rows:
  transformer (no cache)  the paper's softmax baseline: every token runs the parallel
                          forward over the whole prefix (one forward of L tokens, timed)
  <name>                  the variant's decoding form (Capabilities.decode): a kv cache
                          (transformer), a window ring (local), a recurrent state (linear,
                          performer, rfa, fast_weight), ...
Columns: ms per token at each L, the growth exponent of that time from the first to the
last L (log t ratio / log L ratio: 0 = flat, 1 = linear in the position), the speed-up
over the cache-less and the kv-cached transformer at the last L, and the cache's size
(`lra.cache_memory.cache_bytes`) at each L. A kv cache of static shape attends over all
of its L slots (masked) at every step, as Flax's decode cache does. Markdown on stdout,
progress on stderr; `--plot` draws time per token against L (log-log).
"""
from __future__ import annotations

import math
import statistics
import sys
import time

from absl import app, flags

from lra.runs import cli

FLAGS = flags.FLAGS
NO_CACHE = "transformer (no cache)"
DEFAULT_MODELS = ["transformer", "local", "linear", "performer", "rfa", "fast_weight"]


def _define_flags() -> None:
    flags.DEFINE_list("models", DEFAULT_MODELS, "Causal variants, or 'all'; the cache-less "
                      "transformer row is always added; a hybrid by its name, e.g. "
                      "gla+transformer@1 (configs/hybrid.py).")
    flags.DEFINE_list("lengths", ["256", "1024", "3072", "8192"], "Positions L (max_length).")
    flags.DEFINE_integer("steps", 32, "Tokens decoded (timed) after a prompt of L - steps.")
    flags.DEFINE_integer("batch_size", 1, "Sequences generated at once.", lower_bound=1)
    flags.DEFINE_integer("repeats", 3, "Timed runs per cell (the median is reported).",
                         lower_bound=1)
    flags.DEFINE_integer("emb_dim", 0, "Width (0: the ListOps mini's, 64); qkv_dim follows.")
    flags.DEFINE_integer("num_layers", 0, "Layers (0: the mini's, 2).")
    flags.DEFINE_integer("num_heads", 0, "Heads (0: the mini's, 4).")
    flags.DEFINE_string("plot", "", "Write the time-per-token plot (PNG) here.")


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(name: str, length: int, sizes: dict):
    """The causal_lm model of the ListOps mini config at max_length `length`."""
    from flax import nnx

    import lra.tasks
    from configs import hybrid, listops
    from lra import train

    config = listops.get_config(f"model={hybrid.base_of(name)},mini,causal,pretrain")
    config.max_length = length
    for key, value in sizes.items():
        if value:
            config[key] = value
    if sizes.get("emb_dim"):
        config.qkv_dim, config.mlp_dim = sizes["emb_dim"], 2 * sizes["emb_dim"]
    hybrid.apply_name(config, name)  # a hybrid's name (gla+transformer@1): its layers
    model = train.build_model(config, lra.tasks.get("listops"))
    return model, config, nnx


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_decoding(name: str, length: int, steps: int, batch: int, repeats: int,
                  sizes: dict) -> tuple[float, int]:
    """(seconds per token at position ~length, cache bytes) for `name`'s decoding form."""
    import jax

    from lra.cache_memory import cache_bytes
    from models import decoding

    model, config, nnx = build(name, length, sizes)
    graphdef, state = decoding.split(model)
    prompt_len = length - steps
    tokens_BxL = jax.random.randint(jax.random.key(0), (batch, length), 1, 10)

    @jax.jit
    def prefill(state, prompt_BxP):
        m = nnx.merge(graphdef, state)
        return m.prefill(m.init_cache(batch), prompt_BxP)[1]

    def scan(state, cache, fed_NxB):
        def body(cache, token_B):
            out, cache = nnx.merge(graphdef, state).step(cache, token_B)
            return cache, out.argmax(-1)

        return jax.lax.scan(body, cache, fed_NxB)

    fed_NxB = tokens_BxL[:, prompt_len:].T
    cache = prefill(state, tokens_BxL[:, :prompt_len])
    compiled = jax.jit(scan, donate_argnums=1).lower(state, cache, fed_NxB).compile()
    caches = [prefill(state, tokens_BxL[:, :prompt_len]) for _ in range(repeats)]
    jax.block_until_ready(caches)
    runs = iter(caches)
    seconds = _median_time(lambda: jax.block_until_ready(compiled(state, next(runs),
                                                                  fed_NxB)), repeats)
    return seconds / steps, cache_bytes(model, batch)


def time_no_cache(length: int, batch: int, repeats: int, sizes: dict) -> float:
    """Seconds for one token at position `length` without a cache: the parallel causal
    forward over the whole prefix (the Linear Transformer paper's softmax baseline)."""
    import jax

    model, _, nnx = build("transformer", length, sizes)
    graphdef, state = nnx.split(model)
    tokens_BxL = jax.random.randint(jax.random.key(0), (batch, length), 1, 10)

    @jax.jit
    def next_token(state, tokens_BxL):
        return nnx.merge(graphdef, state)(tokens_BxL, None, deterministic=True)[:, -1].argmax(-1)

    jax.block_until_ready(next_token(state, tokens_BxL))
    return _median_time(lambda: jax.block_until_ready(next_token(state, tokens_BxL)),
                        repeats)


def growth(times: list[float], lengths: list[int]) -> float:
    """Exponent e of t ~ L^e from the first to the last length."""
    if len(lengths) < 2 or times[0] <= 0:
        return float("nan")
    return math.log(times[-1] / times[0]) / math.log(lengths[-1] / lengths[0])


def table(rows: list[dict], lengths: list[int]) -> str:
    by_name = {r["model"]: r for r in rows}
    head = (["model", "form"] + [f"ms/token at {n}" for n in lengths]
            + [f"growth {lengths[0]}-{lengths[-1]}", f"vs no cache at {lengths[-1]}",
               f"vs kv transformer at {lengths[-1]}"]
            + [f"cache at {n}" for n in lengths])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        last = r["seconds"][-1]
        ratio = lambda other: (f"{by_name[other]['seconds'][-1] / last:.1f}x"  # noqa: E731
                               if other in by_name else "-")
        cache = ([f"{b / 2**20:.2f} MiB" for b in r["bytes"]] if r["bytes"]
                 else ["-"] * len(lengths))
        cells = ([r["model"], r["form"]] + [f"{s * 1e3:.3f}" for s in r["seconds"]]
                 + [f"{growth(r['seconds'], lengths):.2f}", ratio(NO_CACHE),
                    ratio("transformer")] + cache)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], lengths: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for r in rows:
        ax.plot(lengths, [s * 1e3 for s in r["seconds"]], marker="o", label=r["model"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("position (tokens before the generated one)")
    ax.set_ylabel("ms per generated token")
    ax.set_title("Autoregressive generation, one token at a time (CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(models: list[str], lengths: list[int], *, steps: int, batch: int, repeats: int,
        sizes: dict) -> list[dict]:
    from configs import hybrid

    if steps < 1 or min(lengths) <= steps:
        raise ValueError(f"--steps={steps} must be >= 1 and below every length {lengths}")
    rows = [{"model": NO_CACHE, "form": "none (full forward per token)", "seconds": [],
             "bytes": []}]
    for length in lengths:
        _progress(f"{NO_CACHE} at {length}")
        rows[0]["seconds"].append(time_no_cache(length, batch, repeats, sizes))
    for name in models:
        row = {"model": name, "form": hybrid.decode_forms(build(name, lengths[0], sizes)[1]),
               "seconds": [], "bytes": []}
        for length in lengths:
            _progress(f"{name} at {length}")
            seconds, size = time_decoding(name, length, steps, batch, repeats, sizes)
            row["seconds"].append(seconds)
            row["bytes"].append(size)
        rows.append(row)
    return rows


def _positive_lengths(values: list[str]) -> list[int]:
    """--lengths as sorted ints; one line (exit) for a value that is not a positive int."""
    try:
        lengths = sorted(int(n) for n in values)
    except ValueError:
        cli.refuse(f"--lengths={','.join(values)}: give positive integers")
    if not lengths or lengths[0] < 1:
        cli.refuse(f"--lengths={','.join(values)}: give positive integers")
    return lengths


def main(argv) -> None:
    del argv
    import jax

    from models import registry

    from configs import hybrid
    from lra.cache_memory import mixers_of
    from lra.errors import UserError

    causal = [n for n in registry.available() if registry.capabilities(n).causal]
    models = causal if FLAGS.models == ["all"] else hybrid.split_models(FLAGS.models)
    try:
        unknown = [m for m in models if not set(mixers_of(m)) <= set(causal)]
    except UserError as e:
        cli.refuse(f"{e}")
    if unknown:
        cli.refuse(f"--models: {', '.join(unknown)} not causal variants; causal: "
                   f"{', '.join(causal)}")
    lengths = _positive_lengths(FLAGS.lengths)
    from lra.training.console import unwritable
    if FLAGS.plot and unwritable(FLAGS.plot, "--plot"):
        cli.refuse(f"{unwritable(FLAGS.plot, '--plot')}")
    sizes = {"emb_dim": FLAGS.emb_dim, "num_layers": FLAGS.num_layers,
             "num_heads": FLAGS.num_heads}
    try:
        rows = run(models, lengths, steps=FLAGS.steps, batch=FLAGS.batch_size,
                   repeats=FLAGS.repeats, sizes=sizes)
    except (ValueError, UserError) as e:  # a hybrid's layer out of range: one line
        cli.refuse(f"{e}")
    _, config, _ = build("transformer", lengths[0], sizes)
    print(f"generation, {FLAGS.steps} tokens after a prompt of L - {FLAGS.steps}, batch "
          f"{FLAGS.batch_size}; ListOps mini sizes: emb {config.emb_dim}, {config.num_layers} "
          f"layers, {config.num_heads} heads; {jax.devices()[0].device_kind}, JAX "
          f"{jax.__version__}")
    print(table(rows, lengths))
    if FLAGS.plot:
        plot(rows, lengths, FLAGS.plot)
        print(f"\nplot: {FLAGS.plot}")


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=cli.parse_flags_or_refuse)
