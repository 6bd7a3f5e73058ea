"""cosformer (models/attention/cosformer.py) against the original's quadratic form.

The conformance and decoding suites check padding, causality and the decoding contract
through the configs; here: the layer equals OpenNLPLab/cosFormer's `left_product` (the
L x L weights relu(q_i).relu(k_j) cos(pi/2 (i - j)/M), masked for the causal form,
normalised by their clamped sum) written in numpy from the weights; M is the builder's
max_len whatever the input's length; decoding equals the parallel form. The comparison
with the original torch module: results/cpu/cosformer_vs_original.md.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry

from tests.models.helpers import (check_prefill_and_steps, f64, normal, project_heads,
                                  randomize_params)
from tests.models.test_delta import assert_close, run

DIM, HEADS, MAX_LEN = 16, 2, 12


def build(*, causal: bool, **hparams):
    mixer = registry.build("cosformer", dim=DIM, num_heads=HEADS, max_len=MAX_LEN,
                           causal=causal, rngs=nnx.Rngs(0), chunk_size=4, **hparams)
    return randomize_params(mixer, seed=3, scale=0.4)


def left_product(mixer, x, causal: bool, m: int) -> np.ndarray:
    """The original's `left_product` in float64: weights, mask, clamp_min, out_proj."""
    q, k, v = (project_heads(getattr(mixer, p), x, HEADS) for p in ("query", "key", "value"))
    length = q.shape[2]
    i = np.arange(1, length + 1)
    w = np.einsum("bhid,bhjd->bhij", np.maximum(q, 0), np.maximum(k, 0))
    w = w * np.cos(np.pi / 2 * (i[:, None] - i[None, :]) / m)
    if causal:
        w = w * np.tril(np.ones((length, length)))
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-6)
    o = np.einsum("bhij,bhjd->bhid", w, v).transpose(0, 2, 1, 3).reshape(x.shape[0], length, -1)
    return o @ f64(mixer.out.kernel) + f64(mixer.out.bias)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [MAX_LEN, 7])
def test_layer_is_the_originals_quadratic_form(causal, length):
    mixer = build(causal=causal)
    x = normal(1, (2, length, DIM))
    y = run(mixer, "__call__", x)
    assert_close(y, left_product(mixer, x, causal, m=MAX_LEN), rtol=1e-4, atol=1e-5)


def test_reweight_len_sets_m_and_refuses_a_short_one():
    mixer = build(causal=False, reweight_len=40)
    x = normal(2, (2, MAX_LEN, DIM))
    assert_close(run(mixer, "__call__", x), left_product(mixer, x, False, m=40),
                 rtol=1e-4, atol=1e-5)
    with pytest.raises(registry.RegistryError, match="reweight_len=8 is below max_len"):
        build(causal=False, reweight_len=8)


def test_prefill_and_steps_equal_the_parallel_form():
    mixer = build(causal=True)
    check_prefill_and_steps(mixer, run, normal(3, (3, MAX_LEN, DIM)), jnp.array([1, 4, 7]), 7,
                            rtol=1e-5, atol=1e-5)
