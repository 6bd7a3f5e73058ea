"""The chunked recurrent forms' default chunk follows the backend that builds the layer
(models/attention/linear_scan.py backend_chunk; results/cpu/chunk_sizes.md): every chunk
computes the same outputs (each family's tests compare chunks with its scan)."""
from __future__ import annotations

import jax
import pytest
from flax import nnx

from models import registry
from models.attention import delta, kda, retention, rwkv7, ssd


# (module constant on a CPU, on an accelerator) per registered name
CHUNKS = {"kda": (kda.CPU_CHUNK, kda.DEFAULT_CHUNK),
          "rwkv7": (rwkv7.CPU_CHUNK, rwkv7.DEFAULT_CHUNK),
          "deltanet": (delta.CPU_CHUNK, delta.DEFAULT_CHUNK),
          "gated_deltanet": (delta.CPU_CHUNK, delta.DEFAULT_CHUNK),
          "gated_deltaproduct": (delta.CPU_CHUNK, delta.DEFAULT_CHUNK),
          "mamba2": (ssd.CPU_CHUNK, ssd.DEFAULT_CHUNK),
          "retnet": (retention.RETNET_CPU_CHUNK, retention.RETNET_CHUNK)}


@pytest.mark.parametrize("name", sorted(CHUNKS))
def test_the_default_chunk_follows_the_backend_that_builds_the_layer(name, monkeypatch):
    """Small chunks where the CPU builds the layer, the accelerator sizes elsewhere; a
    given chunk_size is kept."""
    cpu, accelerator = CHUNKS[name]

    def chunk(**hparams):
        layer = registry.build(name, dim=16, num_heads=2, max_len=8, causal=True,
                               rngs=nnx.Rngs(0), **hparams)
        return layer.chunk_size

    assert chunk() == cpu < accelerator and chunk(chunk_size=7) == 7
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert chunk() == accelerator and chunk(chunk_size=7) == 7
