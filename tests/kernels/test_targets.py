"""models/kernels/targets.py: the kernel form per lowering platform, the GPU backend this
JAX offers, and the one line a GPU run prints about it."""
import importlib.util

import jax
import jax.numpy as jnp
import pytest

from models.kernels import targets
from models.kernels.targets import Target


def test_default_forms_per_platform():
    by_platform = targets.targets(None, None)
    gpu = (Target("pallas", "gpu", False) if targets.gpu_backend() == "triton"
           else Target("xla", None, False))
    assert by_platform == {"cpu": Target("pallas", "gpu", True), "cuda": gpu, "rocm": gpu,
                           "tpu": Target("pallas", "tpu", False)}
    # An explicit flavour holds everywhere; interpret stays the CPU's unless given.
    assert set(targets.targets("tpu", None).values()) == {Target("pallas", "tpu", True),
                                                          Target("pallas", "tpu", False)}
    assert set(targets.targets("tpu", True).values()) == {Target("pallas", "tpu", True)}
    with pytest.raises(ValueError, match="platform"):
        targets.targets("cuda", None)


@pytest.mark.skipif(importlib.util.find_spec("jax.experimental.pallas.triton") is None,
                    reason="this JAX has no Pallas Triton backend (the XLA fallback runs)")
def test_this_jax_lowers_pallas_for_gpu_through_triton():
    assert targets.gpu_backend() == "triton"
    assert targets.triton_params(num_warps=4) is not None


def test_a_gpu_run_says_once_which_backend(monkeypatch, capsys):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(targets, "_SAID", set())
    x = jnp.ones(3)
    for _ in range(2):
        targets.dispatch(lambda t: (lambda x: x + 1), (x,), platform=None, interpret=None)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("models.kernels: attention_impl=pallas on GPU")
    assert jax.__version__ in lines[0]
    assert ("Triton backend" if targets.gpu_backend() else "XLA path") in lines[0]
