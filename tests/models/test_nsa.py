"""nsa (models/attention/nsa.py) against fla's NativeSparseAttention.

The conformance suite checks padding, causality, variable length; the decoding suite
prefill + steps through the configs. Here: the causal layer equals fla's `naive_nsa`
(fla/ops/nsa/naive.py at bc3b101: naive_nsa_compression, naive_nsa_topk,
naive_nsa_selection, and flash_attn's causal window (window_size - 1, 0)) ported line by
line to float64 numpy, around fla's layer (q/k/v/g projections, sigmoid gates, o_proj);
the op with given block indices; the choice's counts (forced blocks, no later block, the
bidirectional form); right padding is the prefix; decoding with rotary and GQA; fla's
parameter count. scripts/fla_comparison/nsa_*.py compare against fla's own code.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention import nsa
from tests import tiers

from tests.models.helpers import (assert_forms_agree, check_prefill_and_steps, normal,
                                  randomize_params)
from tests.models.test_delta import assert_close, run

DIM = 16


def build(*, causal: bool = True, heads: int = 4, kv_heads: int = 2, **hparams):
    hparams = {"block_size": 4, "block_counts": 5, "window_size": 3, **hparams}
    mixer = registry.build("nsa", dim=DIM, num_heads=heads, max_len=64, causal=causal,
                           rngs=nnx.Rngs(0), num_kv_heads=kv_heads, qkv_dim=4 * heads,
                           **hparams)
    return randomize_params(mixer, seed=3, scale=0.5)


def softmax_masked(s, allow):
    """softmax over the last axis where allow; a row without any: 0 (fla's nan_to_num)."""
    s = np.where(allow, s, -np.inf)
    m = np.max(s, -1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    tot = p.sum(-1, keepdims=True)
    return np.where(tot > 0, p / np.where(tot > 0, tot, 1.0), 0.0)


def naive_nsa(q, k, v, g_cmp, g_slc, g_swa, *, block_counts, block_size, window_size,
              block_indices=None):
    """fla's naive_nsa for one sequence in float64: q T x HQ x K, k/v T x H x K, gates
    T x HQ; block_indices T x H x S (-1 empty) overrides the choice. Returns (o, indices)."""
    T, HQ, K = q.shape
    H = k.shape[1]
    G, BS, S = HQ // H, block_size, block_counts
    scale = K ** -0.5
    TC = -(-T // BS)
    # mean_pooling: the mean of each block's tokens (the last one: of those it has)
    k_cmp = np.stack([k[c * BS:(c + 1) * BS].mean(0) for c in range(TC)])
    v_cmp = np.stack([v[c * BS:(c + 1) * BS].mean(0) for c in range(TC)])
    rep = lambda x: np.repeat(x, G, axis=1)  # noqa: E731  'b t h d -> b t (h g) d'
    i_t, i_c = np.arange(T)[:, None], np.arange(TC)[None]
    allow_causal = (i_c + 1) * BS - 1 <= i_t  # T x TC
    # naive_nsa_compression
    attn = np.einsum("thd,chd->thc", q, rep(k_cmp)) * scale
    probs = softmax_masked(attn, allow_causal[:, None])
    o_cmp = np.einsum("thc,chv->thv", probs, rep(v_cmp))
    # naive_nsa_topk
    if block_indices is None:
        i_blk = i_t // BS
        forced = (i_c == i_blk) | (i_c == 0) | (i_c == i_blk - 1)
        scores = probs.reshape(T, H, G, TC).mean(2)
        scores = np.where(forced[:, None], 1.0, scores)
        # fla leaves the order of equal scores open (S below the forced blocks); ours:
        # own block, then own - 1, then block 0, then the lower index
        tie = np.where(i_c == i_blk, 3, np.where(i_c == 0, 1, 2)) * forced
        i_top = np.lexsort((np.broadcast_to(-tie[:, None], scores.shape), -scores))
        i_top = i_top[..., :min(S, TC)]
        top_allowed = np.take_along_axis(
            np.broadcast_to((allow_causal | forced)[:, None], (T, H, TC)), i_top, -1)
        sel = np.where(top_allowed, i_top, -1)
        block_indices = np.concatenate([sel, np.full((T, H, S - sel.shape[-1]), -1)], -1)
    # naive_nsa_selection
    o_slc = np.zeros((T, HQ, v.shape[-1]))
    for t in range(T):
        for hq in range(HQ):
            blocks = block_indices[t, hq // G]
            keys = [j for c in blocks if c >= 0 for j in range(c * BS, (c + 1) * BS) if j <= t]
            w = softmax_masked(k[keys, hq // G] @ q[t, hq] * scale, np.ones(len(keys), bool))
            o_slc[t, hq] = w @ v[keys, hq // G]
    o = o_slc * g_slc[..., None] + o_cmp * g_cmp[..., None]
    if window_size > 0:  # flash_attn_func(causal=True, window_size=(window_size - 1, 0))
        j = np.arange(T)[None]
        in_window = (j <= i_t) & (j >= i_t - (window_size - 1))
        w = softmax_masked(np.einsum("thd,jhd->thj", q, rep(k)) * scale, in_window[:, None])
        o = o + np.einsum("thj,jhv->thv", w, rep(v)) * g_swa[..., None]
    return o, block_indices


def fla_layer(mixer, x_LxD, block_indices=None):
    """fla's NativeSparseAttention.forward (no rotary, no mask) in float64 around
    naive_nsa, with the mixer's weights."""
    f64 = lambda lin: np.asarray(lin.kernel[...], np.float64)  # noqa: E731
    x = np.asarray(x_LxD, np.float64)
    T, K = x.shape[0], mixer.head_dim
    q = (x @ f64(mixer.query)).reshape(T, -1, K)
    k = (x @ f64(mixer.key)).reshape(T, -1, K)
    v = (x @ f64(mixer.value)).reshape(T, -1, K)
    g = 1.0 / (1.0 + np.exp(-(x @ f64(mixer.gate)).reshape(T, -1, 3)))
    o, idx = naive_nsa(q, k, v, g[..., 0], g[..., 1], g[..., 2],
                       block_counts=mixer.block_counts, block_size=mixer.block_size,
                       window_size=mixer.window_size, block_indices=block_indices)
    return o.reshape(T, -1) @ f64(mixer.out), idx


# (length, heads, kv heads, block_size, block_counts, window_size): content choice among
# 10 blocks (5 slots, 3 forced); fewer slots than forced blocks; more slots than blocks
# and no window; one kv head per query head.
SETTINGS = [(40, 4, 2, 4, 5, 3), (23, 4, 1, 3, 2, 5), (13, 2, 1, 4, 16, 0), (18, 2, 2, 3, 4, 4)]


@pytest.mark.parametrize("length,heads,kv,bs,counts,window", SETTINGS)
def test_causal_layer_is_flas_naive_nsa(length, heads, kv, bs, counts, window):
    mixer = build(heads=heads, kv_heads=kv, block_size=bs, block_counts=counts,
                  window_size=window)
    x = normal(1, (2, length, DIM))
    y = np.asarray(run(mixer, "__call__", x))
    for b in range(2):
        want, idx = fla_layer(mixer, x[b])
        assert_close(y[b], want, rtol=1e-4, atol=1e-5)
    # Not vacuous: the content choice matters where there are more candidates than slots.
    if (length, counts) == (40, 5):
        assert ((idx >= 0).sum(-1) == 5).any()
        shifted = np.where(idx > 0, idx - 1, idx)  # another choice of as many blocks
        other, _ = fla_layer(mixer, x[1], block_indices=shifted)
        assert not np.allclose(y[1], other, rtol=1e-3, atol=1e-3)


def test_op_with_given_block_indices():
    """nsa_branches(block_idx=...) as naive_nsa(block_indices=...): random blocks <= own
    (fla's tests/ops/test_nsa.py build_block_indices), -1 in the free slots."""
    rng = np.random.default_rng(0)
    T, HQ, H, K, BS, S = 21, 4, 2, 8, 4, 3
    q, k, v = (rng.standard_normal((T, n, K)) for n in (HQ, H, H))
    idx = np.full((T, H, S), -1)
    for t in range(T):
        for h in range(H):
            pick = rng.permutation(-(-(t + 1) // BS))[:S]
            idx[t, h, :len(pick)] = np.sort(pick)
    ones = np.ones((T, HQ))
    want, _ = naive_nsa(q, k, v, 0 * ones, ones, 0 * ones, block_counts=S, block_size=BS,
                        window_size=0, block_indices=idx)
    to = lambda a: jnp.asarray(a.transpose(1, 0, 2)[None], jnp.float32)  # noqa: E731
    _, o_slc, _ = nsa.nsa_branches(to(q), to(k), to(v), jnp.ones((1, T), bool),
                                   jnp.arange(T)[None], block_size=BS, block_counts=S,
                                   causal=True, block_idx=jnp.asarray(idx.transpose(1, 0, 2)[None]))
    assert_close(np.asarray(o_slc)[0].transpose(1, 0, 2), want, rtol=1e-5, atol=1e-5)


def test_the_choice_counts():
    """Causal: min(S, candidates) blocks, the forced ones (0, own - 1, own) among them,
    never a later one; causal=False: S among all blocks, own + 1 forced too."""
    T, BS, S = 27, 3, 5
    probs = jnp.asarray(np.random.default_rng(1).dirichlet(np.ones(9), (1, 2, 2, T)),
                        jnp.float32)  # B x G x Hg x Q x N
    count = jnp.full((1, 9), float(BS))
    pos = jnp.arange(T)[None]
    own = np.arange(T) // BS
    for causal in (True, False):
        visible = nsa.visible_blocks(pos, count, block_size=BS, causal=causal)
        idx = np.asarray(nsa.choose_blocks(probs, visible, count, pos, block_size=BS,
                                           block_counts=S, causal=causal))[0]  # G x T x S
        chosen = np.zeros((2, T, 9), bool)
        for c in range(9):
            chosen[..., c] = (idx == c).any(-1)
        forced = [own, np.maximum(own - 1, 0), np.zeros_like(own)]
        if causal:
            candidates = np.maximum((np.arange(T) + 1) // BS, own + 1)
            assert ((idx >= 0).sum(-1) == np.minimum(S, candidates)).all()
            assert not (chosen & (np.arange(9) > own[:, None])).any()
        else:
            forced.append(np.minimum(own + 1, 8))
            assert ((idx >= 0).sum(-1) == S).all()
            assert (chosen & (np.arange(9) > own[:, None] + 1)).any()
        for f in forced:
            assert chosen[:, np.arange(T), f].all()


def test_right_padding_is_the_prefix_and_padded_keys_do_nothing():
    """Both directions: outputs at real positions are the prefix's alone (fla's unpadded
    sequence), whatever the padded inputs."""
    for causal in (True, False):
        mixer = build(causal=causal, block_size=3, block_counts=3, window_size=2)
        x = normal(4, (2, 14, DIM))
        mask = jnp.arange(14)[None] < jnp.array([[14], [10]])
        y = np.asarray(run(mixer, "__call__", x, mask))
        y2 = np.asarray(run(mixer, "__call__",
                            jnp.where(mask[..., None], x, 9.0 * normal(5, x.shape)), mask))
        prefix = np.asarray(run(mixer, "__call__", x[1:, :10]))
        assert_close(y[1, :10], prefix[0], rtol=1e-5, atol=1e-5)
        real = np.asarray(mask)
        assert_close(y[real], y2[real], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_prefill_and_steps_with_rotary(kv_heads):
    mixer = build(kv_heads=kv_heads, rotary=True)
    check_prefill_and_steps(mixer, run, normal(6, (3, 19, DIM)), jnp.array([1, 6, 9]), 9,
                            rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_parameter_count_is_flas(qkv_bias):
    """fla's __init__: q_proj D x HK, k_proj and v_proj D x H_kv K (bias with qkv_bias),
    g_proj D x 3H and o_proj HK x D without bias; num_kv_heads num_heads // 16."""
    D, H, K = 48, 32, 6
    mixer = registry.build("nsa", dim=D, num_heads=H, max_len=8, causal=True,
                           rngs=nnx.Rngs(0), qkv_dim=H * K, qkv_bias=qkv_bias)
    assert mixer.num_kv_heads == 2
    kv = 2 * K
    fla = D * H * K + 2 * D * kv + D * 3 * H + H * K * D + qkv_bias * (H * K + 2 * kv)
    ours = sum(p.size for p in jax.tree.leaves(nnx.state(mixer, nnx.Param)))
    assert ours == fla


@pytest.mark.parametrize("causal", [True, tiers.exhaustive(False)])
def test_flash_form_equals_the_gathered_one(causal):
    """attention_impl='flash' (the selected branch chunked, its blocks as a table) against
    'dense' (gathered): the layer's output and the gradients of its parameters and input,
    GQA (4 heads, 2 kv heads), a padded row, a length that is not a multiple of the block,
    fewer candidates than block_counts for the first queries."""
    mask = jnp.arange(27)[None] < jnp.array([[27], [19]])
    assert_forms_agree(
        lambda **kw: build(causal=causal, block_size=4, block_counts=3, window_size=5, **kw),
        normal(1, (2, 27, 16)), mask, {impl: {"attention_impl": impl} for impl in nsa.IMPLS})


def test_an_unknown_attention_impl_is_refused_by_name():
    with pytest.raises(registry.RegistryError, match="attention_impl='blocksparse' is not"):
        build(attention_impl="blocksparse")
