"""Shared setup for the model tests."""
from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True)
def _full_precision_matmuls():
    # GPUs/TPUs default to reduced-precision f32 matmuls; the 1e-5 tolerances
    # below compare two float32 computations, not precision modes.
    with jax.default_matmul_precision("highest"):
        yield
