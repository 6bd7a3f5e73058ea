"""Conformance suite: every registered token mixer, checked against its capabilities.

A variant joins by being registered. It is built at the sizes below with
`capabilities(name).test_hparams`; `dense_equivalent`, `causal`, `padding` and
`variable_length` switch on the tests that check those claims.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from tests import tiers
from tests.models.helpers import apply, normal

BATCH, LEN, DIM, HEADS, MAX_LEN = 2, 16, 32, 2, 16
SHORT_LEN = 12  # a length below max_len for variable-length variants
NUM_PADDED = 5  # padded positions at the end of the second example
TOL = dict(rtol=1e-5, atol=1e-5)
DENSE_PARAMS = ("query", "key", "value", "out")

VARIANTS = registry.available()
# The per-variant properties below take one variant of each models/ module in the default
# tier and the others in the exhaustive one (tests/tiers.py; CI runs both).
TIERED = tiers.variants(VARIANTS)


class ThroughCarry(nnx.Module):
    """A `carries_state` mixer as a plain one: the output of a second call fed the carry
    of a first, so every check covers both the initial and a carried state."""

    def __init__(self, mixer: nnx.Module):
        self.mixer = mixer

    def __call__(self, x, padding_mask=None, deterministic=True):
        _, carry = self.mixer(x, padding_mask=padding_mask, deterministic=deterministic,
                              carry=None)
        y, _ = self.mixer(x, padding_mask=padding_mask, deterministic=deterministic,
                          carry=carry)
        return y


def build(name: str, *, causal: bool = False, **overrides) -> nnx.Module:
    caps = registry.capabilities(name)
    hparams = {**caps.test_hparams, **overrides}
    mixer = registry.build(name, dim=DIM, num_heads=HEADS, max_len=MAX_LEN, causal=causal,
                           rngs=nnx.Rngs(params=0, dropout=1), **hparams)
    return ThroughCarry(mixer) if caps.carries_state else mixer


def random_x(seed: int = 0, length: int = LEN) -> jax.Array:
    return normal(seed, (BATCH, length, DIM))


def padding_mask(length: int = LEN) -> jax.Array:
    lengths_Bx1 = jnp.array([[length], [length - NUM_PADDED]])
    return jnp.arange(length)[None, :] < lengths_Bx1


def mask_for(kind: str | None, length: int = LEN) -> jax.Array | None:
    return padding_mask(length) if kind == "padding" else None


def skip_unless(flag: bool, why: str) -> None:
    if not flag:
        pytest.skip(why)


def assert_close(a, b, **tol) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **(tol or TOL))


@pytest.mark.parametrize("name", VARIANTS)
def test_capabilities_are_well_formed(name):
    caps = registry.capabilities(name)
    assert isinstance(caps.description, str) and caps.description and "\n" not in caps.description
    assert isinstance(caps.test_hparams, dict)
    assert caps.dense_equivalent is None or isinstance(caps.dense_equivalent, dict)


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", VARIANTS)
def test_jit_matches_eager_shape_dtype_finite(name):
    """Eager and jitted outputs agree, with the input's shape, float32 and finite, at
    max_len (padded where the variant takes padding; jitted also without); variable-length
    variants also at a shorter length (jitted). The eager pass compiles every operation on
    its own (2-8 s a variant), so it runs once, here only, in the exhaustive tier; the
    other tests call the variants jitted (`helpers.apply`), the unpadded input included
    (test_padding_invariance, test_vmap_matches_batch)."""
    caps = registry.capabilities(name)
    model = build(name)
    x, mask = random_x(), mask_for("padding" if caps.padding else None)
    y_eager = model(x, padding_mask=mask, deterministic=True)
    assert y_eager.shape == (BATCH, LEN, DIM)
    assert y_eager.dtype == jnp.float32
    assert np.isfinite(np.asarray(y_eager)).all()
    assert_close(apply(model, x, padding_mask=mask), y_eager)
    if caps.padding:
        y = apply(model, x)
        assert y.shape == (BATCH, LEN, DIM) and np.isfinite(np.asarray(y)).all()
    if caps.variable_length:
        y = apply(model, random_x(length=SHORT_LEN))
        assert y.shape == (BATCH, SHORT_LEN, DIM) and y.dtype == jnp.float32
        assert np.isfinite(np.asarray(y)).all()


# The padded case where the variant takes padding, else the plain one, in the variant's
# tier; the other one exhaustive.
@pytest.mark.parametrize("name,mask_kind", tiers.cases(
    [None, "padding"], lambda n: "padding" if registry.capabilities(n).padding else None))
def test_vmap_matches_batch(name, mask_kind):
    skip_unless(mask_kind is None or registry.capabilities(name).padding, "no padding support")
    model = build(name)
    x = random_x()
    mask = padding_mask() if mask_kind == "padding" else jnp.ones((BATCH, LEN), jnp.bool_)
    graphdef, state = nnx.split(model)

    def one_example(x_LxD, mask_L):
        m_1xL = mask_L[None] if mask_kind == "padding" else None
        return nnx.merge(graphdef, state)(x_LxD[None], padding_mask=m_1xL,
                                          deterministic=True)[0]

    y_vmap = jax.jit(jax.vmap(one_example))(x, mask)
    y_batch = apply(model, x, padding_mask=mask_for(mask_kind))
    assert_close(y_vmap, y_batch)


@pytest.mark.parametrize("name", TIERED)
def test_gradients_finite_and_nonzero(name):
    caps = registry.capabilities(name)
    model = build(name)
    mask = padding_mask() if caps.padding else None
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    w_BxLxD = normal(7, (BATCH, LEN, DIM))

    def loss(params, x):
        y = nnx.merge(graphdef, params, rest)(x, padding_mask=mask, deterministic=True)
        return jnp.sum(y * w_BxLxD)

    grads, grad_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, random_x())
    leaves = jax.tree.leaves(grads)
    assert leaves, "no parameters"
    for leaf in leaves:
        assert np.isfinite(np.asarray(leaf)).all()
    assert any(np.abs(np.asarray(leaf)).max() > 0 for leaf in leaves)
    assert np.isfinite(np.asarray(grad_x)).all()
    assert np.abs(np.asarray(grad_x)).max() > 0


@pytest.mark.parametrize("name", TIERED)
def test_padding_invariance(name):
    skip_unless(registry.capabilities(name).padding, "no padding support")
    model = build(name)
    mask = padding_mask()
    x = random_x(0)
    x_changed = jnp.where(mask[..., None], x, 3.0 * random_x(1))
    y = apply(model, x, padding_mask=mask)
    y_changed = apply(model, x_changed, padding_mask=mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(y_changed)[real])


@pytest.mark.parametrize("name", TIERED)
def test_prefix_matches_padded(name):
    caps = registry.capabilities(name)
    skip_unless(caps.padding and caps.variable_length, "needs padding and variable length")
    model = build(name)
    x = random_x()
    mask = jnp.broadcast_to(jnp.arange(LEN) < SHORT_LEN, (BATCH, LEN))
    y_padded = apply(model, x, padding_mask=mask)
    y_prefix = apply(model, x[:, :SHORT_LEN])
    assert_close(y_padded[:, :SHORT_LEN], y_prefix)


@pytest.mark.parametrize("t", [tiers.exhaustive(0), 6, tiers.exhaustive(LEN - 2)])
@pytest.mark.parametrize("name", TIERED)
def test_causality(name, t):
    skip_unless(registry.capabilities(name).causal, "not causal")
    model = build(name, causal=True)
    x = random_x(0)
    future = (jnp.arange(LEN) > t)[None, :, None]
    y = apply(model, x)
    y_future = apply(model, jnp.where(future, random_x(1), x))
    assert_close(y[:, :t + 1], y_future[:, :t + 1])
    # Not vacuous: changing position t itself must reach the output at t.
    at_t = (jnp.arange(LEN) == t)[None, :, None]
    y_now = apply(model, jnp.where(at_t, random_x(2), x))
    assert not np.allclose(np.asarray(y[:, t]), np.asarray(y_now[:, t]), **TOL)


@pytest.mark.parametrize("name", VARIANTS)
def test_causal_rejected_when_unsupported(name):
    skip_unless(not registry.capabilities(name).causal, "supports causal")
    with pytest.raises(registry.RegistryError, match="causal"):
        build(name, causal=True)


def dense_twin(variant: nnx.Module, causal: bool) -> nnx.Module:
    """`transformer` holding the variant's query/key/value/out weights."""
    missing = [p for p in DENSE_PARAMS if not isinstance(getattr(variant, p, None), nnx.Linear)]
    assert not missing, f"dense_equivalent needs nnx.Linear attributes {missing}"
    dense = registry.build("transformer", dim=DIM, num_heads=HEADS, max_len=MAX_LEN,
                           causal=causal, rngs=nnx.Rngs(params=99, dropout=99),
                           qkv_dim=variant.query.out_features,
                           use_bias=variant.query.use_bias, attention_dropout=0.0)
    for p in DENSE_PARAMS:
        nnx.update(getattr(dense, p), nnx.state(getattr(variant, p), nnx.Param))
    return dense


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [tiers.exhaustive(None), "padding"])
@pytest.mark.parametrize("name", TIERED)
def test_reduces_to_dense(name, mask_kind, causal):
    """The unpadded cases are exhaustive: every variant with a dense limit takes padding,
    and the padded case checks the same outputs at the real positions."""
    caps = registry.capabilities(name)
    skip_unless(caps.dense_equivalent is not None, "no dense limit")
    skip_unless(mask_kind is None or caps.padding, "no padding support")
    skip_unless(not causal or caps.causal, "not causal")
    variant = build(name, causal=causal, **caps.dense_equivalent)
    dense = dense_twin(variant, causal)
    x, mask = random_x(), mask_for(mask_kind)
    y_variant = apply(variant, x, padding_mask=mask)
    y_dense = apply(dense, x, padding_mask=mask)
    if mask is None:
        assert_close(y_variant, y_dense)
    else:
        real = np.asarray(mask)  # padded outputs are unspecified
        assert_close(np.asarray(y_variant)[real], np.asarray(y_dense)[real])


