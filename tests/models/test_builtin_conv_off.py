"""conv_size=0: deltanet, gated_deltanet, kda, gated_deltaproduct, mamba2 and loglinear_mamba2
without their own short convolutions
(fla's use_short_conv=False), so that a benchmark scaffold can give every mixer one
shared convolution, or none (configs/scaffold.py). Off is the identity: the same layer as
a one-tap convolution of weight 1 (and bias 0), with no convolution parameter; it
decodes token by token as the parallel form."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests import tiers
from tests.models.helpers import check_prefill_and_steps, normal, randomize_params

NAMES = ("deltanet", "gated_deltanet", "kda", "gated_deltaproduct", "mamba2", "loglinear_mamba2")
TOL = dict(rtol=2e-5, atol=2e-5)


def build(name: str, conv_size: int, *, causal: bool = True) -> nnx.Module:
    extra = {"state_size": 8} if name in ("mamba2", "loglinear_mamba2") else {}
    mixer = registry.build(name, dim=16, num_heads=2, max_len=64, causal=causal,
                           rngs=nnx.Rngs(params=0), chunk_size=4, conv_size=conv_size, **extra)
    return randomize_params(mixer, seed=3, scale=0.4)


def run(mixer, method: str, *args):
    return nnx.jit(lambda m, *a: getattr(m, method)(*a))(mixer, *args)


def conv_paths(mixer) -> list[str]:
    return ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(mixer, nnx.Param))
            if "conv" in str(p[-1])]


@pytest.mark.parametrize("causal", [True, tiers.exhaustive(False)])
@pytest.mark.parametrize("name", tiers.variants(NAMES))  # one per module by default
def test_off_is_a_one_tap_identity_convolution(name, causal):
    off = build(name, 0, causal=causal)
    assert conv_paths(off) == []
    one = build(name, 1, causal=causal)
    assert conv_paths(one)
    # The one-tap layer with the identity kernel (weight 1, bias 0) and off's other weights.
    params = dict(nnx.to_flat_state(nnx.state(off, nnx.Param)))
    for path, var in nnx.to_flat_state(nnx.state(one, nnx.Param)):
        leaf = str(path[-1])
        if "conv" in leaf:
            var.set_value(jnp.zeros_like(var[...]) if "bias" in leaf else jnp.ones_like(var[...]))
        else:
            var.set_value(params[path][...])
    x = normal(8, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [7]])
    y_off, y_one = run(off, "__call__", x, mask), run(one, "__call__", x, mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(y_off)[real], np.asarray(y_one)[real], **TOL)
    # Not vacuous: the layer mixes tokens (the last output depends on the first input).
    y_moved = run(off, "__call__", x.at[:, 0].add(1.0), mask)
    assert not np.allclose(np.asarray(y_moved)[0, 10], np.asarray(y_off)[0, 10])


@pytest.mark.parametrize("name", tiers.variants(NAMES))
def test_off_decodes_as_the_parallel_form(name):
    """Prompts of 1, 5 and 9 tokens (right-padded to 9), then steps: the parallel causal
    form's outputs at every position; the cache holds no convolution window."""
    mixer = build(name, 0)
    check_prefill_and_steps(mixer, run, normal(12, (3, 16, 16)), jnp.array([1, 5, 9]), 9,
                            **TOL)
    cache = mixer.init_cache(3, 16)
    windows = [v for k, v in jax.tree_util.tree_leaves_with_path(cache) if "conv" in str(k)]
    assert windows and all(w.shape[-2] == 0 for w in windows)


def test_negative_conv_size_is_refused():
    with pytest.raises(ValueError, match="conv_size"):
        build("deltanet", -1)
