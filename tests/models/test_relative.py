"""transformer_xl / gtrxl: relative attention against Dai et al.'s (a)+(b)+(c)+(d) in
float64 numpy, and the segment-recurrent stack against an explicit segment loop."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry, stacks
from models.stacks import resolve_block
from tests.models.helpers import normal

DIM, HEADS, BATCH, MLP = 16, 2, 2, 32
HEAD_DIM = DIM // HEADS
TOL = dict(rtol=1e-5, atol=1e-5)


def randomize(module: nnx.Module, seed: int = 0, scale: float = 0.5) -> nnx.Module:
    """Every Param (zero biases, u, v included) redrawn at random."""
    rng = np.random.default_rng(seed)
    nnx.update(module, jax.tree.map(
        lambda leaf: jnp.asarray(scale * rng.standard_normal(leaf.shape), leaf.dtype),
        nnx.state(module, nnx.Param)))
    return module


def build_mixer(causal: bool = False) -> nnx.Module:
    return randomize(registry.build("transformer_xl", dim=DIM, num_heads=HEADS, max_len=32,
                                    causal=causal, rngs=nnx.Rngs(params=0, dropout=1)))


def f64(p) -> np.ndarray:
    return np.asarray(p[...], np.float64)


def reference(mixer, x, mask, causal: bool, memory=None, memory_mask=None) -> np.ndarray:
    """Dai et al. 2019, sec. 3.3: A_ij = q_i k_j + q_i W_R R_{i-j} + u k_j + v W_R R_{i-j}."""
    x = np.asarray(x, np.float64)
    b, q_len, d = x.shape
    kv = x if memory is None else np.concatenate([np.asarray(memory, np.float64), x], 1)
    kv_len = kv.shape[1]
    mem_len = kv_len - q_len
    kv_mask = np.ones((b, kv_len), bool)
    if mask is not None:
        kv_mask[:, mem_len:] = mask
    if memory_mask is not None:
        kv_mask[:, :mem_len] = memory_mask

    def proj(lin, inp):
        y = inp @ f64(lin.kernel) + f64(lin.bias)
        return y.reshape(b, -1, HEADS, HEAD_DIM)

    q, k, v = proj(mixer.query, x), proj(mixer.key, kv), proj(mixer.value, kv)
    u, vb = f64(mixer.content_bias), f64(mixer.position_bias)
    w_r = f64(mixer.relative.kernel)
    inv_freq = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    out = np.zeros((b, q_len, HEADS, HEAD_DIM))
    for bi in range(b):
        for h in range(HEADS):
            for i in range(q_len):
                scores = np.full(kv_len, -np.inf)
                for j in range(kv_len):
                    if not kv_mask[bi, j] or (causal and j > mem_len + i):
                        continue
                    dist = mem_len + i - j
                    r = np.concatenate([np.sin(dist * inv_freq), np.cos(dist * inv_freq)])
                    wr = (r @ w_r).reshape(HEADS, HEAD_DIM)[h]
                    qi, kj = q[bi, i, h], k[bi, j, h]
                    scores[j] = (qi @ kj + qi @ wr + u[h] @ kj + vb[h] @ wr) / np.sqrt(HEAD_DIM)
                weights = np.exp(scores - scores.max())
                out[bi, i, h] = (weights / weights.sum()) @ v[bi, :, h]
    merged = out.reshape(b, q_len, DIM)
    return merged @ f64(mixer.out.kernel) + f64(mixer.out.bias)


@pytest.mark.parametrize("causal", [False, True])
def test_matches_dai_formula_without_memory(causal):
    mixer = build_mixer(causal)
    x = normal(0, (BATCH, 10, DIM))
    mask = np.arange(10)[None] < np.array([[10], [7]])
    y = mixer(x, padding_mask=jnp.asarray(mask), deterministic=True)
    np.testing.assert_allclose(np.asarray(y)[mask], reference(mixer, x, mask, causal)[mask],
                               **TOL)


@pytest.mark.parametrize("causal", [False, True])
def test_matches_dai_formula_with_memory(causal):
    mixer = build_mixer(causal)
    x, memory = normal(1, (BATCH, 6, DIM)), normal(2, (BATCH, 5, DIM))
    memory_mask = np.array([[True] * 5, [False, True, True, False, True]])
    y = mixer(x, deterministic=True, memory=memory, memory_mask=jnp.asarray(memory_mask))
    np.testing.assert_allclose(
        np.asarray(y), reference(mixer, x, None, causal, memory, memory_mask), **TOL)


def build_stack(name: str, causal: bool = False, **block) -> nnx.Module:
    settings = resolve_block(name, block)
    stack = stacks.STACKS[settings["stack"]](
        num_layers=2, dim=DIM, num_heads=HEADS, mlp_dim=MLP, max_len=32, model=name,
        model_hparams={}, causal=causal, dropout_rate=0.1, block=settings,
        rngs=nnx.Rngs(params=0, dropout=1))
    return randomize(stack, scale=0.3)


@functools.cache
def shared_stack(name: str, causal: bool = False) -> nnx.Module:
    """One stack per (name, causal) for the whole module: building is the slow part."""
    return build_stack(name, causal)


def with_segments(stack: nnx.Module, segment_len: int, mem_len: int = 0) -> nnx.Module:
    stack.segment_len, stack.mem_len = segment_len, mem_len
    return stack


def segment_loop(stack, x, mask, seg_len: int, mem_len: int) -> np.ndarray:
    """The recurrence written out: layer i of segment s sees stop_grad(its inputs of the
    last mem_len positions before s); no memory in the first segment."""
    length = x.shape[1]
    inputs = {}  # (layer, segment) -> that layer's input on that segment
    outputs = []
    for s in range(length // seg_len):
        sl = slice(s * seg_len, (s + 1) * seg_len)
        h = x[:, sl]
        for i, layer in enumerate(stack.blocks):
            inputs[i, s] = h
            if s == 0:
                h = layer(h, mask[:, sl], deterministic=True)
            else:
                past = jnp.concatenate([inputs[i, t] for t in range(s)], 1)[:, -mem_len:]
                past_mask = mask[:, :s * seg_len][:, -mem_len:]
                h = layer(h, mask[:, sl], deterministic=True, memory=past,
                          memory_mask=past_mask)
        outputs.append(h)
    return np.asarray(jnp.concatenate(outputs, 1))


@pytest.mark.parametrize("name", ["transformer_xl", "gtrxl"])
def test_segment_stack_matches_explicit_recurrence(name):
    stack = with_segments(shared_stack(name), 4, 6)
    x = normal(3, (BATCH, 12, DIM))
    # A padded gap inside the first segment: the memory of later segments must mask it.
    mask = jnp.asarray(np.arange(12)[None] != np.array([[-1], [2]]))
    y = stack(x, mask, deterministic=True)
    expected = segment_loop(stack, x, mask, seg_len=4, mem_len=6)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(y)[real], expected[real], **TOL)
    # ... and the gap's contents never reach a real position.
    x_changed = jnp.where(mask[..., None], x, 5.0 * normal(4, x.shape))
    np.testing.assert_allclose(np.asarray(stack(x_changed, mask, deterministic=True))[real],
                               np.asarray(y)[real], **TOL)


def test_one_segment_is_plain_relative_attention():
    stack = with_segments(shared_stack("transformer_xl"), 0)
    x = normal(5, (BATCH, 10, DIM))
    h = x
    for layer in stack.blocks:  # pre_ln blocks whose mixer sees no memory
        h = layer(h, None, deterministic=True)
    np.testing.assert_allclose(np.asarray(stack(x, None, deterministic=True)), np.asarray(h),
                               **TOL)


def test_memory_is_stop_gradient_and_uneven_lengths_are_padded():
    stack = with_segments(shared_stack("transformer_xl"), 4)
    x = normal(6, (1, 10, DIM))  # segments 4, 4, 2 (+2 padding)
    y = stack(x, None, deterministic=True)
    assert y.shape == x.shape and np.isfinite(np.asarray(y)).all()
    # The memory carries values forward: the first segment changes the second...
    x_changed = x.at[:, :4].set(normal(7, (1, 4, DIM)))
    assert not np.allclose(np.asarray(stack(x_changed, None, deterministic=True))[:, 4:8],
                           np.asarray(y)[:, 4:8])
    # ... but no gradient flows back into it through the memory.
    graphdef, state = nnx.split(stack)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(
        nnx.merge(graphdef, state)(x, None, deterministic=True)[:, 4:8])))(x)
    assert np.abs(np.asarray(grad[:, :4])).max() == 0
    assert np.abs(np.asarray(grad[:, 4:8])).max() > 0


def test_causal_stack_never_sees_the_future():
    stack = with_segments(shared_stack("gtrxl", causal=True), 4)
    x = normal(8, (BATCH, 12, DIM))
    y = stack(x, None, deterministic=True)
    for t in (2, 5):
        future = (jnp.arange(12) > t)[None, :, None]
        y_future = stack(jnp.where(future, normal(9, x.shape), x), None, deterministic=True)
        np.testing.assert_allclose(np.asarray(y_future)[:, :t + 1], np.asarray(y)[:, :t + 1],
                                   **TOL)


def test_segment_stack_refuses_mixers_without_memory():
    with pytest.raises(ValueError, match="takes memory"):
        build_stack("transformer", stack="segment_recurrent")
