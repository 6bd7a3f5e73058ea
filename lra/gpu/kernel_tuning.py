"""`lra.bench_kernels --tune`: the Triton kernels' tiles and launch parameters measured on
the GPU this runs on, written into models/kernels/tuning.json (models/kernels/tuning.py).

  python -m lra.bench_kernels --tune --lengths=1024,4096,16384 --dtype=bfloat16

For each kernel of --sections and each length: every candidate of `tuning.CANDIDATES`
(tile x num_warps x num_stages, tiles no longer than the row) times one causal
forward+backward at the benchmark's B, H, D (median of --repeats calls after a warm-up);
the fastest becomes the entry for (kernel, this device kind, dtype, head dim, length
bucket), replacing an older one. Prints the entries as a table. Refused off a GPU: the
interpreter's times say nothing about a GPU.
"""
from __future__ import annotations

import datetime
import functools
import sys
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from models import masks
from models.kernels import tuning
from models.kernels.block_sparse_attention import block_sparse_attention
from models.kernels.decayed_attention import decayed_linear_attention
from models.kernels.delta_rule import delta_rule
from models.kernels.linear_attention import linear_attention

SECTION_KERNEL = {"linear": "linear", "decayed": "decayed", "delta": "delta",
                  "block_sparse": "block_sparse"}


def _call(kernel: str, tile: int) -> Callable:
    """The kernel at `tile`, causal, as the benchmark's sections call it."""
    if kernel == "linear":
        return functools.partial(linear_attention, causal=True, backend="pallas",
                                 chunk_size=tile)
    if kernel == "decayed":
        return functools.partial(decayed_linear_attention, backend="pallas", chunk_size=tile)
    if kernel == "delta":
        return lambda q, k, v, beta, log_a: delta_rule(q, k, v, beta, log_a, backend="pallas",
                                                      chunk_size=tile)[0]
    return functools.partial(block_sparse_attention, pattern=masks.causal(),
                             backend="pallas", block_q=tile, block_k=tile)


def _inputs(kernel: str, dtype, b: int, h: int, length: int, d: int):
    """(inputs, cotangent): positive features for linear attention, a per-head decay for
    decayed attention, normalised keys, beta and log alpha for the delta rule."""
    rng = np.random.default_rng(0)
    normal = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32))  # noqa: E731
    q, k, v, g = (normal(b, h, length, d) for _ in range(4))
    if kernel == "linear":
        q, k = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    if kernel == "delta":
        q, k = (x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    q, k, v, g = (x.astype(dtype) for x in (q, k, v, g))
    if kernel == "decayed":
        return (q, k, v, jax.nn.log_sigmoid(normal(b, h, length, 1) + 4.0) / 16.0), g
    if kernel == "delta":
        return (q, k, v, jax.nn.sigmoid(normal(b, h, length)),
                -0.01 * jnp.abs(normal(b, h, length))), g
    return (q, k, v), g


def tune(sections, lengths, *, b: int, h: int, d: int, dtype, repeats: int,
         table: str, time_fn: Callable, device: str | None = None) -> list[dict]:
    """Measures and writes the entries; `time_fn(fn, *args, repeats=)` -> seconds or None
    (lra.bench_kernels._time on a GPU; the tests pass a stand-in)."""
    when = datetime.date.today().isoformat()
    entries = []
    for section in sections:
        kernel = SECTION_KERNEL[section]
        for length in map(int, lengths):
            inputs, g = _inputs(kernel, dtype, b, h, length, d)

            def time_candidate(params, kernel=kernel, inputs=inputs, g=g):
                attn = _call(kernel, params[tuning.TILE_PARAM[kernel]])

                @jax.jit
                def fwd_bwd(*xs):
                    return jax.vjp(attn, *xs)[1](g)

                with tuning.forced(kernel, params):  # launch parameters at trace time
                    return time_fn(fwd_bwd, *inputs, repeats=repeats)

            print(f"tune {kernel} L={length}", file=sys.stderr)
            entries.append(tuning.tune(kernel, dtype, d, length, time_candidate,
                                       device=device, when=when))
    tuning.write(entries, table)
    return entries


def markdown(entries: list[dict]) -> str:
    lines = ["| kernel | device | dtype | head dim | length | tile | num_warps | num_stages "
             "| fwd+bwd ms | candidates |", "|" + "---|" * 10]
    for e in entries:
        tile = e[tuning.TILE_PARAM[e["kernel"]]]
        lines.append(f"| {e['kernel']} | {e['device']} | {e['dtype']} | {e['head_dim']} | "
                     f"{e['length']} | {tile} | {e['num_warps']} | {e['num_stages']} | "
                     f"{e['fwd_bwd_ms']} | {e['candidates']} |")
    return "\n".join(lines)
