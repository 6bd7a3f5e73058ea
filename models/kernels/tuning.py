"""Tiles and launch parameters of the Triton kernels, from a committed table (issue 70, 2).

`models/kernels/tuning.json` holds one entry per (kernel, device kind, dtype, head dim,
length bucket): the chunk (linear, decayed, delta) or tile (block_sparse), Triton's
`num_warps` and `num_stages`, the forward+backward time it was chosen on and where it came
from. `lra.bench_kernels --tune` measures the candidates below on the GPU it runs on and
writes the fastest into the table (the GPU suite's first stage when a GPU is lent).

A compiled GPU call with its chunk or tile left unset takes the entry for its shape; a
shape the table lacks takes the nearest entry (same kernel; then the same device kind,
dtype, nearest head dim, nearest length, in that order) and says which, once. The
interpreter on CPU and the TPU kernels are unaffected: their tiles are the kernels' own
defaults. Entries whose `source` is "default" are those defaults, not measurements.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Any, Iterator, Mapping

import jax

from models.kernels import targets

TABLE = os.path.join(os.path.dirname(__file__), "tuning.json")
KERNELS = ("linear", "decayed", "delta", "block_sparse")
# The parameter that sets the tile of each kernel, and every candidate --tune times.
TILE_PARAM = {"linear": "chunk", "decayed": "chunk", "delta": "chunk", "block_sparse": "block"}
CANDIDATES: dict[str, dict[str, tuple[int, ...]]] = {
    "linear": {"chunk": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2)},
    "decayed": {"chunk": (32, 64), "num_warps": (4, 8), "num_stages": (1, 2)},
    "delta": {"chunk": (32, 64), "num_warps": (4, 8), "num_stages": (1, 2)},
    "block_sparse": {"block": (64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
}
_FORCED: list[tuple[str, Mapping[str, int]]] = []


def length_bucket(length: int) -> int:
    """The table's length key: the next power of two."""
    return 1 << max(0, int(length) - 1).bit_length()


def device_kind() -> str | None:
    """The GPU the program is for: this host's, else the abstract device a lowering names
    (`targets.abstract_gpu`), else None."""
    if jax.default_backend() == "gpu":
        return jax.devices()[0].device_kind
    try:
        device = jax.sharding.get_abstract_mesh().abstract_device
    except AttributeError:
        return None
    return getattr(device, "device_kind", None)


@contextlib.contextmanager
def forced(kernel: str, params: Mapping[str, int]) -> Iterator[None]:
    """Within it, `lookup(kernel, ...)` answers `params` (how --tune times a candidate)."""
    _FORCED.append((kernel, dict(params)))
    try:
        yield
    finally:
        _FORCED.pop()


def load(path: str | None = None) -> list[dict[str, Any]]:
    path = path or TABLE
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["entries"]


def _key(e: Mapping[str, Any]) -> tuple:
    return (e["kernel"], e["device"], e["dtype"], int(e["head_dim"]), int(e["length"]))


def lookup(kernel: str, dtype, head_dim: int, length: int,
           path: str | None = None) -> dict[str, int]:
    """The tuned parameters for a shape: exact, else the nearest entry (said once)."""
    path = path or TABLE
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; one of {', '.join(KERNELS)}")
    for name, params in reversed(_FORCED):
        if name == kernel:
            return dict(params)
    dtype, device = str(jax.numpy.dtype(dtype)), device_kind()
    want = (kernel, device, dtype, int(head_dim), length_bucket(length))
    entries = [e for e in _cached(path) if e["kernel"] == kernel]
    if not entries:
        raise LookupError(f"{path} has no entry for kernel {kernel!r}")

    def distance(e):
        return (e["device"] != device, e["dtype"] != dtype,
                abs(math.log2(max(1, e["head_dim"]) / max(1, head_dim))),
                abs(math.log2(e["length"] / want[4])))

    best = min(entries, key=distance)
    # Said for a GPU only: a CPU host traces the GPU branch of every call too (it is
    # dropped when lowered for the CPU), and its users have no GPU to tune.
    if _key(best) != want and device is not None:
        targets.say_once(
            f"tuning: no entry for {kernel} on {device}, {dtype}, head "
            f"dim {head_dim}, length {want[4]}; the nearest ({best['device']}, "
            f"{best['dtype']}, head dim {best['head_dim']}, length {best['length']}, "
            f"{best['source']}): {_params(best)}. Fill it: lra.bench_kernels --tune")
    return _params(best)


def _params(e: Mapping[str, Any]) -> dict[str, int]:
    return {k: int(e[k]) for k in (TILE_PARAM[e["kernel"]], "num_warps", "num_stages")}


_CACHE: dict[str, tuple[float, list]] = {}


def _cached(path: str) -> list[dict[str, Any]]:
    mtime = os.path.getmtime(path) if os.path.exists(path) else -1.0
    if path not in _CACHE or _CACHE[path][0] != mtime:
        _CACHE[path] = (mtime, load(path))
    return _CACHE[path][1]


def write(new: list[dict[str, Any]], path: str | None = None) -> list[dict[str, Any]]:
    """Merges `new` entries into the table at `path` (an entry replaces the one of the
    same key) and writes it sorted; returns the table."""
    path = path or TABLE
    table = {_key(e): e for e in load(path)}
    for e in new:
        table[_key(e)] = e
    entries = [table[k] for k in sorted(table, key=lambda k: tuple(map(str, k)))]
    with open(path, "w") as f:
        json.dump({"format": "models/kernels/tuning.py", "entries": entries}, f, indent=1)
        f.write("\n")
    return entries


def candidates(kernel: str, length: int) -> list[dict[str, int]]:
    """Every candidate of `kernel` that fits `length` (tiles no longer than the row)."""
    grid = CANDIDATES[kernel]
    tile = TILE_PARAM[kernel]
    out = [{}]
    for name, values in grid.items():
        out = [dict(c, **{name: v}) for c in out for v in values
               if name != tile or v <= max(length, min(values))]
    return out


def tune(kernel: str, dtype, head_dim: int, length: int, time_fn, *,
         device: str | None = None, when: str = "") -> dict[str, Any]:
    """Times every candidate (`time_fn(params)` -> seconds, None where it fails) and
    returns the fastest as a table entry."""
    timed = [(time_fn(c), c) for c in candidates(kernel, length)]
    ok = [(t, c) for t, c in timed if t is not None]
    if not ok:
        raise RuntimeError(f"no candidate of {kernel} ran at length {length}")
    best_t, best = min(ok, key=lambda tc: tc[0])
    return {"kernel": kernel, "device": device or device_kind() or "unknown",
            "dtype": str(jax.numpy.dtype(dtype)), "head_dim": int(head_dim),
            "length": length_bucket(length), **best, "fwd_bwd_ms": round(best_t * 1e3, 4),
            "candidates": len(timed), "source": f"measured {when} jax {jax.__version__}"}


def for_target(kernel: str, target: "targets.Target", dtype, head_dim: int, length: int,
               tile: int | None) -> tuple[int | None, tuple[int, int] | None]:
    """(tile, (num_warps, num_stages)) of a call: the table's for a compiled Triton
    target (an explicit `tile` wins, a tuned one is capped at the row's length rounded up
    to a power of two >= 16), else (tile, None): the kernel's own defaults."""
    if target.backend != "pallas" or target.platform != "gpu" or target.interpret:
        return tile, None
    params = lookup(kernel, dtype, head_dim, length)
    if tile is None:
        tile = min(params[TILE_PARAM[kernel]], max(16, 1 << max(0, length - 1).bit_length()))
    return tile, (params["num_warps"], params["num_stages"])
