"""Input pipeline: the task's splits read from config.data_dir (load_data) -> grain
batches, sharded over processes -> global arrays (to_global).

Training batches come from a grain `MapDataset` of example indices (shuffled afresh every
epoch, seeded), batched into *global* batches; each process gathers only its own rows of
each global batch. So the sequence of global batches is the same for any number of
processes, and the iterator's state (saved with every checkpoint) is one integer: a
resumed run sees exactly the batches an uninterrupted run would.

Evaluation batches walk a split in order; the last batch is padded with weight-0 rows.
"""
from __future__ import annotations

import os
from typing import Iterator

import grain
import jax
import numpy as np
from jax.sharding import NamedSharding

from lra.errors import ConfigError, DataError

Batch = dict[str, np.ndarray]


def _gather(arrays: dict[str, np.ndarray], idx: np.ndarray) -> Batch:
    return {k: v[idx] for k, v in arrays.items()}


def _process_rows(global_batch_size: int) -> slice:
    """Equal contiguous shares by process index (when no sharding says otherwise)."""
    n, p = jax.process_count(), jax.process_index()
    if global_batch_size % n:
        raise ConfigError(f"batch size {global_batch_size} is not divisible by {n} processes")
    local = global_batch_size // n
    return slice(p * local, (p + 1) * local)


def process_rows(sharding: jax.sharding.Sharding, global_batch_size: int) -> slice:
    """The rows of a global batch that this process's devices hold under `sharding`.

    They must be one contiguous block (true of a batch split over a mesh axis: a
    process's devices hold neighbouring rows, possibly repeated over a model axis).
    """
    index_map = sharding.addressable_devices_indices_map((global_batch_size,))
    spans = sorted({(idx[0].start or 0, global_batch_size if idx[0].stop is None
                     else idx[0].stop) for idx in index_map.values()})
    start, stop = spans[0][0], spans[-1][1]
    covered = sum(b - a for a, b in spans)
    if covered != stop - start:
        raise ConfigError(f"this process's devices hold rows {spans} of the batch: not one "
                          "contiguous block; use a mesh whose data axis groups each "
                          "process's devices")
    return slice(start, stop)


def train_iterator(arrays: dict[str, np.ndarray], *, global_batch_size: int, seed: int,
                   rows: slice | None = None):
    """An endless, checkpointable iterator (`get_state`/`set_state`) of local batches:
    `rows` of each global batch (default: this process's equal share)."""
    num_examples = len(arrays["targets"])
    if num_examples < global_batch_size:
        raise DataError(
            f"training split has {num_examples} examples, fewer than one batch "
            f"({global_batch_size}); lower config.batch_size or add data"
        )
    rows = _process_rows(global_batch_size) if rows is None else rows
    dataset = (
        grain.MapDataset.range(num_examples)
        .shuffle(seed=seed)
        .repeat(None)
        .batch(global_batch_size, drop_remainder=True)
        .map(lambda idx: _gather(arrays, np.asarray(idx)[rows]))
    )
    # Two threads keep a few batches ready; grain's state stays exact regardless.
    options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)
    return iter(dataset.to_iter_dataset(options))


def eval_batches(arrays: dict[str, np.ndarray], *, global_batch_size: int,
                 num_batches: int = -1, rows: slice | None = None) -> Iterator[Batch]:
    """Local batches over a split in order, with a `weights` entry (0 on padding rows)."""
    num_examples = len(arrays["targets"])
    total = -(-num_examples // global_batch_size)
    if num_batches >= 0:
        total = min(total, num_batches)
    rows = _process_rows(global_batch_size) if rows is None else rows
    for b in range(total):
        idx = np.arange(b * global_batch_size, (b + 1) * global_batch_size)
        weights = (idx < num_examples).astype(np.float32)
        batch = _gather(arrays, np.minimum(idx, num_examples - 1)[rows])
        batch["weights"] = weights[rows]
        yield batch


def load_data(config, task) -> dict[str, dict[str, np.ndarray]]:
    """The three splits; unreadable files are a DataError naming the file (and line)."""
    data_dir = config.data_dir
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise DataError(f"config.data_dir={data_dir} is a file, not a folder; give the folder "
                        f"that holds the {config.task} data")
    data = {}
    for split in ("train", "val", "test"):
        try:
            data[split] = task.load(data_dir, split, config.max_length,
                                    **config.task_options.to_dict())
        except UnicodeDecodeError as e:
            raise DataError(not_utf8(e, data_dir)) from None
        except OSError as e:  # no permission, a folder where a file should be, I/O error
            raise DataError(f"cannot read {e.filename or data_dir}: {e.strerror or e}") from None
    return data


def not_utf8(error: UnicodeDecodeError, data_dir: str) -> str:
    """'<file>:<line>: byte 0x.. is not UTF-8', the file found in the reader's frames."""
    path = None
    tb = error.__traceback__
    while tb is not None:
        for name in ("path", "filename", "file_path"):
            value = tb.tb_frame.f_locals.get(name)
            if isinstance(value, str) and os.path.isfile(value):
                path = value
        tb = tb.tb_next
    if path is None:
        return f"a file in {data_dir} is not UTF-8 text ({error.reason}); fix or regenerate it"
    with open(path, "rb") as f:
        raw = f.read()
    try:
        raw.decode("utf-8")
        return f"{path} is not UTF-8 text ({error.reason}); fix or regenerate it"
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        return (f"{path}:{line}: byte 0x{raw[e.start]:02x} is not UTF-8 text; fix or "
                "regenerate the file")


def to_global(batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """This process's rows of a global batch as global arrays (the other processes hold
    the other rows)."""
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
