"""Every kernel test starts with a fresh TPU interpreter and fails if a kernel it ran in
that interpreter raced (tests/kernels/interpreters.py)."""
import pytest
from jax.experimental.pallas import tpu as pltpu

from models.kernels import targets


@pytest.fixture(autouse=True)
def _no_tpu_races():
    pltpu.reset_tpu_interpret_mode_state()
    yield
    assert not targets.tpu_races_found(), "a kernel raced in Mosaic's TPU interpreter"
