"""adaptive_span against an explicit float64 numpy formula (Sukhbaatar et al. 2019)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests.models.helpers import normal

DIM, HEADS, BATCH, LEN, MAX_LEN = 16, 2, 2, 12, 16
TOL = dict(rtol=1e-5, atol=1e-5)


def build(causal: bool = False, **hparams) -> nnx.Module:
    model = registry.build("adaptive_span", dim=DIM, num_heads=HEADS, max_len=MAX_LEN,
                           causal=causal, rngs=nnx.Rngs(params=0, dropout=1), **hparams)
    rng = np.random.default_rng(3)
    for name in ("query", "key", "value", "out"):  # random biases too, never zeros
        nnx.update(getattr(model, name), jax.tree.map(
            lambda leaf: jnp.asarray(0.5 * rng.standard_normal(leaf.shape), leaf.dtype),
            nnx.state(getattr(model, name), nnx.Param)))
    return model


def reference(model, x, mask, causal: bool, ramp: float, max_span: float) -> np.ndarray:
    """a_ij = m(x_ij) exp(s_ij) / sum_k m(x_ik) exp(s_ik), m = clamp((R + z - x) / R, 0, 1)."""
    p = {n: {k: np.asarray(v[...], np.float64) for k, v in
             nnx.state(getattr(model, n), nnx.Param).items()} for n in ("query", "key",
                                                                      "value", "out")}
    x = np.asarray(x, np.float64)
    b, length, _ = x.shape
    hd = DIM // HEADS

    def proj(n):
        y = x @ p[n]["kernel"] + p[n]["bias"]
        return y.reshape(b, length, HEADS, hd).transpose(0, 2, 1, 3)

    q, k, v = proj("query"), proj("key"), proj("value")
    spans = max_span * np.clip(np.asarray(model.span_fraction[...], np.float64), 0, 1)
    out = np.zeros((b, HEADS, length, hd))
    for bi in range(b):
        for h in range(HEADS):
            for i in range(length):
                num = np.zeros(length)
                for j in range(length):
                    if mask is not None and not mask[bi, j]:
                        continue
                    if causal and j > i:
                        continue
                    m = min(max((ramp + spans[h] - abs(i - j)) / ramp, 0.0), 1.0)
                    num[j] = m * np.exp(q[bi, h, i] @ k[bi, h, j] / np.sqrt(hd))
                if num.sum() > 0:
                    out[bi, h, i] = (num / num.sum()) @ v[bi, h]
    merged = out.transpose(0, 2, 1, 3).reshape(b, length, HEADS * hd)
    return merged @ p["out"]["kernel"] + p["out"]["bias"]


@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(causal):
    ramp = 3.0
    model = build(causal=causal, ramp=ramp, max_span=8)
    # One head clamped below 0, one inside (0, S): both ramps cut keys at this length.
    model.span_fraction[...] = jnp.array([-0.3, 0.4])
    x = normal(0, (BATCH, LEN, DIM))
    mask = np.arange(LEN)[None, :] < np.array([[LEN], [LEN - 4]])
    y = model(x, padding_mask=jnp.asarray(mask), deterministic=True)
    expected = reference(model, x, mask, causal, ramp, 8.0)
    np.testing.assert_allclose(np.asarray(y)[mask], expected[mask], **TOL)


def test_span_is_clamped_to_max_span():
    model = build(ramp=2.0, max_span=4)
    model.span_fraction[...] = jnp.array([1.7, 0.25])
    np.testing.assert_allclose(np.asarray(model.spans()), [4.0, 1.0])
    x = normal(1, (BATCH, LEN, DIM))
    y = model(x, deterministic=True)
    np.testing.assert_allclose(np.asarray(y), reference(model, x, None, False, 2.0, 4.0), **TOL)


def test_aux_loss_is_l1_of_spans_and_trains_the_span():
    model = build(ramp=4.0, max_span=10, l1_weight=0.5)
    model.span_fraction[...] = jnp.array([0.2, 0.6])
    x = normal(2, (BATCH, LEN, DIM))
    model(x, deterministic=True)
    sown = nnx.pop(model, nnx.Intermediate)
    (aux,) = jax.tree.leaves(sown)
    np.testing.assert_allclose(float(aux), 0.5 * np.mean([2.0, 6.0]), rtol=1e-6)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    w = normal(3, (BATCH, LEN, DIM))

    def task_loss(params):
        return jnp.sum(nnx.merge(graphdef, params, rest)(x, deterministic=True) * w)

    grads = jax.grad(task_loss)(params)
    # The ramp cuts keys at this length, so the task loss reaches each head's span.
    assert np.all(np.abs(np.asarray(grads["span_fraction"][...])) > 0)


def test_clamped_span_still_gets_a_gradient():
    model = build(ramp=4.0, max_span=10, l1_weight=1.0)
    model.span_fraction[...] = jnp.array([-0.5, 1.5])  # both outside [0, 1]
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def l1(params):
        module = nnx.merge(graphdef, params, rest)
        return jnp.mean(module.spans())

    grad = np.asarray(jax.grad(l1)(params)["span_fraction"][...])
    np.testing.assert_allclose(grad, [5.0, 5.0])  # d(S * mean p)/dp_h = S / H


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="span_init"):
        build(span_init=1.5)
    with pytest.raises(ValueError, match="ramp"):
        build(ramp=0.0)


def test_span_parameter_is_marked_bounded_and_not_decayed():
    """The optimiser (lra.training.optim.make_optimizer) clamps the span fraction to [0, 1] after
    each step and leaves it out of weight decay (tests/test_train.py checks both)."""
    metadata = build().span_fraction.get_metadata()
    assert metadata["bounds"] == (0.0, 1.0) and metadata["no_weight_decay"] is True
    assert metadata["out_sharding"] == ("heads",)  # still a per-head parameter
