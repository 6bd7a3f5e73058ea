r"""MAD's six synthetic tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid
Architectures"; athms/mad-lab): generators, readers and task registration.

One function per task returns numpy (inputs, labels) of shape (num_examples, length), -100
where a label is ignored, with MAD's parameter names and its baseline settings as
defaults (configs/tasks/<task>.yml, last changed in d27bf5c, and mad/configs.py MADConfig,
mad-lab commit 35772e898914dd7d1592e8fbff295448bc31134b):

  generate_in_context_recall(vocab_size=16, seq_len=128, multi_query=True, ...)
  generate_fuzzy_in_context_recall(vocab_size=16, seq_len=128, k_motif_size=3,
                                   v_motif_size=3, multi_query=True, ...)
  generate_noisy_in_context_recall(vocab_size=32, seq_len=128, noise_vocab_size=16,
                                   frac_noise=0.2, multi_query=True, ...)
  generate_selective_copying(vocab_size=16, seq_len=256, num_tokens_to_copy=16, ...)
  generate_compression(vocab_size=16, seq_len=32, ...)
  generate_memorization(vocab_size=256, seq_len=32, ...)

each also taking num_examples (default 1,280, MADConfig.num_test_examples), seed (12,345,
MADConfig.seed) and is_training. The instances are MAD's `generate_*_instance` functions
(mad/data/instances.py) ported line for line: the same draws from the same numpy
Generator in the same order, so that `generate_splits` (MAD's train then test set, from
one `np.random.default_rng(seed)` as mad/data/dataset.py generate_data draws them) gives
MAD's rows exactly (results/cpu/mqar_mad_generators.md). What MAD does, kept:

  - in-context recall (and noisy, fuzzy): with is_training the labels are the next
    tokens everywhere (language modelling, `inputs[1:]`); the test set labels only the
    recalls (with multi_query, each value whose key appeared before; the final probe's
    value). With multi_query its rows are seq_len - 1 tokens long (the reader pads them).
  - fuzzy in-context recall: keys and values are motifs of 1..3 tokens; rows are
    left-padded with a pad token (vocab_size - 1 with multi_query) to seq_len.
  - selective copying: the blanks' positions come from numpy's global generator
    (np.random.randint; MAD's train.py seeds it with np.random.seed(seed)): here a
    RandomState(seed) that continues from the train to the test set as the global one
    does. The labels sit on the blanks after the copy token.
  - memorization: a fixed key -> value map (generate_kv_map over vocab_size - 1 tokens,
    its own default_rng(seed): MADConfig's); a row is key, insert token pairs, the value
    labelled on the insert token. The test set is more draws from the same map.
  - compression: the labels are the inputs themselves (MAD returns `inputs, inputs`); MAD
    trains it with an auto-encoder backbone (mad/model/auto_encoder.py), not a language
    model: the task `mad_compression` builds models/autoencoder.py's SequenceAutoEncoder
    (this lab's encoder with any mixer, MAD's decoder).

In the loop (`configs/mad.py:task=<name>`, objective sequence_labels): generated on the fly
from config.task_options (no files): MAD's task parameters, num_train_examples,
num_test_examples, num_valid_examples, seed; seq_len is config.max_length. Validation is
num_valid_examples more test-like rows drawn after the test set (MAD has none: it
monitors its test set). results.json's test_accuracy is micro (per labelled position);
test_macro_accuracy is MAD's (torchmetrics' MulticlassAccuracy, whose default average is
macro: per class, then the mean over classes).
"""
from __future__ import annotations

import functools
from itertools import permutations
from typing import Any, Callable

import numpy as np

from lra.errors import ConfigError
from lra.tasks import registry

IGNORE = -100
SEED = 12345  # MADConfig.seed
NUM_TEST_EXAMPLES = 1280  # MADConfig.num_test_examples


# --- MAD's instance functions (mad/data/instances.py, MIT licence, Armin W. Thomas) ------
# Ported line for line: every draw from `rng` (a np.random.Generator) is MAD's, in MAD's
# order. Comments marked "MAD:" are MAD's.


def _exists(obj) -> bool:
    return obj is not None and obj != ''


