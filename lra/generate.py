r"""Sample from a self-pretrained causal language model (a `causal_lm` run).

  python launch.py --config=configs/listops.py:model=transformer,runlocal,causal,pretrain \
      --workdir=workdirs/listops_causal
  python -m lra.generate --workdir=workdirs/listops_causal [--num_samples=4] \
      [--prompt_len=N] [--max_new_tokens=N] [--temperature=1.0] [--top_k=0] [--seed=0] \
      [--stop_token=<token>] [--output=<dir>] [--data_dir=<dir>]

The run's best checkpoint (lowest validation loss; checksums verified) is restored into
the model its results.json config builds (`lra.train.build_model`). The prompts are the
first tokens of the first `num_samples` examples of the task's test split (retrieval:
the first document), `--prompt_len` of each (default: half of each example, at least
one token: a model has no start token, its first prediction is of the second token).
A run with config.start_token (the pixel tasks' `generation` argument) reads every prompt
behind its start token (id vocab_size), so its first prediction is of the first token:
`--prompt_len=0` samples whole images; the start id itself is never sampled.
Each row is prefilled once (models/decoding.py: right-padded prompts, each row at its own
position), then one jitted `jax.lax.scan` appends the new tokens of every row; a row stops
at max_length (pixel tasks: at the end of its image), and a request for more says so.
`--stop_token` ends a row's continuation at the first such token it samples (kept in the
output): a token as the task's text writes it (ListOps `]`, a character of Text, enwik8 or
text8) or `id:N`; none by default (the tasks have no end-of-sequence token). The scan runs
to the longest request; a stopped row's later tokens are dropped.

Sampling: logits / temperature (0, or below 1e-6: argmax; inf: uniform; nan is refused),
keeping the `top_k` largest (0: all). Id 0
is padding in ListOps, Text and Retrieval, never a token, so it is never sampled there.
With `lm_loss='l1'` (Image and Pathfinder) the head predicts one intensity per pixel and
the next pixel is round(clip(out, 0, 1) * (vocab_size - 1)): nothing is sampled.

Output (`--output`, default <workdir>/samples/):
  samples.txt  ListOps, Text, Retrieval: per sample the prompt and the model's continuation
               decoded with the task's vocabulary, `prompt ⟨|⟩ continuation`, and the test
               example's true continuation beneath it (also printed).
  samples.png  Image, Pathfinder, Path-X, MNIST: one row per sample: the test image, its
               prompt with the rest gray, the completed image (as Katharopoulos et al.'s
               "Transformers are RNNs", Figure 3); in colour for task_options.pixels=rgb.
The last line printed is the scan's throughput, measured after compilation.

A user's mistake (no such workdir, a run that is not causal_lm, a bad flag value) is one
line `error: ...` and exit code 2, as in launch.py.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
from absl import flags

from lra.errors import CheckpointError, ConfigError, DataError, UserError
from lra.reporting import samples as samples_lib
# Re-exported: notebooks (enwik8_samples, pixel_generation) and researchers' own read
# samples as `generate.tokens_to_text(...)`, as before lra/reporting/samples.py held them.
from lra.reporting.samples import (BLANK, PROMPT_MARK, png_grid, pixel_rows,  # noqa: F401
                                   text_report, tokens_to_text, write_png)

EXIT_USER_ERROR = 2
# Tasks whose tokens are text (decoded to strings) and whose id 0 is padding, not a token.
TEXT_TASKS = ("listops", "text", "retrieval")


class FlagError(UserError):
    """A flag value that cannot be used, said in one line."""


# ----------------------------------------------------------------------------- the run


def load_config(workdir: str) -> tuple[Any, str]:
    """(the run's resolved config as a ConfigDict, where it was read from). results.json,
    else (a run still training or interrupted) the config of its newest last checkpoint."""
    import ml_collections

    from lra.training import checkpoint

    if not os.path.isdir(workdir):
        raise FlagError(f"--workdir={workdir}: no such folder; give the workdir of a causal_lm "
                        "run (python launch.py --config=configs/<task>.py:causal,pretrain "
                        f"--workdir={workdir})")
    path = os.path.join(workdir, "results.json")
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)["config"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path} cannot be read or has no 'config' "
                              f"({checkpoint._first_line(e, 120)})") from None
        return ml_collections.ConfigDict(saved), path
    ckpts = checkpoint.Checkpoints(workdir)
    for step in ckpts.last_steps():
        try:
            return ml_collections.ConfigDict(ckpts.last_loop(step)["config"]), (
                f"{ckpts.last_dir}/{step} (the run has no results.json yet)")
        except Exception:  # noqa: BLE001  (an unreadable step: try the one before)
            continue
    raise FlagError(f"--workdir={workdir} holds no results.json and no readable checkpoint: "
                    "not a run's workdir, or a run that stopped before its first checkpoint")


def check_run(config: Any, workdir: str, purpose: str = "generation needs") -> None:
    """A causal_lm run, or one line saying what it is and how to make one (`purpose`: what
    needs it, e.g. lra.lm_eval's "bits per token need")."""
    objective = config.get("objective", "classify")
    if objective != "causal_lm":
        task, model = config.get("task", "<task>"), config.get("model", "transformer")
        if _has_causal_pretraining(task, model):
            how = (f"trained with python launch.py --config=configs/{task}.py:model={model},"
                   f"causal,pretrain --workdir=<dir>")
        else:  # the synthetic tasks label positions; they have no next-token setting
            how = (f"configs/{task}.py has no causal,pretrain setting; train one on text, "
                   f"e.g. python launch.py --config=configs/enwik8.py:model={model},mini "
                   f"--workdir=<dir> (or an LRA task's causal,pretrain)")
        raise ConfigError(
            f"{workdir} is a run with objective {objective!r}; {purpose} a causal_lm "
            f"run (next-token prediction), {how}")


def _has_causal_pretraining(task: str, model: str) -> bool:
    """Whether configs/<task>.py builds `model=<model>,causal,pretrain` (the LRA tasks do;
    MQAR, MAD, state tracking, niah and flip-flop refuse the arguments)."""
    import importlib

    try:
        module = importlib.import_module(f"configs.{task}")
        module.get_config(f"model={model},causal,pretrain")
    except Exception:  # noqa: BLE001  (no such config, or it refuses the arguments)
        return False
    return True


def build(config: Any, task: Any) -> Any:
    """The run's model (as lra.train builds it), checked to decode; one line if not."""
    from lra import train
    from models.decoding import DecodingError
    from models.registry import RegistryError

    try:
        model = train.build_model(config, task)
    except (ValueError, TypeError, RegistryError) as e:
        raise ConfigError(f"cannot build the run's model {config.model!r} from its config: "
                          f"{e}") from None
    try:
        model.check_decodes()
    except DecodingError as e:
        raise ConfigError(f"model {config.model!r} cannot generate: {e}") from None
    return model


def _param_name(path) -> str:
    """'encoder/stack/blocks/0/mixer/query/kernel' (orbax's trailing `value` leaf left out)."""
    keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return "/".join(keys[:-1] if keys and keys[-1] == "value" else keys)


def restore(model: Any, workdir: str) -> tuple[int, str]:
    """Loads the run's best weights into `model`; (step, 'best'|'last'). The weights are
    the parameters and the model's other saved state but its RNG streams: performer's and
    rfa's random features, routing's centroids, the fixed synthesizer's logits (without
    them a model evaluates with another draw than it trained with). A checkpoint whose
    files differ from their checksums, or cannot be read, is passed over in one line to
    the run's last state (as config.init_from does); none usable: CheckpointError."""
    import jax
    from flax import nnx

    from lra.training import checkpoint
    from lra.training.console import warn

    ckpts = checkpoint.Checkpoints(workdir)
    best = ckpts.best_steps()
    candidates = ([(best[-1], "best")] if best else []) + [(s, "last")
                                                            for s in ckpts.last_steps()]
    if not candidates:
        raise CheckpointError(f"{workdir} holds no checkpoints ({ckpts.directory} is missing "
                              "or empty); train the run for at least eval_frequency steps")
    _, params, _, state = nnx.split(model, nnx.Param, nnx.RngState, ...)
    failures = []
    for step, kind in candidates:
        try:
            saved = ckpts.restore_weights(step, kind)  # verifies the checksums first
        except Exception as e:  # noqa: BLE001  (CorruptCheckpoint, orbax's read errors)
            failures.append(f"{kind} step {step}: {checkpoint._first_line(e, 120)}")
            continue
        break
    else:
        raise CheckpointError(f"no checkpoint of {workdir} can be used "
                              f"({'; '.join(failures)}); train the run again")
    if failures:
        warn(f"{'; '.join(failures)}; using the {kind} checkpoint of step {step} instead")
    where = f"{kind} checkpoint step {step} of {workdir}"
    for variables, group in ((params, "params"), (state, "rest")):
        saved_flat = {_param_name(p): v
                      for p, v in jax.tree_util.tree_leaves_with_path(saved[group])}
        for path, target in jax.tree_util.tree_leaves_with_path(variables.to_pure_dict()):
            name = _param_name(path)
            if name not in saved_flat or saved_flat[name].shape != target.shape:
                held = (f"holds it with shape {saved_flat[name].shape}" if name in saved_flat
                        else "lacks it")
                raise CheckpointError(f"the {where} {held}, but the model its config builds "
                                      f"has {name} of shape {target.shape}: the checkpoint "
                                      "is not this run's")

        def take(path, target, saved_flat=saved_flat):
            return np.asarray(saved_flat[_param_name(path)], dtype=target.dtype)

        nnx.replace_by_pure_dict(variables, jax.tree_util.tree_map_with_path(
            take, variables.to_pure_dict()))
        nnx.update(model, variables)
    return step, kind


def load_test_examples(config: Any, task: Any, data_dir: str,
                       num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens_NxL, lengths_N) of the first num_samples test examples (fewer if the split
    is smaller; retrieval: the first document), right-padded to max_length."""
    try:
        split = task.load(data_dir, "test", config.max_length, **config.task_options.to_dict())
    except UnicodeDecodeError as e:
        raise DataError(f"a test file in {data_dir} is not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise DataError(f"cannot read {e.filename or data_dir}: {e.strerror or e}") from None
    tokens_NxL = np.asarray(split["inputs"][:num_samples], np.int32)
    lengths_N = np.asarray(split["mask"][:num_samples], bool).sum(axis=1)
    return tokens_NxL, lengths_N


# ----------------------------------------------------------------------------- decoding


# Below this temperature sampling is greedy: the scaled logits' gaps would exceed what
# float32 separates from the Gumbel noise's (and 1e-45 overflowed logits / T to inf).
GREEDY_BELOW = 1e-6


def make_sampler(*, lm_loss: str, vocab_size: int, temperature: float, top_k: int,
                 pad_id: int | None):
    """sample(out_Bx(V), key) -> next token ids_B, from the head's outputs at one position.

    Temperature T: 0 (or below GREEDY_BELOW) is argmax; inf samples uniformly among the
    tokens that may be sampled (the top_k, never padding); otherwise the Gumbel-max draw
    argmax(logits / T + g), computed as argmax(logits + T g) for T < 1 (the same draw,
    without dividing by a small T)."""
    import jax
    import jax.numpy as jnp

    check_temperature(temperature)
    greedy = temperature < GREEDY_BELOW

    def sample(out, key):
        if lm_loss == "l1":  # one predicted intensity in [0, 1] per row
            return jnp.round(jnp.clip(out, 0.0, 1.0) * (vocab_size - 1)).astype(jnp.int32)
        # A start-token model's head has one more logit, the start id's: never sampled.
        logits_BxV = out.astype(jnp.float32)[:, :vocab_size]
        if pad_id is not None:
            logits_BxV = logits_BxV.at[:, pad_id].set(-jnp.inf)
        if greedy:
            return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
        if top_k:
            kth_Bx1 = jax.lax.top_k(logits_BxV, min(top_k, vocab_size))[0][:, -1:]
            logits_BxV = jnp.where(logits_BxV < kth_Bx1, -jnp.inf, logits_BxV)
        gumbel_BxV = jax.random.gumbel(key, logits_BxV.shape, jnp.float32)
        allowed_BxV = logits_BxV > -jnp.inf
        if temperature == float("inf"):
            scores_BxV = gumbel_BxV
        elif temperature >= 1:  # neither form overflows on its side of 1
            scores_BxV = logits_BxV / jnp.float32(temperature) + gumbel_BxV
        else:
            scores_BxV = logits_BxV + jnp.float32(temperature) * gumbel_BxV
        return jnp.argmax(jnp.where(allowed_BxV, scores_BxV, -jnp.inf),
                          axis=-1).astype(jnp.int32)

    return sample


def check_temperature(temperature: float) -> None:
    """FlagError unless 0 <= temperature <= inf (nan is refused)."""
    if not temperature >= 0:  # nan compares false
        raise FlagError(f"--temperature={temperature}: give 0 (greedy, argmax), a positive "
                        "number, or inf (uniform over the tokens that may be sampled)")


def decode(model: Any, prompts_BxP: np.ndarray, prompt_lens_B: np.ndarray,
           new_tokens_B: np.ndarray, sample, seed: int) -> tuple[np.ndarray, dict]:
    """The new tokens (BxN, N = max new_tokens; row b's first new_tokens[b] are its own)
    and timings. Row b's prompt is prompts[b, :prompt_lens[b]]; its new token k sits at
    position prompt_lens[b] + k.

    One prefill; then one jitted scan of N - 1 steps: step i feeds every row its new token
    i and samples new token i + 1 from the step's output. A row that has all its tokens
    keeps its cache (a select per leaf: every cache leaf is batch-leading), so no row is
    ever fed a position past prompt_len + new_tokens - 2 (<= max_length - 2; with a start
    token, whose prompts are one longer, <= max_length - 1)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from models import decoding

    batch = prompts_BxP.shape[0]
    steps = int(new_tokens_B.max()) - 1
    graphdef, state = decoding.split(model)
    mask_BxP = np.arange(prompts_BxP.shape[1])[None] < prompt_lens_B[:, None]
    key_prefill, key_steps = jax.random.split(jax.random.key(seed))

    def prefill(state, prompts_BxP, mask_BxP, lens_B, key):
        model = nnx.merge(graphdef, state)
        out, cache = model.prefill(model.init_cache(batch), prompts_BxP, mask_BxP)
        # out[:, t] predicts token t + 1: the first new token from the prompt's last one.
        return sample(decoding.row_at(out, lens_B - 1), key), cache

    def scan(state, cache, first_B, new_tokens_B, key):
        def body(carry, i):
            cache, token_B = carry
            out, stepped = nnx.merge(graphdef, state).step(cache, token_B)
            active_B = i < new_tokens_B - 1  # row b still has new token i + 1 to make
            cache = jax.tree.map(
                lambda new, old: jnp.where(active_B.reshape(-1, *[1] * (new.ndim - 1)),
                                           new, old), stepped, cache)
            next_B = jnp.where(active_B, sample(out, jax.random.fold_in(key, i)), token_B)
            return (cache, next_B), next_B

        (cache, _), tokens_NxB = jax.lax.scan(body, (cache, first_B), jnp.arange(steps))
        # The cache is returned so that its donated buffers are the loop's own (in place).
        return tokens_NxB, cache

    start = time.perf_counter()
    first_B, cache = jax.jit(prefill)(state, jnp.asarray(prompts_BxP), jnp.asarray(mask_BxP),
                                      jnp.asarray(prompt_lens_B, jnp.int32), key_prefill)
    first_B = jax.block_until_ready(first_B)
    timing = {"prefill_s": time.perf_counter() - start, "steps": steps, "batch": batch,
              # A copy: the cache is donated to the scan below.
              "tokens_held_B": np.array(cache["pos"], copy=True)}
    if steps == 0:
        return np.asarray(first_B)[:, None], timing
    for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
        if leaf.ndim == 0 or leaf.shape[0] != batch:  # the per-row select needs it
            raise RuntimeError(f"cache leaf {jax.tree_util.keystr(path)} of shape "
                               f"{leaf.shape} is not batch-leading")
    args = (state, cache, first_B, jnp.asarray(new_tokens_B, jnp.int32), key_steps)
    start = time.perf_counter()
    compiled = jax.jit(scan, donate_argnums=1).lower(*args).compile()
    timing["compile_s"] = time.perf_counter() - start
    start = time.perf_counter()
    tokens_NxB, cache = compiled(*args)
    tokens_NxB = jax.block_until_ready(tokens_NxB)
    timing["scan_s"] = time.perf_counter() - start
    timing["tokens_held_B"] = np.asarray(cache["pos"])  # each row's tokens in its cache
    tokens_BxN = np.concatenate([np.asarray(first_B)[:, None], np.asarray(tokens_NxB).T], 1)
    return tokens_BxN, timing


# ----------------------------------------------------------------------------- output


def token_id(task_name: str, vocab_size: int, token: str, pixels: bool) -> int:
    """The id of --stop_token: `id:N`, or one token as samples.txt writes it
    (lra.reporting.samples.tokens_to_text; ListOps: a word of its vocabulary; text8: one of
    its 27 characters; Text, enwik8: a character of one byte). FlagError otherwise."""
    if pixels:
        raise FlagError(f"--stop_token={token}: a pixel task's rows end with their image; "
                        "no token stops them")
    if token.startswith("id:"):
        try:
            i = int(token[3:])
        except ValueError:
            i = -1
        if not 0 <= i < vocab_size:
            raise FlagError(f"--stop_token={token}: give id:N with 0 <= N < {vocab_size} "
                            f"(the {task_name} vocabulary)")
        return i
    if task_name == "listops":
        from lra.tasks.listops import VOCAB

        if token in VOCAB:
            return VOCAB.index(token) + 1
        raise FlagError(f"--stop_token={token}: not a ListOps token; give one of "
                        f"{' '.join(VOCAB)} or id:N")
    if task_name == "text8":
        from lra.tasks.enwik8 import TEXT8_ALPHABET

        if len(token) == 1 and token.encode() in TEXT8_ALPHABET:
            return TEXT8_ALPHABET.index(token.encode()) + 1
        raise FlagError(f"--stop_token={token!r}: give one text8 character (a-z or a "
                        "space) or id:N")
    from lra.tasks.text import BYTE_OFFSET

    raw = token.encode("utf-8")
    if len(raw) != 1:
        raise FlagError(f"--stop_token={token!r}: give one character of one byte (the "
                        f"{task_name} tokens are bytes) or id:N")
    return raw[0] + BYTE_OFFSET


# ----------------------------------------------------------------------------- generate


def generate(workdir: str, *, num_samples: int = 4, max_new_tokens: int | None = None,
             prompt_len: int | None = None, temperature: float = 1.0, top_k: int = 0,
             seed: int = 0, output: str | None = None, data_dir: str | None = None,
             stop_token: str | None = None) -> dict:
    """Samples continuations of test examples from a causal_lm run; writes and prints them.

    Returns {"samples": [{"index", "length", "prompt", "generated", "original", "stop"}],
    "path": the file written, "step", "kind" (the checkpoint), "tokens_per_sec", ...}.
    Raises a UserError (one line) for anything the user can fix."""
    if num_samples < 1:
        raise FlagError(f"--num_samples={num_samples}: give at least 1")
    check_temperature(temperature)
    if top_k < 0:
        raise FlagError(f"--top_k={top_k}: give 0 (all tokens) or a positive count")
    if prompt_len is not None and prompt_len < 0:
        raise FlagError(f"--prompt_len={prompt_len}: a prompt needs at least 1 token (0 "
                        "with a run that has a start token: config.start_token)")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise FlagError(f"--max_new_tokens={max_new_tokens}: give at least 1 (default: up "
                        "to max_length)")
    config, config_from = load_config(workdir)
    check_run(config, workdir)
    start = bool(config.get("start_token", False))
    if prompt_len == 0 and not start:
        raise FlagError("--prompt_len=0: a prompt needs at least 1 token (the model has no "
                        "start token: its first prediction is of the second token)")
    max_length = int(config.max_length)
    if prompt_len is not None and prompt_len >= max_length:
        raise FlagError(f"--prompt_len={prompt_len} leaves no room to generate: the run's "
                        f"max_length is {max_length}; give at most {max_length - 1}")

    import lra.tasks
    from configs.common import PIXEL_TASKS
    from lra.training.console import log, warn

    task = lra.tasks.get(config.task)
    pixels = config.task in PIXEL_TASKS
    stop_id = None if stop_token is None else token_id(config.task, task.vocab_size,
                                                        stop_token, pixels)
    model = build(config, task)
    step, kind = restore(model, workdir)
    from models import precision

    # Decode in the dtype the run computed in (config.dtype; float32 for older runs).
    model = precision.compute_view(model, precision.dtype_of(config.get("dtype", "float32")))
    data_dir = data_dir or config.data_dir
    tokens_NxL, lengths_N = load_test_examples(config, task, data_dir, num_samples)
    if len(lengths_N) < num_samples:
        warn(f"--num_samples={num_samples}: the test split of {data_dir} has "
             f"{len(lengths_N)} examples; generating {len(lengths_N)}")

    # Prompts and how many new tokens each row gets: up to max_length, or for an image up
    # to its last pixel (the readers pad an image shorter than max_length).
    given_N = (np.minimum(prompt_len, lengths_N) if prompt_len is not None
               else np.maximum(1, lengths_N // 2))
    limit_N = lengths_N if pixels else np.full_like(lengths_N, max_length)
    if np.any(given_N >= limit_N):
        raise FlagError(f"--prompt_len={prompt_len} covers the whole image ("
                        f"{int(lengths_N.min())} pixels): nothing is left to generate; give "
                        f"at most {int(lengths_N.min()) - 1}")
    if prompt_len is not None and np.any(lengths_N < prompt_len):
        warn(f"--prompt_len={prompt_len}: {int(np.sum(lengths_N < prompt_len))} of the test "
             "examples are shorter; their prompt is the whole example")
    room_N = limit_N - given_N
    new_N = room_N if max_new_tokens is None else np.minimum(max_new_tokens, room_N)
    if max_new_tokens is not None and np.any(max_new_tokens > room_N):
        end = "its image" if pixels else f"max_length={max_length}"
        warn(f"--max_new_tokens={max_new_tokens} goes past {end} for "
             f"{int(np.sum(max_new_tokens > room_N))} of {len(new_N)} samples; they stop "
             f"there (new tokens: {', '.join(str(int(n)) for n in new_N)})")
    prompts_NxP = tokens_NxL[:, :int(given_N.max())] * (
        np.arange(int(given_N.max()))[None] < given_N[:, None])
    fed_N = given_N
    if start:  # the start token first: the output after prompt token p predicts token p + 1
        prompts_NxP = np.concatenate(
            [np.full((len(given_N), 1), task.vocab_size, prompts_NxP.dtype), prompts_NxP], 1)
        fed_N = given_N + 1

    lm_loss = config.get("lm_loss", "xent")
    sample = make_sampler(lm_loss=lm_loss, vocab_size=task.vocab_size, temperature=temperature,
                          top_k=top_k, pad_id=0 if config.task in TEXT_TASKS else None)
    what = ("each pixel is the predicted intensity, rounded (lm_loss l1: nothing is sampled)"
            if lm_loss == "l1" else
            "greedy (argmax)" if temperature < GREEDY_BELOW else
            f"temperature {temperature:g}" + (f", top_k {top_k}" if top_k else "")
            + f", seed {seed}")
    log(f"{config.model} on {config.task} (causal_lm, {lm_loss}), {kind} checkpoint step {step} "
        f"of {workdir}; {len(new_N)} test examples of {data_dir}"
        f"{' (first document)' if task.dual_input else ''}; {what}")
    tokens_NxT, timing = decode(model, prompts_NxP, fed_N, new_N, sample, seed)

    samples = []
    for n in range(len(new_N)):
        p, g, length = int(given_N[n]), int(new_N[n]), int(lengths_N[n])
        stop = "" if g < room_N[n] else (
            ", to the end of the image" if pixels else f", stopped at max_length {max_length}")
        hits = [] if stop_id is None else np.flatnonzero(tokens_NxT[n, :g] == stop_id)
        if len(hits):
            g, stop = int(hits[0]) + 1, f", stopped at the stop token {stop_token!r}"
        samples.append({"index": n, "length": length, "prompt": tokens_NxL[n, :p].copy(),
                        "generated": tokens_NxT[n, :g].copy(),
                        "original": tokens_NxL[n, p:length].copy(), "stop": stop})
    output = output or os.path.join(workdir, "samples")
    try:
        os.makedirs(output, exist_ok=True)
        if pixels:
            path = os.path.join(output, "samples.png")
            colour = config.get("task_options", {}).get("pixels", "gray") == "rgb"
            rows = samples_lib.pixel_rows(samples, colour)
            samples_lib.write_png(path, samples_lib.png_grid(rows))
            side = rows[0][0].shape[0]
            log(f"wrote {path}: {len(samples)} rows (original | prompt | completed), "
                f"{side}x{side} pixels each{' (colour)' if colour else ''}")
        else:
            path = os.path.join(output, "samples.txt")
            report = samples_lib.text_report(config.task, samples)
            with open(path, "w", encoding="utf-8") as f:
                f.write(f"# {workdir}: {kind} checkpoint step {step}; {what}\n\n{report}")
            log(report)
            log(f"wrote {path}")
    except OSError as e:
        raise UserError(f"cannot write to --output={output}: {e.strerror or e}") from None
    rate = None
    if timing["steps"]:
        rate = timing["batch"] * timing["steps"] / timing["scan_s"]
        log(f"scan: {timing['steps']} steps x {timing['batch']} rows in "
            f"{timing['scan_s']:.3f} s = {rate:,.0f} tokens/s (after compilation, "
            f"{timing['compile_s']:.1f} s; prefill {timing['prefill_s']:.2f} s with "
            "compilation)")
    else:
        log(f"one new token per row, from the prefill ({timing['prefill_s']:.2f} s with "
            "compilation): no scan")
    return {"samples": samples, "path": path, "step": step, "kind": kind,
            "config_from": config_from, "tokens_per_sec": rate, "timing": timing}


# ----------------------------------------------------------------------------- command line


def define_flags(fv: flags.FlagValues) -> flags.FlagValues:
    # A FlagValues of its own: importing this module (tests, notebooks) claims no global
    # absl flag names, and main() can be called more than once in one process.
    flags.DEFINE_string("workdir", None, "Workdir of a causal_lm run (configs/<task>.py:"
                        "causal,pretrain).", flag_values=fv)
    flags.DEFINE_integer("num_samples", 4, "Test examples to continue, from the first.",
                         flag_values=fv)
    flags.DEFINE_integer("max_new_tokens", None, "New tokens per sample (default: up to "
                         "max_length; pixel tasks: to the end of the image).", flag_values=fv)
    flags.DEFINE_integer("prompt_len", None, "Tokens of each test example given as the prompt "
                         "(default: half of each example, at least 1; 0 with a start-token "
                         "run: whole samples).", flag_values=fv)
    flags.DEFINE_float("temperature", 1.0, "Sampling temperature; 0 = greedy (argmax).",
                       flag_values=fv)
    flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0 = all).",
                         flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Sampling seed.", flag_values=fv)
    flags.DEFINE_string("stop_token", None, "End a row's continuation at the first such "
                        "token (the task's text of one token, e.g. ListOps ']', or id:N).",
                        flag_values=fv)
    flags.DEFINE_string("output", None, "Output folder (default: <workdir>/samples/).",
                        flag_values=fv)
    flags.DEFINE_string("data_dir", None, "The task's data (default: the run's "
                        "config.data_dir).", flag_values=fv)
    flags.DEFINE_bool("help", False, "Show this help.", short_name="h", flag_values=fv)
    return fv


def main(argv: list[str] | None = None) -> int:
    """`python -m lra.generate --workdir=...`: the exit code (0; 2 for a user's mistake,
    said in one line)."""
    fv = define_flags(flags.FlagValues())
    from lra.training.console import parse_flags

    code = parse_flags(fv, sys.argv if argv is None else argv, __doc__)
    if code is not None:
        return code
    if not fv.workdir:
        print("error: --workdir is required: the workdir of a causal_lm run "
              "(python launch.py --config=configs/<task>.py:causal,pretrain --workdir=<dir>)",
              file=sys.stderr)
        return EXIT_USER_ERROR
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    try:
        generate(fv.workdir, num_samples=fv.num_samples, max_new_tokens=fv.max_new_tokens,
                 prompt_len=fv.prompt_len, temperature=fv.temperature, top_k=fv.top_k,
                 seed=fv.seed, output=fv.output, data_dir=fv.data_dir,
                 stop_token=fv.stop_token)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
