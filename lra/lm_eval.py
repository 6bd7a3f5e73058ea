r"""Bits per byte (enwik8) or per character (text8) of a trained run on a whole split, with
the long context handled in the ways the variant allows, as the papers evaluate.

  python -m lra.lm_eval --workdir=workdirs/enwik8_mini/gla [--contexts=window,sliding,stream]
      [--stride=N] [--streams=64] [--batch=32] [--split=test] [--data_dir=<dir>]
  python -m lra.lm_eval --workdir=workdirs/real_data/enwik8   # every run below a folder:
      # one line per run, then mean ± std over each model's seeds per context
  python -m lra.lm_eval --workdir=workdirs/real_data/enwik8 --reuse  # the table again from
      # each run's lm_eval.json (same checkpoint, every context there): no evaluation

The run's best checkpoint (as lra.generate restores it) scores every target of the split
(every token but the first) exactly once, under each context:
  window   the training loop's own test rows (lra/tasks/enwik8.py `rows`): rows of L =
           max_length tokens overlapping by one; the target at row offset t + 1 is
           predicted from the t + 1 tokens before it in its row (1 to L - 1; the number in
           results.json).
  sliding  fixed windows with overlap: windows of L tokens starting every `stride` tokens
           (default L // 2); the first window scores all its targets, each later one its
           last `stride` targets, so every target after the first window sees at least
           L - stride tokens before it (Al-Rfou et al. 2019 slide by one and score only the
           last token; a stride trades their cost for context). Every variant.
  stream   the recurrent state carried across the whole split: the split is cut into
           `streams` contiguous pieces that overlap by one token, each read token by token
           (the decoding step, models/decoding.py) from an empty state, so a target sees
           every earlier token of its piece (thousands, far past L). For the variants whose
           decoding state does not grow and that have no absolute positions: the linear
           family's recurrent state (gla, retnet, deltanet, mamba2, s4d, lru, ...) and
           Transformer-XL's segment memory (its evaluation: the memory of the previous
           segment carried forward, at the trained segment and memory lengths). Others
           (softmax attention over a key-value cache, learned positions past L) are
           skipped, said so.
Bits per token are the papers': the mean over every target of the split of -log p(target)
(each target weighted once), divided by ln 2. Transformer-XL's evaluation
(kimiyoung/transformer-xl pytorch/train.py `evaluate` at 3a0086fa: the test split as
eval_batch_size = 10 parallel streams with the memory carried, total_loss += seq_len *
loss.mean(), total_loss / total_len; bpc = loss / ln 2) is the `stream` context here with
--streams=10 (the default 64 only reads the split in fewer steps; each piece's first
tokens see less context, 64 of ~300,000 targets on the excerpt).
Each context's result goes into <run>/lm_eval.json (merged with earlier contexts), with the
checkpoint, the number of targets and the least and mean context per target.

Only enwik8 / text8 runs (their splits are one stream of text). A user's mistake is one
line `error: ...` and exit code 2.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

import numpy as np
from absl import flags

from lra.errors import ConfigError, DataError, UserError

EXIT_USER_ERROR = 2
CONTEXTS = ("window", "sliding", "stream")
CORPORA = ("enwik8", "text8")
STREAM_FORMS = ("recurrent_state", "segment_memory")  # a state that does not grow
POSITION_FREE = ("none", "rotary")  # rotary is relative: any position is in range
STREAM_CHUNK = 256  # decoding steps per jitted call (progress is printed between calls)
LOG2 = math.log(2.0)


class FlagError(UserError):
    """A flag value that cannot be used, said in one line."""


# ----------------------------------------------------------------------------- contexts


def sliding_windows(num_tokens: int, length: int, stride: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts_K, scored_from_K, ends_K): window k holds ids [starts[k], ends[k]) and scores
    the targets (ids) in [scored_from[k], ends[k]); together every id 1..N-1 exactly once."""
    if not 1 <= stride <= length - 1:
        raise FlagError(f"--stride={stride}: give 1 to max_length - 1 = {length - 1}")
    count = 1 + max(0, -(-(num_tokens - length) // stride))
    starts = np.arange(count) * stride
    ends = np.minimum(starts + length, num_tokens)
    scored_from = np.where(np.arange(count) == 0, 1, starts + length - stride)
    return starts, scored_from, ends


def window_batches(ids: np.ndarray, starts, scored_from, ends, length: int):
    """(inputs_KxL, mask_KxL, weight_KxL): weight[k, t] = 1 where the output at t (the
    prediction of id starts[k] + t + 1) is scored."""
    count = len(starts)
    inputs = np.zeros((count, length), np.int32)
    mask = np.zeros((count, length), bool)
    weight = np.zeros((count, length), np.float32)
    for k in range(count):
        piece = ids[starts[k]:ends[k]]
        inputs[k, :len(piece)] = piece
        mask[k, :len(piece)] = True
        target_t = np.arange(length) + starts[k] + 1  # the id the output at t predicts
        weight[k] = (target_t >= scored_from[k]) & (target_t < ends[k])
    return inputs, mask, weight


def context_stats(starts, scored_from, ends) -> tuple[int, float]:
    """(least, mean) tokens of context a scored target sees (its id minus its window's
    start)."""
    least, total, count = None, 0, 0
    for s, a, e in zip(starts, scored_from, ends):
        if e <= a:
            continue
        least = a - s if least is None else min(least, a - s)
        total += (a - s + e - 1 - s) * (e - a) / 2  # mean of the arithmetic run
        count += e - a
    return int(least or 0), float(total / max(count, 1))


def can_stream(config: Any) -> str | None:
    """None if the run's model carries a constant-size state without absolute positions;
    else why not (one line)."""
    from configs import hybrid
    from models import registry

    for name in dict.fromkeys(hybrid.layer_names(config) or [config.model]):
        form = registry.capabilities(name).decode
        if form not in STREAM_FORMS:
            return (f"{name}'s decoding form is {form or 'none'!r}, not a recurrent state "
                    "or Transformer-XL's segment memory")
    pos = config.get("pos_emb", "none")
    if pos not in POSITION_FREE:
        return (f"pos_emb {pos!r}: absolute positions past max_length "
                f"{config.max_length} were never trained")
    return None


# ----------------------------------------------------------------------------- scoring


def score_windows(model: Any, inputs, mask, weight, batch: int, progress=None) -> dict:
    """Sums of bits, correct predictions and weights over windows (parallel forward)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def sums(state, inputs_BxL, mask_BxL, weight_BxL):
        m = nnx.merge(graphdef, state)
        out = m(inputs_BxL, mask_BxL, deterministic=True).astype(jnp.float32)
        logp = jax.nn.log_softmax(out[:, :-1])
        targets = inputs_BxL[:, 1:]
        nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
        w = weight_BxL[:, :-1]
        return (jnp.sum(nll * w) / LOG2, jnp.sum((jnp.argmax(logp, -1) == targets) * w),
                jnp.sum(w))

    count = len(inputs)
    pad = (-count) % batch
    if pad:  # one compiled shape: the last batch padded with rows that score nothing
        inputs = np.concatenate([inputs, np.zeros((pad, inputs.shape[1]), inputs.dtype)])
        mask = np.concatenate([mask, np.zeros((pad, mask.shape[1]), bool)])
        mask[count:, 0] = True  # a row of one (pad) token: no empty row reaches the mixer
        weight = np.concatenate([weight, np.zeros((pad, weight.shape[1]), weight.dtype)])
    bits = correct = total = 0.0
    for i in range(0, len(inputs), batch):
        b, c, w = sums(state, inputs[i:i + batch], mask[i:i + batch], weight[i:i + batch])
        bits, correct, total = bits + float(b), correct + float(c), total + float(w)
        if progress:
            progress(min(i + batch, count), count)
    return {"bits": bits, "correct": correct, "targets": total}


def score_stream(model: Any, ids: np.ndarray, streams: int, progress=None) -> dict:
    """Sums over the split read as `streams` pieces (overlapping by one id), each token by
    token from an empty decoding state carried to the piece's end."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from lra.tasks.enwik8 import rows
    from models import decoding

    streams = max(1, min(streams, len(ids) - 1))
    piece = -(-(len(ids) - 1) // streams) + 1
    tokens_BxT, mask_BxT = rows(ids, piece)  # rows overlapping by one: each target once
    total_steps = tokens_BxT.shape[1] - 1
    chunks = -(-total_steps // STREAM_CHUNK)
    width = chunks * STREAM_CHUNK + 1
    pad = width - tokens_BxT.shape[1]
    tokens_BxT = np.pad(tokens_BxT, ((0, 0), (0, pad)))
    mask_BxT = np.pad(mask_BxT, ((0, 0), (0, pad)))
    batch = tokens_BxT.shape[0]
    graphdef, state = decoding.split(model)

    def chunk(state, cache, tokens_BxC1, mask_BxC1):
        def body(cache, t):
            out_BxV, cache = nnx.merge(graphdef, state).step(cache, tokens_BxC1[:, t])
            logp = jax.nn.log_softmax(out_BxV.astype(jnp.float32))
            target_B = tokens_BxC1[:, t + 1]
            w = mask_BxC1[:, t + 1].astype(jnp.float32)
            nll = -jnp.take_along_axis(logp, target_B[:, None], -1)[:, 0]
            return cache, (jnp.sum(nll * w) / LOG2,
                           jnp.sum((jnp.argmax(logp, -1) == target_B) * w), jnp.sum(w))

        cache, (b, c, w) = jax.lax.scan(body, cache, jnp.arange(STREAM_CHUNK))
        return cache, (jnp.sum(b), jnp.sum(c), jnp.sum(w))

    run = jax.jit(chunk, donate_argnums=1)
    cache = jax.jit(lambda s: nnx.merge(graphdef, s).init_cache(batch))(state)
    bits = correct = total = 0.0
    for k in range(chunks):
        lo = k * STREAM_CHUNK
        cache, (b, c, w) = run(state, cache, tokens_BxT[:, lo:lo + STREAM_CHUNK + 1],
                               mask_BxT[:, lo:lo + STREAM_CHUNK + 1])
        bits, correct, total = bits + float(b), correct + float(c), total + float(w)
        if progress:
            progress(min(lo + STREAM_CHUNK, total_steps), total_steps)
    return {"bits": bits, "correct": correct, "targets": total, "streams": batch,
            "piece": piece}


# ----------------------------------------------------------------------------- a run


def evaluate_run(workdir: str, *, contexts=CONTEXTS, stride: int | None = None,
                 streams: int = 64, batch: int = 32, split: str = "test",
                 data_dir: str | None = None, quiet: bool = False) -> dict:
    """{context: {"bits_per_token", "accuracy", "targets", "min_context", "mean_context",
    ...} or {"skipped": why}} for one run; merged into <workdir>/lm_eval.json."""
    from lra import generate
    from lra.tasks import enwik8
    from lra.training.console import log
    from models import precision

    bad = [c for c in contexts if c not in CONTEXTS]
    if bad or not contexts:
        raise FlagError(f"--contexts={','.join(contexts)}: choose among {', '.join(CONTEXTS)}")
    if split not in ("test", "val"):
        raise FlagError(f"--split={split}: give test or val")
    if streams < 1 or batch < 1:
        raise FlagError("--streams and --batch: give at least 1")
    config, _ = generate.load_config(workdir)
    generate.check_run(config, workdir, "bits per token need")
    if config.task not in CORPORA:
        raise ConfigError(f"{workdir} is a {config.task!r} run; lra.lm_eval evaluates "
                          f"{' / '.join(CORPORA)} runs (a split that is one stream of text)")
    if config.get("start_token", False) or config.get("lm_loss", "xent") != "xent":
        raise ConfigError(f"{workdir}: a run with start_token or lm_loss other than xent is "
                          "not an enwik8 / text8 language model of this lab")
    import lra.tasks
    from lra import train

    task = lra.tasks.get(config.task)
    model = train.build_model(config, task)
    step, kind = generate.restore(model, workdir)
    model = precision.compute_view(model, precision.dtype_of(config.get("dtype", "float32")))
    ids = enwik8.split_ids(config.task, data_dir or config.data_dir, split)
    if len(ids) < 2:
        raise DataError(f"the {split} split of {data_dir or config.data_dir} holds "
                        f"{len(ids)} token(s): nothing to predict")
    length = int(config.max_length)
    name = f"{config.model} seed {config.get('random_seed', '?')}"  # progress lines
    out = {}
    for context in contexts:
        start = time.perf_counter()

        last = [start]

        def progress(done, of, context=context, last=last):
            # Long work says where it is, at most every 20 s.
            if not quiet and done < of and time.perf_counter() - last[0] > 20:
                last[0] = time.perf_counter()
                log(f"  {name} {context}: {done:,} / {of:,}")

        if context == "stream":
            why = can_stream(config)
            if why:
                out[context] = {"skipped": why}
                if not quiet:
                    log(f"  {name} stream: skipped ({why}); sliding windows are its long context")
                continue
            s = score_stream(model, ids, streams, progress)
            piece = s["piece"]
            info = {"streams": s["streams"], "piece": piece, "min_context": 1,
                    "mean_context": piece / 2}
        else:
            if context == "window":
                starts = np.arange(0, max(1, len(ids) - 1), length - 1)
                ends = np.minimum(starts + length, len(ids))
                scored_from = starts + 1
                info = {}
            else:
                s_ = stride if stride is not None else length // 2
                starts, scored_from, ends = sliding_windows(len(ids), length, s_)
                info = {"stride": s_}
            least, mean = context_stats(starts, scored_from, ends)
            if context == "sliding":  # the first window's targets see fewer
                info["min_context_after_first_window"] = length - info["stride"]
            info.update(min_context=least, mean_context=mean)
            s = score_windows(model, *window_batches(ids, starts, scored_from, ends, length),
                              batch, progress)
        if s["targets"] != len(ids) - 1:
            raise RuntimeError(f"{context}: scored {s['targets']} targets, not "
                               f"{len(ids) - 1}")
        out[context] = {"bits_per_token": s["bits"] / s["targets"],
                        "accuracy": s["correct"] / s["targets"], "targets": int(s["targets"]),
                        **info, "seconds": round(time.perf_counter() - start, 1)}
        if not quiet:
            log(f"{name} {context}: {out[context]['bits_per_token']:.4f} bits/token "
                f"({out[context]['seconds']} s)")
    path = os.path.join(workdir, "lm_eval.json")
    saved = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    key = split
    saved.setdefault(key, {}).update(out)
    from lra.reporting import protocol

    differences = protocol.size_differences(
        {"task": config.task, "model": config.model, "config": config.to_dict()})
    from configs import hybrid

    from lra.download import ARCHIVES  # the published zips' names and sha256

    saved.update(data=enwik8.data_identity(config.task, data_dir or config.data_dir,
                                           ARCHIVES[config.task]),
                 step=step, kind=kind, model=hybrid.name(config),
                 seed=config.get("random_seed", None),
                 task=config.task, num_params=_num_params(model),
                 num_layers=int(config.num_layers), max_length=length,
                 size_differences=differences)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(saved, f, indent=1)
    os.replace(path + ".tmp", path)
    return {**saved, "contexts": out}


def saved_result(workdir: str, split: str, contexts, stride: int | None = None,
                 streams: int = 64) -> dict | None:
    """<workdir>/lm_eval.json if it holds every context of `contexts` on `split`, made
    from the run's newest best checkpoint with the same stride and streams; else None
    (evaluate again)."""
    from lra.training import checkpoint

    path = os.path.join(workdir, "lm_eval.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    best = checkpoint.Checkpoints(workdir).best_steps()
    if saved.get("kind") != "best" or not best or saved.get("step") != best[-1]:
        return None
    held = saved.get(split, {})
    if not all(c in held for c in contexts):
        return None
    sliding, stream = held.get("sliding", {}), held.get("stream", {})
    if "sliding" in contexts and "stride" in sliding and stride is None:
        # Files written before lm_eval.json held max_length: the run's config has it.
        from lra import generate

        stride = int(saved.get("max_length") or generate.load_config(workdir)[0].max_length
                     ) // 2
    if "sliding" in contexts and "stride" in sliding and sliding["stride"] != stride:
        return None  # another stride than asked
    if "stream" in contexts and "streams" in stream and stream["streams"] != min(
            streams, stream.get("targets", streams)):
        return None
    return saved


def _num_params(model: Any) -> int:
    import jax
    from flax import nnx

    return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


def find_runs(folder: str) -> list[str]:
    """The folder itself if it is a run (results.json), else every run below it, sorted."""
    if os.path.exists(os.path.join(folder, "results.json")):
        return [folder]
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        if "results.json" in files:
            found.append(root)
            dirs[:] = []  # a run's own subfolders (checkpoints) hold no runs
    return found


def _not_published(r: dict) -> str:
    data = r.get("data")
    if not data:
        return "its data not recorded (rerun lra.lm_eval on it)"
    return (f"data {data['file']} ({data['bytes']:,} bytes), not the published "
            f"{r.get('task')} zip")


def table(results: list[dict], contexts, split: str = "test") -> str:
    """Markdown: per model, mean ± std over seeds of each context's bits per token."""
    by_model: dict[str, list[dict]] = {}
    for r in results:
        by_model.setdefault(r["model"], []).append(r)
    from lra.reporting import protocol

    head = ("| model | seeds | " + " | ".join(contexts) +
            " | params | published (full-size runs on the published data only) |")
    lines = [head, "|" + "---|" * (len(contexts) + 4)]
    withheld = []
    for model, runs in by_model.items():
        cells = []
        for c in contexts:
            vals = [r[split][c]["bits_per_token"] for r in runs
                    if "bits_per_token" in r.get(split, {}).get(c, {})]
            if not vals:
                cells.append("-")
            elif len(vals) == 1:
                cells.append(f"{vals[0]:.3f}")
            else:
                cells.append(f"{np.mean(vals):.3f} ± {np.std(vals, ddof=1):.3f}")
        seeds = ",".join(str(r.get("seed")) for r in runs)
        task = runs[0].get("task", "")
        entries = protocol.published_lm(task, model, runs[0].get("num_layers"))
        differences = [d for r in runs for d in r.get("size_differences", ["not recorded"])]
        # Beside the published data only: a full-size config on an excerpt is not the
        # papers' experiment (enwik8.data_identity).
        differences += [_not_published(r) for r in runs
                        if not (r.get("data") or {}).get("published")][:1]
        if not protocol.published_lm(task, model):
            published = "-"
        elif differences or not entries:
            differences = differences or [f"{runs[0].get('num_layers')} layers: no published "
                                          "number at that depth"]
            published = "not compared"
            withheld.append(f"{model}: {differences[0]}")
        else:
            published = "; ".join(f"{e['bits_per_token']:.2f} ({src['short']}, "
                                  f"{e['num_layers']} layers; evaluated: "
                                  f"{e.get('eval_setting', src['setting'])})"
                                  for e, src in entries)
        lines.append(f"| {model} | {seeds} | " + " | ".join(cells) +
                     f" | {runs[0].get('num_params', 0):,} | {published} |")
    if withheld:
        lines += ["", "Published numbers are shown beside full-size runs on the published "
                  "data only "
                  "(python -m lra.report --published lists them); not compared: "
                  + "; ".join(withheld)]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command


def define_flags(fv: flags.FlagValues) -> flags.FlagValues:
    flags.DEFINE_multi_string("workdir", None, "A run's workdir, or a folder of runs (every "
                              "results.json below it); repeatable.", flag_values=fv)
    flags.DEFINE_list("contexts", list(CONTEXTS), "Which contexts: window, sliding, stream.",
                      flag_values=fv)
    flags.DEFINE_integer("stride", None, "Sliding windows' stride (default max_length // 2).",
                         flag_values=fv)
    flags.DEFINE_integer("streams", 64, "Pieces of the split read in parallel (stream).",
                         flag_values=fv)
    flags.DEFINE_integer("batch", 32, "Windows per forward call (window, sliding).",
                         flag_values=fv)
    flags.DEFINE_string("split", "test", "test or val.", flag_values=fv)
    flags.DEFINE_bool("reuse", False, "Take a run's lm_eval.json where it holds every "
                      "asked context for the run's current best checkpoint (no evaluation).",
                      flag_values=fv)
    flags.DEFINE_string("data_dir", None, "The corpus (default: each run's config.data_dir).",
                        flag_values=fv)
    flags.DEFINE_bool("help", False, "Show this help.", short_name="h", flag_values=fv)
    return fv


def main(argv: list[str] | None = None) -> int:
    """`python -m lra.lm_eval --workdir=...`: 0, or 2 for a user's mistake (one line)."""
    fv = define_flags(flags.FlagValues())
    from lra.training.console import parse_flags

    code = parse_flags(fv, sys.argv if argv is None else argv, __doc__)
    if code is not None:
        return code
    if not fv.workdir:
        print("error: --workdir is required: an enwik8 / text8 run's workdir or a folder of "
              "them", file=sys.stderr)
        return EXIT_USER_ERROR
    for name in ("stride", "streams", "batch"):  # 0 was taken as the default stride
        value = fv[name].value
        if value is not None and value < 1:
            print(f"error: --{name}={value}: give a positive integer", file=sys.stderr)
            return EXIT_USER_ERROR
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    try:
        runs = []
        for folder in fv.workdir:
            found = find_runs(folder) if os.path.isdir(folder) else []
            if not found:
                raise FlagError(f"--workdir={folder}: no run (results.json) there or below")
            runs += found
        results = []
        for run in runs:
            saved = (saved_result(run, fv.split, fv.contexts, fv.stride, fv.streams)
                     if fv.reuse else None)
            results.append(saved or evaluate_run(
                run, contexts=fv.contexts, stride=fv.stride, streams=fv.streams,
                batch=fv.batch, split=fv.split, data_dir=fv.data_dir))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(table(results, fv.contexts, fv.split))
    return 0


if __name__ == "__main__":
    sys.exit(main())