def _vocab_permutations(vocab, token_motif_size: int = 1, rng=None) -> list:
    values = list(permutations(vocab, token_motif_size))
    if _exists(rng):
        rng.shuffle(values)
    return values


def _in_context_recall_instance(vocab_size=16, seq_len=128, is_training=True, rng=None,
                                target_ignore_idx=IGNORE, multi_query=False,
                                noise_vocab_size=16, frac_noise=0., **_):
    copy_prefix = vocab_size - 1
    non_special_vocab_size = vocab_size - 1 if not multi_query else vocab_size
    non_special_vocab_size -= noise_vocab_size
    key_vocab = np.arange(non_special_vocab_size // 2)
    value_vocab = np.arange(non_special_vocab_size // 2, non_special_vocab_size)
    if frac_noise > 0:
        noise_vocab = np.arange(non_special_vocab_size, non_special_vocab_size + noise_vocab_size)
    kv_map, inputs, targets, keys_presented = {}, [], [], {}
    kv_motif_size = 2
    num_kv_pairs = seq_len // kv_motif_size
    not_noise_idx = rng.choice(num_kv_pairs)  # MAD: at least one key-value pair
    for i in range(num_kv_pairs - 1):  # MAD: one less for the final key-value pair
        is_noise = rng.random() < frac_noise if i != not_noise_idx and frac_noise > 0 else False
        if is_noise:
            noise = rng.choice(noise_vocab, size=kv_motif_size, replace=True)
            inputs += list(noise)
            targets += [target_ignore_idx] * kv_motif_size
        else:
            k = rng.choice(key_vocab)
            if k not in kv_map:
                v = rng.choice(value_vocab)
                kv_map[k] = v
            else:
                v = kv_map[k]
            inputs.append(k)
            inputs.append(v)
            targets.append(target_ignore_idx)
            if k not in keys_presented:
                targets.append(target_ignore_idx)
            else:
                targets.append(v if multi_query else target_ignore_idx)
            keys_presented[k] = v
    k_probe = rng.choice(list(keys_presented.keys()))
    v_probe = keys_presented[k_probe]
    if not multi_query:
        inputs.append(copy_prefix)
    inputs.append(k_probe)
    inputs.append(v_probe)
    if not multi_query:
        targets.append(-100)  # MAD: copy prefix
    targets.append(-100)  # MAD: k_probe
    targets.append(v_probe)
    inputs = np.array(inputs).astype(int)
    targets = np.array(targets).astype(int)
    if is_training:
        return inputs[:-1], inputs[1:]  # MAD: use shifted inputs as targets for training
    return inputs[:-1], targets[1:]


def _fuzzy_in_context_recall_instance(vocab_size=16, seq_len=128, k_motif_size=3,
                                      v_motif_size=3, is_training=True, rng=None,
                                      target_ignore_idx=IGNORE, multi_query=False,
                                      noise_vocab_size=0, frac_noise=0, **_):
    copy_prefix = vocab_size - 1
    pad_token = vocab_size - 2 if not multi_query else vocab_size - 1
    non_special_vocab_size = vocab_size - 2 if not multi_query else vocab_size - 1
    non_special_vocab_size -= noise_vocab_size
    key_vocab = np.arange(non_special_vocab_size // 2)
    value_vocab = np.arange(non_special_vocab_size // 2, non_special_vocab_size)
    if is_training:
        keys = {}
        for motif_size in range(1, k_motif_size + 1):
            keys[motif_size] = _vocab_permutations(key_vocab, motif_size, rng)
        values = {}
        for motif_size in range(1, v_motif_size + 1):
            values[motif_size] = _vocab_permutations(value_vocab, motif_size, rng)
    else:
        # MAD: we always prompt at the maximum key motif size
        keys = {k_motif_size: _vocab_permutations(key_vocab, k_motif_size, rng)}
        values = {}
        for motif_size in range(1, v_motif_size + 1):
            values[motif_size] = _vocab_permutations(value_vocab, motif_size, rng)
    if frac_noise > 0:
        noise_vocab = np.arange(non_special_vocab_size, non_special_vocab_size + noise_vocab_size)
    k_probe_size = rng.choice(list(keys.keys())) if is_training else k_motif_size
    v_probe_size = rng.choice(list(values.keys()))
    k_probe = tuple(rng.choice(keys[k_probe_size]))
    v_probe = tuple(rng.choice(values[v_probe_size]))
    kv_probe_size = k_probe_size + v_probe_size
    probe_idx = rng.choice(seq_len - kv_probe_size - kv_probe_size)
    probe_added = False
    kv_map = {s: {} for s in range(1, k_motif_size + 1)}
    inputs, targets, keys_presented = [], [], {}
    while len(inputs) < seq_len - kv_probe_size - (k_motif_size + v_motif_size):
        k_size = rng.choice(list(keys.keys())) if is_training else k_motif_size
        v_size = rng.choice(list(values.keys()))
        if len(inputs) >= probe_idx and not probe_added:
            inputs.extend(k_probe)
            inputs.extend(v_probe)
            targets.extend(tuple([target_ignore_idx] * (k_probe_size + len(v_probe))))
            kv_map[k_probe_size][k_probe] = v_probe
            keys_presented[k_probe] = v_probe
            probe_added = True
            continue
        is_noise = rng.random() < frac_noise if frac_noise > 0 else False
        if is_noise:
            noise_size = k_size + v_size
            noise = rng.choice(noise_vocab, size=noise_size, replace=True)
            inputs.extend(noise)
            targets.extend(tuple([target_ignore_idx] * noise_size))
        else:
            k = tuple(rng.choice(keys[k_size]))
            inputs.extend(k)
            if k == k_probe:
                v = v_probe
                probe_added = True
            else:
                if k not in kv_map[k_size]:
                    v = tuple(rng.choice(values[v_size]))
                    kv_map[k_size][k] = v
                else:
                    v = kv_map[k_size][k]
            inputs.extend(v)
            targets.extend(tuple([target_ignore_idx] * k_size))
            if k not in keys_presented or not multi_query:
                targets.extend(tuple([target_ignore_idx] * len(v)))
            else:
                targets.extend(v)  # MAD: probe value if key has been presented before
            keys_presented[k] = v
    if not multi_query:
        inputs.extend(tuple([copy_prefix]))
    inputs.extend(k_probe)
    inputs.extend(v_probe)
    if not multi_query:
        targets.extend(tuple([-100]))
    targets.extend(tuple([-100] * k_probe_size))
    targets.extend(v_probe)
    inputs = np.array(inputs).astype(int)
    targets = np.array(targets).astype(int)
    if len(inputs) < (seq_len + 1):  # MAD: add one to account for autoregressive shift
        n_pad = seq_len + 1 - len(inputs)
        inputs = np.concatenate([np.array([pad_token] * n_pad), inputs])
        targets = np.concatenate([np.array([target_ignore_idx] * n_pad), targets])
    if is_training:
        return inputs[:-1], inputs[1:]
    return inputs[:-1], targets[1:]


def generate_kv_map(vocab_size: int, k_motif_size: int = 1, v_motif_size: int = 1,
                    seed: int = 12345) -> dict:
    """MAD's fixed key -> value map of the memorization task (its own default_rng(seed))."""
    kv_map_rng = np.random.default_rng(seed)
    key_vocab = np.arange(vocab_size // 2)
    value_vocab = np.arange(vocab_size // 2, vocab_size)
    keys = _vocab_permutations(key_vocab, k_motif_size, kv_map_rng)
    values = _vocab_permutations(value_vocab, v_motif_size, kv_map_rng)
    return {k: v for k, v in zip(keys, values)}


def _memorization_instance(vocab_size=256, seq_len=32, kv_map=None, noise_vocab_size=0,
                           frac_noise=0, rng=None, target_ignore_idx=IGNORE,
                           kv_map_seed=12345, **_):
    insert_token = vocab_size - 1
    non_special_vocab_size = vocab_size - 1
    non_special_vocab_size -= noise_vocab_size
    if not _exists(kv_map):
        kv_map = generate_kv_map(non_special_vocab_size, 1, 1, seed=kv_map_seed)
    keys = list(kv_map.keys())
    if frac_noise > 0:
        noise_vocab = np.arange(non_special_vocab_size, non_special_vocab_size + noise_vocab_size)
    inputs, targets = [], []
    kv_motif_size = 2
    num_kv_pairs = seq_len // kv_motif_size
    not_noise_idx = rng.choice(num_kv_pairs)
    for i in range(num_kv_pairs):
        is_noise = rng.random() < frac_noise if i != not_noise_idx and frac_noise > 0 else False
        if is_noise:
            noise = rng.choice(noise_vocab, size=kv_motif_size, replace=True)
            inputs.append(noise)
            targets.append([target_ignore_idx] * kv_motif_size)
        else:
            k = tuple(rng.choice(keys))
            v = kv_map[k]
            inputs.append(k)
            inputs.append([insert_token])
            targets.append([target_ignore_idx])
            targets.append(v)
    return (np.concatenate(inputs).astype(int), np.concatenate(targets).astype(int))


def _compression_instance(vocab_size=16, seq_len=32, noise_vocab_size=0, frac_noise=0,
                          rng=None, target_ignore_idx=IGNORE, **_):
    compression_token = vocab_size - 1
    non_special_vocab_size = vocab_size - 1
    non_special_vocab_size -= noise_vocab_size
    vocab = np.arange(non_special_vocab_size)
    inputs = rng.choice(vocab, size=(seq_len - 1,), replace=True).reshape(-1)
    inputs = np.concatenate([inputs, np.array([compression_token])])
    targets = np.array(inputs)
    if frac_noise > 0:
        noise_vocab = np.arange(non_special_vocab_size, non_special_vocab_size + noise_vocab_size)
        for i in range(seq_len - 1):  # MAD: exclude compression token
            if rng.random() < frac_noise:
                inputs[i:(i + 1)] = rng.choice(noise_vocab)
                targets[i:(i + 1)] = target_ignore_idx
    return inputs, inputs  # MAD returns the inputs twice (its noisy targets are unused)


def _selective_copying_instance(vocab_size=16, seq_len=256, num_tokens_to_copy=16,
                                rng=None, target_ignore_idx=IGNORE, np_random=None, **_):
    copy_token = vocab_size - 1
    blank_token = vocab_size - 2
    non_special_vocab_size = vocab_size - 2
    vocab = np.arange(non_special_vocab_size)
    num_blank_tokens = seq_len - (num_tokens_to_copy * 2) - 1
    to_copy = rng.choice(vocab, size=(num_tokens_to_copy,), replace=True).reshape(-1)
    inputs = np.array(to_copy)
    # MAD: np.random.randint (numpy's global generator); here its stand-in, np_random.
    insert_indices = np_random.randint(0, len(inputs), num_blank_tokens)
    inputs = np.insert(inputs, insert_indices, [blank_token] * num_blank_tokens).tolist()
    inputs += [copy_token]
    inputs += [blank_token] * num_tokens_to_copy
    inputs = np.array(inputs)
    targets = [target_ignore_idx] * (num_tokens_to_copy + num_blank_tokens + 1)
    targets += list(to_copy)
    return inputs, np.array(targets)


# --- the tasks -----------------------------------------------------------------------


def _check(task: str, p: dict[str, Any]) -> None:
    """MAD's asserts and the impossible settings, as errors that say what to change."""
    V, L = p["vocab_size"], p["seq_len"]
    if L < 4:
        raise ConfigError(f"MAD {task}: seq_len={L} is too short")
    if task in ("in_context_recall", "noisy_in_context_recall", "fuzzy_in_context_recall"):
        if not 0 <= p["frac_noise"] < 1:
            raise ConfigError(f"MAD {task}: frac_noise={p['frac_noise']} must be in [0, 1)")
        if p["frac_noise"] > 0 and p["noise_vocab_size"] < 1:
            raise ConfigError(f"MAD {task}: noise_vocab_size must be > 0 if frac_noise > 0")
        if task != "fuzzy_in_context_recall" and L % 2:
            raise ConfigError(f"MAD {task}: seq_len={L} must be even")
        if V - p["noise_vocab_size"] - 2 < 2:
            raise ConfigError(f"MAD {task}: vocab_size={V} leaves no keys and values beside "
                              f"{p['noise_vocab_size']} noise tokens")
    if task == "selective_copying" and p["num_tokens_to_copy"] < 1:
        raise ConfigError(f"MAD selective_copying: num_tokens_to_copy="
                          f"{p['num_tokens_to_copy']} must be at least 1")
    if task == "fuzzy_in_context_recall" and min(p["k_motif_size"], p["v_motif_size"]) < 1:
        raise ConfigError(f"MAD {task}: k_motif_size={p['k_motif_size']} and v_motif_size="
                          f"{p['v_motif_size']} must be at least 1")
    if task == "selective_copying" and not L > 2 * p["num_tokens_to_copy"] + 1:
        raise ConfigError(f"MAD selective_copying: seq_len={L} must be > 2 x "
                          f"num_tokens_to_copy + 1 = {2 * p['num_tokens_to_copy'] + 1}")
    if task in ("selective_copying", "compression", "memorization") and V < 4:
        raise ConfigError(f"MAD {task}: vocab_size={V} is too small")


# name -> (instance function, the baseline of configs/tasks/<yml> over MADConfig's
# defaults, the yml's `changes`: the difficulty settings of the benchmark).
_MAD_DEFAULTS = {"vocab_size": 16, "seq_len": 128, "frac_noise": 0.0, "noise_vocab_size": 0,
                 "num_tokens_to_copy": 0, "k_motif_size": 1, "v_motif_size": 1,
                 "multi_query": True, "num_train_examples": 12_800}
TASKS: dict[str, tuple[Callable, dict[str, Any], dict[str, list]]] = {
    "in_context_recall": (
        _in_context_recall_instance,
        {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12800, "multi_query": True},
        {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024],
         "num_train_examples": [6400, 3200, 1600, 800]}),
    "fuzzy_in_context_recall": (
        _fuzzy_in_context_recall_instance,
        {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12800, "multi_query": True,
         "k_motif_size": 3, "v_motif_size": 3},
        {"vocab_size": [32, 64, 128], "seq_len": [256, 512, 1024],
         "num_train_examples": [6400, 3200, 1600, 800]}),
    "noisy_in_context_recall": (
        # MAD registers generate_noisy_in_context_recall_instance, which calls the
        # in-context recall instance with the noise settings.
        _in_context_recall_instance,
        {"vocab_size": 32, "noise_vocab_size": 16, "seq_len": 128, "num_train_examples": 12800,
         "multi_query": True, "frac_noise": 0.2},
        {"vocab_size": [48, 80, 144], "seq_len": [256, 512, 1024],
         "num_train_examples": [6400, 3200, 1600, 800], "frac_noise": [0.4, 0.6, 0.8]}),
    "selective_copying": (
        _selective_copying_instance,
        {"vocab_size": 16, "seq_len": 256, "num_tokens_to_copy": 16, "num_train_examples": 12800},
        {"vocab_size": [32, 64, 128], "seq_len": [512, 1024],
         "num_train_examples": [6400, 3200, 1600, 800], "num_tokens_to_copy": [32, 64, 96]}),
    "compression": (
        _compression_instance,
        {"vocab_size": 16, "seq_len": 32, "num_train_examples": 12800},
        {"vocab_size": [32, 64, 128], "seq_len": [64, 128, 256],
         "num_train_examples": [6400, 3200, 1600, 800]}),
    "memorization": (
        _memorization_instance,
        {"vocab_size": 256, "seq_len": 32, "num_train_examples": 256},
        {"vocab_size": [512, 1024, 2048, 4096, 8192]}),
}
PARAMS = ("vocab_size", "seq_len", "frac_noise", "noise_vocab_size", "num_tokens_to_copy",
          "k_motif_size", "v_motif_size", "multi_query")


def baseline(task: str) -> dict[str, Any]:
    """MAD's settings of `task` at its baseline difficulty: MADConfig's defaults with the
    yml's baseline over them (what mad/configs.py make_benchmark_mad_configs builds)."""
    return {**_MAD_DEFAULTS, **TASKS[task][1]}


def _params(task: str, overrides: dict[str, Any]) -> dict[str, Any]:
    if task not in TASKS:
        raise ConfigError(f"unknown MAD task {task!r}; MAD's tasks: {', '.join(TASKS)}")
    p = {k: v for k, v in baseline(task).items() if k in PARAMS}
    unknown = set(overrides) - set(PARAMS)
    if unknown:
        raise ConfigError(f"MAD {task}: unknown setting(s) {', '.join(sorted(unknown))}; "
                          f"MAD's: {', '.join(PARAMS)}")
    p.update(overrides)
    if task == "memorization":  # MADConfig: motifs > 1 are not supported there
        p["k_motif_size"] = p["v_motif_size"] = 1
    _check(task, p)
    return p


class _Stream:
    """MAD's random state for one data set: the Generator that train.py's
    mad_config.instance_fn_kwargs holds (default_rng(seed), shared by the train and the
    test set), the global numpy generator that train.py seeds (np.random.seed(seed): the
    selective copying blanks) and, for memorization, the key -> value map."""

    def __init__(self, task: str, p: dict[str, Any], seed: int):
        self.task, self.p = task, p
        self.rng = np.random.default_rng(seed)
        self.np_random = np.random.RandomState(seed)
        self.kv_map = (generate_kv_map(p["vocab_size"] - 1, 1, 1, seed=seed)
                       if task == "memorization" else None)

    def draw(self, num_examples: int, is_training: bool) -> tuple[np.ndarray, np.ndarray]:
        fn = TASKS[self.task][0]
        kwargs = dict(self.p, rng=self.rng, kv_map=self.kv_map, is_training=is_training,
                      np_random=self.np_random)
        rows = [fn(**kwargs) for _ in range(num_examples)]
        return (np.stack([r[0] for r in rows]).astype(np.int32),
                np.stack([r[1] for r in rows]).astype(np.int32))


def generate(task: str, *, num_examples: int = NUM_TEST_EXAMPLES, seed: int = SEED,
             is_training: bool = False, **settings: Any) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of one MAD task: num_examples rows from a fresh
    default_rng(seed), MAD's settings of the task's baseline unless given. Rows are
    seq_len long, except in-context recall and noisy in-context recall with multi_query
    (seq_len - 1, as MAD's)."""
    if num_examples < 1:
        raise ConfigError(f"MAD {task}: num_examples={num_examples} must be at least 1")
    return _Stream(task, _params(task, settings), seed).draw(num_examples, is_training)


def _generator(task: str) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    b = {k: v for k, v in baseline(task).items() if k in PARAMS}
    used = {"in_context_recall": ("vocab_size", "seq_len", "multi_query", "noise_vocab_size",
                                  "frac_noise"),
            "fuzzy_in_context_recall": ("vocab_size", "seq_len", "k_motif_size",
                                        "v_motif_size", "multi_query", "noise_vocab_size",
                                        "frac_noise"),
            "noisy_in_context_recall": ("vocab_size", "seq_len", "noise_vocab_size",
                                        "frac_noise", "multi_query"),
            "selective_copying": ("vocab_size", "seq_len", "num_tokens_to_copy"),
            "compression": ("vocab_size", "seq_len", "noise_vocab_size", "frac_noise"),
            "memorization": ("vocab_size", "seq_len", "noise_vocab_size", "frac_noise")}[task]

    def fn(*, num_examples: int = NUM_TEST_EXAMPLES, seed: int = SEED,
           is_training: bool = False, **settings: Any):
        extra = set(settings) - set(used)
        if extra:
            raise TypeError(f"generate_{task}() got unexpected settings {sorted(extra)}; "
                            f"its settings: {', '.join(used)}")
        return generate(task, num_examples=num_examples, seed=seed, is_training=is_training,
                        **settings)

    fn.__name__ = fn.__qualname__ = f"generate_{task}"
    fn.__doc__ = (f"MAD's {task.replace('_', ' ')}: (inputs, labels) of num_examples rows; "
                  f"settings {', '.join(f'{k}={b[k]!r}' for k in used)} (MAD's baseline).")
    return fn


generate_in_context_recall = _generator("in_context_recall")
generate_fuzzy_in_context_recall = _generator("fuzzy_in_context_recall")
generate_noisy_in_context_recall = _generator("noisy_in_context_recall")
generate_selective_copying = _generator("selective_copying")
generate_compression = _generator("compression")
generate_memorization = _generator("memorization")


def generate_splits(task: str, *, num_train_examples: int | None = None,
                    num_test_examples: int = NUM_TEST_EXAMPLES,
                    num_valid_examples: int = NUM_TEST_EXAMPLES, seed: int = SEED,
                    **settings: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """MAD's data set of a task setting: the train set (is_training) then the test set
    from one stream, as mad/data/dataset.py generate_data draws them in train.py; then the
    validation set (ours), num_valid_examples more test-like rows from the same stream."""
    p = _params(task, settings)
    n_train = baseline(task)["num_train_examples"] if num_train_examples is None else num_train_examples
    for name, n in (("num_train_examples", n_train), ("num_test_examples", num_test_examples),
                    ("num_valid_examples", num_valid_examples)):
        if n < 1:
            raise ConfigError(f"MAD {task}: {name}={n} must be at least 1")
    stream = _Stream(task, p, seed)
    train = stream.draw(n_train, True)
    test = stream.draw(num_test_examples, False)
    val = stream.draw(num_valid_examples, False)
    return {"train": train, "test": test, "val": val}


@functools.lru_cache(maxsize=2)
def _cached_splits(task: str, frozen: tuple) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return generate_splits(task, **dict(frozen))


def read_split(task: str, split: str, max_length: int, **options: Any) -> dict[str, np.ndarray]:
    """One split as the loop reads it: inputs, mask and per-position targets padded on the
    right to max_length (= seq_len; mask False, label -100 on the padding)."""
    if split not in registry.SPLITS:
        raise ValueError(f"split must be one of {registry.SPLITS}, got {split!r}")
    options = dict(options, seq_len=max_length)
    inputs, labels = _cached_splits(task, tuple(sorted(options.items())))[split]
    n, length = inputs.shape
    if length > max_length:
        raise ConfigError(f"MAD {task}: rows of {length} tokens, longer than max_length="
                          f"{max_length}")
    x = np.zeros((n, max_length), np.int32)
    y = np.full((n, max_length), IGNORE, np.int32)
    x[:, :length], y[:, :length] = inputs, labels
    mask = np.zeros((n, max_length), bool)
    mask[:, :length] = True
    return {"inputs": x, "mask": mask, "targets": y}


def majority_macro_accuracy(task: str, max_length: int, **options: Any) -> float:
    """MAD's metric (macro accuracy) of always predicting the most frequent label: 1 / the
    number of classes among the test labels (its class recalled in full, the others not at
    all), which is also what a uniform guess over those classes scores on average."""
    targets = read_split(task, "test", max_length, **options)["targets"]
    return 1.0 / len(np.unique(targets[targets != IGNORE]))


def _reader(task: str):
    b = baseline(task)
    settings = [k for k in PARAMS if k != "seq_len"]

    def read(data_dir: str, split: str, max_length: int, *,
             num_train_examples: int = b["num_train_examples"],
             num_test_examples: int = NUM_TEST_EXAMPLES,
             num_valid_examples: int = NUM_TEST_EXAMPLES, seed: int = SEED,
             **task_settings: Any) -> dict[str, np.ndarray]:
        del data_dir  # generated on the fly
        return read_split(task, split, max_length, num_train_examples=num_train_examples,
                          num_test_examples=num_test_examples,
                          num_valid_examples=num_valid_examples, seed=seed, **task_settings)

    # The registry checks option names against keyword-only parameters: list MAD's.
    import inspect
    params = [p for p in inspect.signature(read).parameters.values()
              if p.kind != p.VAR_KEYWORD]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=b[k])
               for k in settings]
    read.__signature__ = inspect.Signature(params)
    return read


def _vocab_size_of(task: str):
    def vocab(*, vocab_size: int | None = None, **_options) -> int:
        return int(baseline(task)["vocab_size"] if vocab_size is None else vocab_size)
    return vocab


LOOP_TASKS = ("in_context_recall", "fuzzy_in_context_recall", "noisy_in_context_recall",
              "selective_copying", "compression", "memorization")

for _task in LOOP_TASKS:
    registry.register(registry.Task(
        name=f"mad_{_task}",
        num_classes=baseline(_task)["vocab_size"],
        vocab_size=baseline(_task)["vocab_size"],
        max_length=baseline(_task)["seq_len"],
        reader=_reader(_task),
        sequence_labels=True,
        vocab_size_of=_vocab_size_of(_task),
        autoencoder=_task == "compression",  # MAD's auto-encoder backbone
        how_to_get_data="nothing to get: MAD's tasks are generated from config.task_options",
    ))
