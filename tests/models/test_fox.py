"""fox (models/attention/forgetting.py) against the paper's formula.

The conformance suite checks its dense limit (forget_gate=False is `transformer`),
padding, causality and jit/vmap; the decoding suite prefill + steps through the configs.
Here: the causal output is fla's naive_forgetting_attn written in numpy (logits + c_i - c_j,
c the inclusive cumulative sum of log sigmoid(W_f x + b_f)); the bidirectional form decays
by -|c_i - c_j|; padded positions forget nothing; decoding with rotary and the output gate;
the parameters are fla's ForgettingAttention's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry

from tests.models.helpers import check_prefill_and_steps, normal, randomize_params
from tests.models.test_delta import assert_close, run


def build(*, causal: bool, dim: int = 16, heads: int = 2, **hparams):
    mixer = registry.build("fox", dim=dim, num_heads=heads, max_len=64, causal=causal,
                           rngs=nnx.Rngs(0), attention_dropout=0.0, **hparams)
    return randomize_params(mixer, seed=3, scale=0.4)


def by_formula(mixer, x, real, *, causal: bool) -> np.ndarray:
    """The layer in float64 numpy from its weights (fla's naive_forgetting_attn)."""
    w = lambda lin: np.asarray(lin.kernel[...], np.float64)  # noqa: E731
    x = np.asarray(x, np.float64)
    b, length, _ = x.shape
    h = mixer.num_heads
    split = lambda t: t.reshape(b, length, h, -1).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(x @ w(mixer.query)), split(x @ w(mixer.key)), split(x @ w(mixer.value))
    f = x @ w(mixer.forget) + np.asarray(mixer.forget.bias[...], np.float64)
    log_f = np.where(real[..., None], -np.logaddexp(0.0, -f), 0.0).transpose(0, 2, 1)
    c = np.cumsum(log_f, axis=-1)
    diff = c[..., :, None] - c[..., None, :]
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    logits = logits + (diff if causal else -np.abs(diff))
    allowed = np.broadcast_to(real[:, None, None, :], logits.shape)
    if causal:
        allowed = allowed & np.tril(np.ones((length, length), bool))
    logits = np.where(allowed, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(b, length, -1)
    return o @ w(mixer.out)


@pytest.mark.parametrize("causal", [True, False])
def test_output_is_the_papers_formula(causal):
    mixer = build(causal=causal)
    x = normal(1, (2, 11, 16))
    mask = jnp.arange(11)[None] < jnp.array([[11], [8]])
    y = run(mixer, "__call__", x, mask)
    want = by_formula(mixer, x, np.asarray(mask), causal=causal)
    real = np.asarray(mask)
    assert_close(np.asarray(y)[real], want[real], rtol=1e-5, atol=1e-5)


def test_the_gate_is_used():
    """Not vacuous: the same weights without the forget gate's bias differ."""
    mixer = build(causal=True)
    x = normal(2, (1, 9, 16))
    y = run(mixer, "__call__", x)
    nnx.update(mixer.forget, {"bias": nnx.Param(mixer.forget.bias[...] + 5.0)})
    assert not np.allclose(np.asarray(run(mixer, "__call__", x)), np.asarray(y), atol=1e-3)


@pytest.mark.parametrize("hparams", [{}, {"output_gate": True, "rotary": True}])
def test_prefill_and_steps_equal_the_parallel_form(hparams):
    mixer = build(causal=True, **hparams)
    check_prefill_and_steps(mixer, run, normal(3, (3, 14, 16)), jnp.array([1, 5, 9]), 9,
                            rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_is_the_dense_form(causal, monkeypatch):
    """attention_impl=flash (chunked, tiles of 4: several per row) equals the materialised
    form, outputs and every gradient, with padding; dropout off."""
    import functools

    from models.attention import forgetting
    from models.kernels.chunked_attention import chunked_attention

    monkeypatch.setattr(forgetting, "chunked_attention",
                        functools.partial(chunked_attention, chunk_q=4, chunk_k=4))
    dense_form = build(causal=causal)
    flash_form = build(causal=causal, attention_impl="flash")
    x = normal(4, (2, 13, 16))
    mask = jnp.arange(13)[None] < jnp.array([[13], [9]])
    w = normal(5, (2, 13, 16)) * np.asarray(mask)[..., None]

    def loss(mixer, x):
        return jnp.sum(mixer(x, padding_mask=mask) * w)

    l_flash, g_flash = nnx.value_and_grad(loss, argnums=(0, 1))(flash_form, x)
    l_dense, g_dense = nnx.value_and_grad(loss, argnums=(0, 1))(dense_form, x)
    assert_close(l_flash, l_dense, rtol=1e-5, atol=1e-5)
    leaves = jax.tree.leaves(g_flash)
    assert len(leaves) == len(jax.tree.leaves(g_dense)) > 4
    for a, b in zip(leaves, jax.tree.leaves(g_dense)):
        assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_block_sparse_forms_are_refused():
    with pytest.raises(registry.RegistryError, match="attention_impl"):
        build(causal=True, attention_impl="blocksparse")


def test_parameters_are_flas_forgetting_attention():
    """fla's ForgettingAttention(hidden_size=D, num_heads=H): q/k/v/o D x D bias-free,
    f_proj D x H with a bias (zero here at initialisation)."""
    dim, heads = 24, 3
    mixer = registry.build("fox", dim=dim, num_heads=heads, max_len=16, causal=True,
                           rngs=nnx.Rngs(0))
    count = sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    assert count == 4 * dim * dim + dim * heads + heads
    assert not np.asarray(mixer.forget.bias[...]).any()
    with_gate = registry.build("fox", dim=dim, num_heads=heads, max_len=16, causal=True,
                               rngs=nnx.Rngs(0), output_gate=True)
    assert sum(p.size for p in jax.tree.leaves(nnx.state(with_gate, nnx.Param))) == \
        count + dim * dim