@pytest.mark.parametrize("name", TIERED)
def test_dropout(name):
    with_dropout = "attention_dropout" in registry.accepted_hparams(name)
    model = build(name, **({"attention_dropout": 0.5} if with_dropout else {}))
    x = random_x()
    # nnx.jit writes the module's rng state back as an eager call would: deterministic
    # calls must not draw (or not use what they draw).
    forward = nnx.jit(lambda m, x: m(x, deterministic=True))
    assert_close(forward(model, x), forward(model, x), rtol=0, atol=0)

    # Under jit the rng lives in the split state, which the step must carry forward
    # (sown intermediates, routing's auxiliary loss, are not state to carry).
    nnx.pop(model, nnx.Intermediate)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def step(rest, x):
        module = nnx.merge(graphdef, params, rest)
        y = module(x, deterministic=False)
        return y, nnx.state(module, nnx.Not(nnx.Any(nnx.Param, nnx.Intermediate)))

    y1, rest = step(rest, x)
    y2, rest = step(rest, x)
    if not with_dropout and np.allclose(np.asarray(y1), np.asarray(y2)):
        pytest.skip("no dropout")
    assert not np.allclose(np.asarray(y1), np.asarray(y2)), "rng state did not advance"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", tiers.variants(
    n for n in VARIANTS if registry.capabilities(n).takes_residual))
