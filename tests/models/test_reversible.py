"""Block-level options from Reformer: chunked feed-forward and the reversible stack."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import stacks
from models.blocks import MlpBlock
from models.stacks import resolve_block
from models.encoder import Encoder
from tests.models.helpers import normal

DIM, MLP_DIM, BATCH, LEN = 16, 32, 2, 12
TOL = dict(rtol=1e-5, atol=1e-5)


def mlp(chunks: int, dropout_rate: float = 0.0) -> MlpBlock:
    return MlpBlock(dim=DIM, mlp_dim=MLP_DIM, dropout_rate=dropout_rate, chunks=chunks,
                    rngs=nnx.Rngs(params=0, dropout=1))


# Chunked feed-forward -----------------------------------------------------------------

@pytest.mark.parametrize("chunks,length", [(4, 13), (3, 12), (20, 13)])
def test_chunked_ffn_equals_unchunked(chunks, length):
    """Also for lengths that chunks does not divide, and more chunks than positions."""
    whole, chunked = mlp(1), mlp(chunks)
    x = normal(0, (BATCH, length, DIM))
    w = normal(1, (BATCH, length, DIM))

    def loss_and_grads(model):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        loss = lambda p, x: jnp.sum(nnx.merge(graphdef, p, rest)(x, deterministic=True) * w)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)

    (l1, g1), (l2, g2) = loss_and_grads(whole), loss_and_grads(chunked)
    np.testing.assert_allclose(l1, l2, **TOL)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


def test_chunked_ffn_dropout_is_applied_and_advances():
    model = mlp(4, dropout_rate=0.5)
    x = normal(0, (BATCH, LEN, DIM))
    y1, y2 = model(x, deterministic=False), model(x, deterministic=False)
    assert not np.allclose(np.asarray(y1), np.asarray(y2))
    dropped = np.mean(np.asarray(y1) == 0)  # output dropout at rate 0.5
    assert 0.3 < dropped < 0.7


# Reversible stack ---------------------------------------------------------------------

def stack(num_layers: int = 2, model: str = "transformer", *, dropout_rate: float = 0.0,
          ffn_chunks: int = 1, **hparams) -> stacks.ReversibleStack:
    block = resolve_block(model, {"stack": "reversible", "ffn_chunks": ffn_chunks})
    return stacks.ReversibleStack(
        num_layers=num_layers, dim=DIM, num_heads=2, mlp_dim=MLP_DIM, max_len=LEN,
        model=model, model_hparams=hparams, causal=False, dropout_rate=dropout_rate,
        block=block, rngs=nnx.Rngs(params=0, dropout=1))


def plain_reversible(module, x, mask, deterministic):
    """The same formula without the custom VJP: autodiff stores every activation."""
    x1 = x2 = x
    for layer in module.blocks:
        x1 = x1 + layer.mix(x2, mask, deterministic=deterministic)
        x2 = x2 + layer.feed_forward(x1, deterministic=deterministic)
    return (x1 + x2) / 2


def grads(module, call, x, mask, deterministic):
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    w = normal(9, x.shape)

    @jax.jit
    def run(params, rest, x):
        model = nnx.merge(graphdef, params, rest)
        loss = lambda m, x: jnp.sum(call(m, x, mask, deterministic) * w)
        return nnx.value_and_grad(loss, argnums=(nnx.DiffState(0, nnx.Param), 1))(model, x)

    return run(params, rest, x)


@pytest.mark.parametrize("layers,model,hparams,deterministic", [
    (2, "transformer", {}, True),
    pytest.param(2, "transformer", {"attention_dropout": 0.2}, False, marks=pytest.mark.slow),
    # LSH draws its rotations from the rng stream in training: the recomputation must
    # replay the stream to hash alike. One layer keeps the compilation short.
    (1, "reformer", {"n_buckets": 4, "n_hashes": 2, "chunk_len": 4}, False),
])
def test_reversible_gradients_equal_plain(layers, model, hparams, deterministic):
    module = stack(layers, model, dropout_rate=0.0 if deterministic else 0.2, ffn_chunks=2,
                   **hparams)
    x = normal(0, (BATCH, LEN, DIM))
    mask = jnp.arange(LEN)[None, :] < jnp.array([[LEN], [LEN - 4]])
    call = lambda m, x, mask, d: m(x, mask, deterministic=d)
    loss_rev, g_rev = grads(module, call, x, mask, deterministic)
    loss_plain, g_plain = grads(module, plain_reversible, x, mask, deterministic)
    np.testing.assert_allclose(loss_rev, loss_plain, **TOL)
    leaves_rev, leaves_plain = jax.tree.leaves(g_rev), jax.tree.leaves(g_plain)
    assert len(leaves_rev) == len(leaves_plain)
    for a, b in zip(leaves_rev, leaves_plain):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)
    assert max(float(np.abs(np.asarray(a)).max()) for a in leaves_rev) > 1e-3


def test_reversible_dropout_advances_between_calls():
    module = stack(2, dropout_rate=0.5)
    x = normal(0, (BATCH, LEN, DIM))
    y1, y2 = module(x, None, deterministic=False), module(x, None, deterministic=False)
    assert not np.allclose(np.asarray(y1), np.asarray(y2))
    np.testing.assert_array_equal(np.asarray(module(x, None, deterministic=True)),
                                  np.asarray(module(x, None, deterministic=True)))


def temp_bytes(module, x, call) -> int:
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)

    def loss(params, x):
        return jnp.sum(call(nnx.merge(graphdef, params, rest), x) ** 2)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.slow  # three 8-layer compilations
def test_reversible_memory_does_not_grow_like_sequential():
    """8 layers: XLA's temporary memory for the gradient, far below the other stacks."""
    length, layers = 256, 8
    x = normal(0, (1, length, DIM))
    rev = stack(layers)
    block = resolve_block("transformer")
    seq = stacks.SequentialStack(
        num_layers=layers, dim=DIM, num_heads=2, mlp_dim=MLP_DIM, max_len=length,
        model="transformer", model_hparams={}, causal=False, dropout_rate=0.0, block=block,
        rngs=nnx.Rngs(params=0, dropout=1))
    reversible = temp_bytes(rev, x, lambda m, x: m(x, None, deterministic=True))
    plain = temp_bytes(rev, x, lambda m, x: plain_reversible(m, x, None, True))
    sequential = temp_bytes(seq, x, lambda m, x: m(x, None, deterministic=True))
    assert reversible < 0.5 * plain and reversible < 0.5 * sequential, (
        reversible, plain, sequential)


