"""moba (models/attention/moba.py) against MoBA's reference.

The conformance suite checks the dense limit (top_k >= the blocks is `transformer`),
padding, causality; the decoding suite prefill + steps through the configs. Here: the
causal layer equals MoonshotAI/MoBA's `moba_attn_varlen_naive` (moba/moba_naive.py at
61e456b) ported line by line to numpy; a query reads its own block and min(top_k, own + 1)
blocks in all, never a later one; with padding, padded keys are in no block mean; the
bidirectional form chooses among all blocks; decoding with rotary; the O(L)-memory form
(attention_impl='flash') equals the mask: outputs and gradients, causal or not, padded,
tiles smaller than the length (through the task config: tests/kernels/test_flash_attention.py).
"""
from __future__ import annotations

import jax
import numpy as np
import jax.numpy as jnp
import pytest
from flax import nnx

from models import registry
from models.attention import moba

from tests.models.helpers import (assert_forms_agree, check_prefill_and_steps, normal,
                                  randomize_params)
from tests.models.test_delta import assert_close, run


def build(*, causal: bool, dim: int = 16, heads: int = 2, **hparams):
    hparams = {"block_size": 4, "top_k": 2, **hparams}
    mixer = registry.build("moba", dim=dim, num_heads=heads, max_len=64, causal=causal,
                           rngs=nnx.Rngs(0), attention_dropout=0.0, **hparams)
    return randomize_params(mixer, seed=3, scale=0.4)