def test_residual_is_a_gated_update(name, causal):
    """Capabilities.takes_residual: mixer(x, residual=r) = u o (h - r), with u, h from x
    alone: residual=x is the default, and r enters linearly with a gate u in (0, 1)."""
    skip_unless(not causal or registry.capabilities(name).causal, "no causal form")
    model, x, r = build(name, causal=causal), random_x(0), random_x(1)
    mask = padding_mask()

    def at(residual):
        return np.asarray(jax.jit(lambda m, a, res: m(a, padding_mask=mask,
                                                      deterministic=True, residual=res))(
            model, x, residual), np.float64)

    assert_close(at(x), apply(model, x, padding_mask=mask))
    u = (at(jnp.zeros_like(r)) - at(r)) / np.asarray(r, np.float64)
    assert ((u > -1e-4) & (u < 1 + 1e-4)).all()
    np.testing.assert_allclose(at(2 * r), at(jnp.zeros_like(r)) - 2 * u * np.asarray(r),
                               rtol=1e-4, atol=1e-4)


# The O(L)-memory forms (attention_impl=flash) of the softmax variants whose logits are not
# a static pattern (docs/precision_and_kernels.md): the claims above, checked on that form
# too (each is tested equal to its dense form in its own test file and through the task
# config in tests/kernels/test_flash_attention.py).
FLASH_FORMS = [n for n in VARIANTS
               if n in ("fox", "moba", "nsa", "path")]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", FLASH_FORMS)
def test_flash_forms_keep_causality_and_padding(name, causal):
    skip_unless(name in FLASH_FORMS, "not one of the chunked softmax forms")
    model = build(name, causal=causal, attention_impl="flash")
    mask = padding_mask()
    x = random_x(0)
    y = apply(model, x, padding_mask=mask)
    changed = apply(model, jnp.where(mask[..., None], x, 3.0 * random_x(1)), padding_mask=mask)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], np.asarray(changed)[real])
    if causal:
        t = 6
        future = (jnp.arange(LEN) > t)[None, :, None]
        y_future = apply(model, jnp.where(future, random_x(2), x), padding_mask=mask)
        assert_close(y[:, :t + 1], y_future[:, :t + 1])
        y_now = apply(model, jnp.where((jnp.arange(LEN) == t)[None, :, None], random_x(3), x),
                      padding_mask=mask)
        assert not np.allclose(np.asarray(y[:, t]), np.asarray(y_now[:, t]), **TOL)