@pytest.mark.parametrize("model,hparams", [("local", {"window": 4}), ("transformer", {})])
def test_any_mixer_runs_in_a_reversible_encoder(model, hparams):
    encoder = Encoder(vocab_size=10, max_len=LEN, model=model, model_hparams=hparams,
                      emb_dim=DIM, num_heads=2, num_layers=2, mlp_dim=MLP_DIM,
                      block={"stack": "reversible"}, rngs=nnx.Rngs(params=0, dropout=1))
    assert isinstance(encoder.stack, stacks.ReversibleStack)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 10, (BATCH, LEN)))
    graphdef, params, rest = nnx.split(encoder, nnx.Param, ...)

    def loss(params):
        y, _ = nnx.merge(graphdef, params, rest)(tokens, deterministic=True)
        return jnp.sum(y ** 2)

    leaves = jax.tree.leaves(jax.jit(jax.grad(loss))(params))
    assert all(np.isfinite(np.asarray(g)).all() for g in leaves)


def test_reformer_defaults_to_the_reversible_stack():
    assert resolve_block("reformer")["stack"] == "reversible"
    assert resolve_block("reformer", {"stack": "sequential"})["stack"] == "sequential"


@pytest.mark.parametrize("model,hparams,block,match", [
    ("luna", {"packed_len": 4}, {}, "'luna' carries state"),
    ("adaptive_span", {}, {}, "'adaptive_span' sows an aux_loss"),
    ("transformer", {}, {"kind": "gated"}, "block kind 'pre_ln'"),
])
def test_unsupported_combinations_are_refused(model, hparams, block, match):
    with pytest.raises(ValueError, match=match):
        encoder = Encoder(vocab_size=10, max_len=LEN, model=model, model_hparams=hparams,
                          emb_dim=DIM, num_heads=2, num_layers=1, mlp_dim=MLP_DIM,
                          block={"stack": "reversible", **block},
                          rngs=nnx.Rngs(params=0, dropout=1))
        encoder(jnp.ones((1, LEN), jnp.int32), deterministic=True)