def moba_naive(q, k, v, chunk, topk):
    """moba_attn_varlen_naive for one sequence, in float64 numpy: q, k, v S x H x D."""
    s_len = q.shape[0]
    n = -(-s_len // chunk)
    means = np.stack([k[i * chunk:min(s_len, (i + 1) * chunk)].mean(0) for i in range(n)])
    gate = np.einsum("shd,nhd->hsn", q, means)
    for i in range(n):
        gate[:, :(i + 1) * chunk, i] = -np.inf
        gate[:, i * chunk:(i + 1) * chunk, i] = np.inf
    kk = min(topk, n)
    idx = np.argsort(-gate, axis=-1, kind="stable")[..., :kk]
    val = np.take_along_axis(gate, idx, -1).min(-1)
    need = gate >= val[..., None]
    chosen = np.zeros_like(need)
    np.put_along_axis(chosen, idx, True, -1)
    need &= chosen
    bias = np.where(need, 0.0, -np.inf)
    bias = np.repeat(bias, chunk, axis=-1)[:, :, :s_len]
    bias = np.where(np.tril(np.ones((s_len, s_len), bool)), bias, -np.inf)
    qk = np.einsum("xhd,yhd->hxy", q, k) + bias
    qk = qk / np.sqrt(q.shape[-1])
    p = np.exp(qk - qk.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("hxy,yhd->xhd", p, v)


@pytest.mark.parametrize("length,chunk,topk", [(13, 4, 2), (16, 4, 3), (9, 3, 1)])
def test_causal_layer_is_mobas_naive_reference(length, chunk, topk):
    mixer = build(causal=True, block_size=chunk, top_k=topk)
    x = normal(1, (2, length, 16))
    y = np.asarray(run(mixer, "__call__", x))
    w = lambda lin: (np.asarray(lin.kernel[...], np.float64),  # noqa: E731
                     np.asarray(lin.bias[...], np.float64))
    for b in range(2):
        xb = np.asarray(x[b], np.float64)
        proj = [xb @ kern + bias for kern, bias in map(w, (mixer.query, mixer.key,
                                                           mixer.value))]
        q, k, v = (t.reshape(length, 2, -1) for t in proj)
        o = moba_naive(q, k, v, chunk, topk).reshape(length, -1)
        kern, bias = w(mixer.out)
        assert_close(y[b], o @ kern + bias, rtol=1e-4, atol=1e-5)


def test_a_query_reads_its_own_block_and_top_k_in_all():
    q, k = normal(2, (1, 2, 23, 4)), normal(3, (1, 2, 23, 4))
    pos = jnp.arange(23)[None]
    chosen = np.asarray(moba.selected_blocks(q, k, jnp.ones((1, 23), bool), pos,
                                             block_size=4, top_k=3, causal=True))
    own = np.arange(23) // 4
    assert chosen[0, :, np.arange(23), own].all()
    assert (chosen.sum(-1) == np.minimum(3, own + 1)[None, None]).all()
    later = np.arange(chosen.shape[-1])[None] > own[:, None]
    assert not (chosen & later[None, None]).any()
    both = np.asarray(moba.selected_blocks(q, k, jnp.ones((1, 23), bool), pos, block_size=4,
                                           top_k=3, causal=False))
    assert (both.sum(-1) == 3).all() and (both & later[None, None]).any()


def test_padded_keys_are_in_no_block_mean():
    """Changing padded keys changes no choice and no real output (both directions)."""
    for causal in (True, False):
        mixer = build(causal=causal)
        x = normal(4, (2, 14, 16))
        mask = jnp.arange(14)[None] < jnp.array([[14], [10]])
        y = run(mixer, "__call__", x, mask)
        y2 = run(mixer, "__call__", jnp.where(mask[..., None], x, 9.0 * normal(5, x.shape)),
                 mask)
        real = np.asarray(mask)
        assert_close(np.asarray(y)[real], np.asarray(y2)[real], rtol=1e-6, atol=1e-6)


def test_prefill_and_steps_with_rotary():
    mixer = build(causal=True, rotary=True)
    check_prefill_and_steps(mixer, run, normal(6, (3, 15, 16)), jnp.array([1, 5, 9]), 9,
                            rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_form_equals_the_mask(causal):
    """attention_impl='flash' against 'dense': the layer's output and the gradients of
    its parameters and input, with a padded row and a length that is not a multiple of
    the block."""
    mask = jnp.arange(29)[None] < jnp.array([[29], [20]])
    assert_forms_agree(lambda **kw: build(causal=causal, top_k=3, **kw), normal(1, (2, 29, 16)),
                       mask, {impl: {"attention_impl": impl} for impl in moba.IMPLS})


@pytest.mark.parametrize("causal,top_k", [(True, 2), (False, 3), (False, 1)])
def test_the_kernels_key_blocks_are_the_mask_across_tiles(causal, top_k):
    """chunked_attention(key_blocks=...) in tiles of 8 over 37 positions, blocks of 3
    (tiles and blocks not aligned), against the dense attention with the chosen blocks'
    mask: output and gradients. With top_k=1 (each query its own block) and no causal
    pattern, the tiles off the diagonal are empty by the table alone: skipped."""
    from models import masks
    from models.kernels.chunked_attention import chunked_attention

    q, k, v = (normal(s, (2, 2, 37, 4)) for s in (1, 2, 3))
    valid = jnp.arange(37)[None] < jnp.array([[37], [30]])
    pos = jnp.broadcast_to(jnp.arange(37)[None], (2, 37))
    chosen = moba.selected_blocks(q, k, valid, pos, block_size=3, top_k=top_k,
                                   causal=causal)
    mask = moba.key_mask(chosen, valid, pos, block_size=3, causal=causal)
    weights = normal(4, (2, 2, 37, 4))
    flash = lambda q, k, v: chunked_attention(  # noqa: E731
        q, k, v, masks.causal() if causal else None, valid_BxKv=valid, chunk_q=8,
        chunk_k=8, key_blocks=(chosen, 3))
    dense_form = lambda q, k, v: moba.dense.dot_product_attention(  # noqa: E731
        q, k, v, mask=mask)
    assert_close(flash(q, k, v), dense_form(q, k, v), rtol=1e-5, atol=1e-6)
    loss = lambda f, *a: jnp.sum(weights * f(*a))  # noqa: E731
    for got, want in zip(jax.grad(loss, argnums=(1, 2, 3))(flash, q, k, v),
                         jax.grad(loss, argnums=(1, 2, 3))(dense_form, q, k, v)):
        assert_close(got, want, rtol=1e-5, atol=1e-6)
    if top_k == 1:
        pad = np.zeros((2, 2, 40, 40), bool)
        pad[:, :, :37, :37] = np.asarray(mask)
        per_tile = pad.reshape(2, 2, 5, 8, 5, 8).any(axis=(0, 1, 3, 5))
        assert per_tile.sum() < 25 and np.diag(per_tile).all()


def test_a_key_blocks_table_of_another_shape_is_refused():
    from models.kernels.chunked_attention import chunked_attention

    q = normal(1, (1, 2, 10, 4))
    with pytest.raises(ValueError, match=r"key_blocks: a table \(1, 2, 10, 3\)"):
        chunked_attention(q, q, q, key_blocks=(jnp.ones((1, 2, 10, 3), bool), 3))
    with pytest.raises(ValueError, match="a block of at least 1 key"):
        chunked_attention(q, q, q, key_blocks=(jnp.ones((1, 2, 10, 10), bool), 0))


def test_an_unknown_attention_impl_is_refused_by_name():
    with pytest.raises(registry.RegistryError, match="attention_impl='pallas' is not"):
        build(causal=True, attention_impl="pallas")
