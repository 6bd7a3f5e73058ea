"""The chunked recurrent forms' default chunk follows the backend that builds the layer
(models/attention/linear_scan.py backend_chunk; results/cpu/chunk_sizes.md): every chunk
computes the same outputs (each family's tests compare chunks with its scan)."""
from __future__ import annotations

import jax
import pytest
from flax import nnx

from models import registry
from models.attention import delta, kda, retention, rwkv7, ssd


@pytest.mark.parametrize("name", ["kda", "rwkv7", "deltanet", "gated_deltanet",
                                  "gated_deltaproduct", "mamba2", "retnet"])
def test_the_default_chunk_follows_the_backend_that_builds_the_layer(name, monkeypatch):
    """Small chunks where the CPU builds the layer, the accelerator sizes elsewhere; a
    given chunk_size is kept."""
    module = {"kda": kda, "rwkv7": rwkv7, "mamba2": ssd}.get(name, delta)
    if name == "retnet":
        module = type("RetNetChunks", (), {"CPU_CHUNK": retention.RETNET_CPU_CHUNK,
                                           "DEFAULT_CHUNK": retention.RETNET_CHUNK})

    def chunk(**hparams):
        layer = registry.build(name, dim=16, num_heads=2, max_len=8, causal=True,
                               rngs=nnx.Rngs(0), **hparams)
        return layer.chunk_size

    assert chunk() == module.CPU_CHUNK < module.DEFAULT_CHUNK and chunk(chunk_size=7) == 7
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert chunk() == module.DEFAULT_CHUNK and chunk(chunk_size=7) == 7
