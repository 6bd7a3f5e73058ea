"""based (models/attention/based.py) against Zoology's Based.

The conformance and decoding suites check padding, causality and the decoding contract
through the configs; here: the Taylor features' products are 1 + q.k/sqrt(d) + (q.k)^2/(2d);
the causal and bidirectional layers, in each form, equal Zoology's quadratic train_view (the
form its MQAR configs run) written in numpy from the weights; the quadratic and chunked
forms agree with padding and through configs/mqar.py; decoding equals the parallel form;
the parameters are Zoology's Based's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention import based

from tests.models.helpers import (assert_forms_agree, assert_forms_train_alike,
                                  check_prefill_and_steps, normal, randomize_params)
from tests.models.test_delta import assert_close, run


def build(*, causal: bool, dim: int = 16, heads: int = 2, **hparams):
    hparams = {"feature_dim": 4, "chunk_size": 4, **hparams}
    mixer = registry.build("based", dim=dim, num_heads=heads, max_len=64, causal=causal,
                           rngs=nnx.Rngs(0), **hparams)
    return randomize_params(mixer, seed=3, scale=0.4)


def test_taylor_kernel():
    x, y = normal(0, (3, 6)), normal(1, (3, 6))
    got = np.einsum("nf,nf->n", based.taylor_features(x), based.taylor_features(y))
    dot = np.einsum("nd,nd->n", np.asarray(x, np.float64), np.asarray(y, np.float64))
    assert_close(got, 1 + dot / np.sqrt(6) + dot ** 2 / 12, rtol=1e-5, atol=1e-5)
    assert based.taylor_features(x).shape == (3, 1 + 6 + 36)


@pytest.mark.parametrize("causal,impl", [(True, "chunked"), (True, "quadratic"),
                                         (True, "auto"), (False, "auto")])
def test_layer_is_zoologys_quadratic_view(causal, impl):
    mixer = build(causal=causal, impl=impl)
    assert mixer.quadratic_form(11) == (causal and impl != "chunked")
    x = normal(2, (2, 11, 16))
    y = np.asarray(run(mixer, "__call__", x))
    w = lambda lin: np.asarray(lin.kernel[...], np.float64)  # noqa: E731
    xb = np.asarray(x, np.float64)
    split = lambda t: t.reshape(2, 11, 2, -1).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(xb @ w(mixer.query)), split(xb @ w(mixer.key)), split(xb @ w(mixer.value))
    fq, fk = (np.asarray(based.taylor_features(jnp.asarray(t)), np.float64) for t in (q, k))
    a = np.einsum("bhnd,bhmd->bhnm", fq, fk)
    if causal:
        a = a * np.tril(np.ones((11, 11)))
    out = np.einsum("bhnm,bhme->bhne", a, v) / (a.sum(-1)[..., None] + 1e-12)
    assert_close(y, out.transpose(0, 2, 1, 3).reshape(2, 11, -1) @ w(mixer.out),
                 rtol=1e-4, atol=1e-5)


def test_prefill_and_steps_equal_the_parallel_form():
    mixer = build(causal=True)
    check_prefill_and_steps(mixer, run, normal(3, (3, 14, 16)), jnp.array([1, 5, 9]), 9,
                            rtol=1e-5, atol=1e-5)


def test_parameters_are_zoologys_based():
    """Based(d_model=D, feature_dim=f, num_heads=num_key_value_heads=H): proj_q and proj_k
    D x fH, proj_v D x D, proj_o D x D, no biases."""
    dim, heads, f = 24, 2, 16
    mixer = registry.build("based", dim=dim, num_heads=heads, max_len=16, causal=True,
                           rngs=nnx.Rngs(0), feature_dim=f)
    count = sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    assert count == 2 * dim * f * heads + 2 * dim * dim


def test_quadratic_and_chunked_forms_agree_with_padding():
    """Outputs at the real positions and the gradients (parameters and input): a padded
    key adds nothing in either form (the closed form's constant 1 is masked)."""
    x = normal(5, (3, 13, 16))
    mask = jnp.arange(13)[None] < jnp.array([13, 8, 3])[:, None]
    assert_forms_agree(lambda **h: build(causal=True, **h), x, mask,
                       {"chunked": {"impl": "chunked"}, "quadratic": {"impl": "quadratic"}})


def test_auto_takes_the_quadratic_form_up_to_its_length_only():
    mixer = build(causal=True)
    assert mixer.impl == "auto" and mixer.quadratic_form(based.QUADRATIC_UP_TO)
    assert not mixer.quadratic_form(based.QUADRATIC_UP_TO + 1)
    with pytest.raises(ValueError, match="impl='dense'; choose one of auto, chunked"):
        build(causal=True, impl="dense")


def test_forms_train_alike_through_the_task_config():
    """`configs/mqar.py:model=based,runlocal`: one training step with impl=quadratic and
    =chunked: the same loss, gradient norm and parameter updates."""
    assert_forms_train_alike(based.BasedLinearAttention, "impl", {
        impl: ("model=based,runlocal", {"impl": impl}) for impl in ("quadratic", "chunked")})


@pytest.mark.parametrize("impl", ["quadratic", "chunked"])
def test_padded_positions_reach_no_real_output_even_when_not_finite(impl):
    """A padded key and its value are dropped, not weighted by 0 (0 x nan is nan)."""
    mixer = build(causal=True, impl=impl)
    x = normal(6, (2, 9, 16))
    mask = jnp.arange(9)[None] < jnp.array([9, 5])[:, None]
    y = np.asarray(mixer(x, mask))
    y_nan = np.asarray(mixer(jnp.where(mask[..., None], x, jnp.nan), mask))
    np.testing.assert_allclose(y_nan[np.asarray(mask)], y[np.asarray(mask)], rtol=1e-6)
