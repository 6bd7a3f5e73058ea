"""routing: outputs against explicit float64 loops, centroid EMA state, commitment loss,
and centroids carried through the training step."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import registry
from models.attention.routing import Centroids
from tests.models.helpers import f64, normal, randomize_params

DIM, HEADS, BATCH, LEN = 16, 2, 2, 12
TOL = dict(rtol=1e-5, atol=1e-5)


def build(causal: bool = False, **hparams) -> nnx.Module:
    model = registry.build("routing", dim=DIM, num_heads=HEADS, max_len=16, causal=causal,
                           rngs=nnx.Rngs(params=0, dropout=1), attention_dropout=0.0,
                           **hparams)
    randomize_params(model, seed=3)
    return model


def linear(layer: nnx.Linear, x) -> np.ndarray:
    return f64(x) @ f64(layer.kernel) + f64(layer.bias)


def heads(x_BxLxF) -> np.ndarray:
    b, l, f = x_BxLxF.shape
    return x_BxLxF.reshape(b, l, HEADS, f // HEADS).transpose(0, 2, 1, 3)


def unit(x) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, -1, keepdims=True) + 1e-6)


def reference(model, x, real_BxL, *, causal: bool, w: int) -> np.ndarray:
    """Routing attention by explicit loops over examples, heads, groups and tokens."""
    shared, mu = model.shared_qk, f64(model.centroids)
    q, v = heads(linear(model.query, x)), heads(linear(model.value, x))
    qn = unit(q)
    k = qn if shared else heads(linear(model.key, x))
    kn = unit(k)
    b, h, length, kd = q.shape
    c = mu.shape[1]
    o = np.zeros_like(q)
    for bi in range(b):
        real = real_BxL[bi]
        for hi in range(h):
            def softmax_row(i, keys):
                others = [j for j in keys if not (shared and j == i)]
                keys = others or ([i] if shared and i in keys else [])
                if not keys:
                    return np.zeros(kd)
                logits = np.array([q[bi, hi, i] @ k[bi, hi, j] for j in keys]) / np.sqrt(kd)
                p = np.exp(logits - logits.max())
                return (p / p.sum()) @ v[bi, hi, keys]

            if causal:
                assign = np.where(real, np.argmax(qn[bi, hi] @ mu[hi].T, -1), -1)
                slot = [np.sum(assign[:i] == assign[i]) for i in range(length)]
                for i in np.flatnonzero(real):
                    run = [j for j in range(i + 1) if real[j] and assign[j] == assign[i]
                           and slot[j] // w == slot[i] // w]
                    o[bi, hi, i] = softmax_row(i, run)
                continue

            def groups(xn):  # per centroid, its top-w real tokens (padded ones would be last)
                scores = xn[bi, hi] @ mu[hi].T
                return [[j for j in np.argsort(-scores[:, ci], kind="stable") if real[j]][:w]
                        for ci in range(c)]

            q_groups = groups(qn)
            k_groups = q_groups if shared else groups(kn)
            for i in np.flatnonzero(real):
                outs = [softmax_row(i, kg)
                        for qg, kg in zip(q_groups, k_groups) if i in qg]
                o[bi, hi, i] = np.mean(outs, axis=0) if outs else 0.0  # in no group: 0
    return linear(model.out, o.transpose(0, 2, 1, 3).reshape(b, length, h * kd))


@pytest.mark.parametrize("causal,shared_qk", [(False, True), (False, False), (True, True),
                                              (True, False)])
def test_matches_reference(causal, shared_qk):
    model = build(causal=causal, num_clusters=3, window=5, shared_qk=shared_qk)
    x = normal(0, (BATCH, LEN, DIM))
    real = np.arange(LEN)[None, :] < np.array([[LEN], [LEN - 4]])
    y = model(x, padding_mask=jnp.asarray(real), deterministic=True)
    expected = reference(model, x, real, causal=causal, w=5)
    np.testing.assert_allclose(np.asarray(y)[real], expected[real], **TOL)
    if not causal:  # not vacuous: some token sits in no group, some in several
        counts = np.zeros((BATCH, HEADS, LEN))
        scores = np.einsum("bhlk,hck->bhcl", unit(heads(linear(model.query, x))),
                           f64(model.centroids))
        top = np.argsort(-np.where(real[:, None, None, :], scores, -np.inf), axis=-1)[..., :5]
        for bi, hi, ci in np.ndindex(*top.shape[:3]):
            counts[bi, hi, top[bi, hi, ci]] += 1
        assert (counts[real[:, None].repeat(HEADS, 1)] == 0).any()
        assert (counts > 1).any()


def test_centroids_move_in_training_only():
    decay, commitment = 0.5, 0.3
    model = build(num_clusters=3, decay=decay, commitment=commitment)
    assert isinstance(model.centroids, Centroids)
    assert not isinstance(model.centroids, nnx.Param)
    assert "centroids" not in nnx.state(model, nnx.Param)  # the optimiser never sees them
    mu0 = f64(model.centroids)
    np.testing.assert_allclose(np.linalg.norm(mu0, axis=-1), 1.0, rtol=1e-6)
    x = normal(1, (BATCH, LEN, DIM))
    real = np.arange(LEN)[None, :] < np.array([[LEN], [LEN - 3]])

    model(x, padding_mask=jnp.asarray(real), deterministic=True)
    np.testing.assert_array_equal(f64(model.centroids), mu0)
    assert not nnx.state(model, nnx.Intermediate)

    model(x, padding_mask=jnp.asarray(real), deterministic=False)
    xn = unit(heads(linear(model.query, x)))  # B x H x L x K, real tokens only below
    assign = np.argmax(np.einsum("bhlk,hck->bhlc", xn, mu0), -1)
    expected = mu0.copy()
    sq_err = []
    for hi in range(HEADS):
        members = {ci: [] for ci in range(3)}
        for bi, li in zip(*np.nonzero(real)):
            members[assign[bi, hi, li]].append(xn[bi, hi, li])
            sq_err.append(np.sum((xn[bi, hi, li] - mu0[hi, assign[bi, hi, li]]) ** 2))
        for ci, vecs in members.items():
            if vecs:
                moved = decay * mu0[hi, ci] + (1 - decay) * np.mean(vecs, axis=0)
                expected[hi, ci] = moved / np.linalg.norm(moved)
    assert sum(1 for ci in range(3) if (assign == ci).any()) >= 2  # not vacuous
    np.testing.assert_allclose(f64(model.centroids), expected, rtol=1e-4, atol=1e-5)
    (aux,) = nnx.state(model, nnx.Intermediate)["aux_loss"].value
    np.testing.assert_allclose(float(aux), commitment * np.mean(sq_err), rtol=1e-4)


def test_commitment_gradient_and_centroids_through_nnx_grad():
    """As in lra/train.py's step: nnx.grad over the Params carries the centroid update out."""
    model = build(num_clusters=3, commitment=1.0, decay=0.5)
    mu0 = f64(model.centroids)
    x = normal(2, (BATCH, LEN, DIM))

    def aux(model):
        model(x, deterministic=False)
        return sum(jnp.sum(a) for a in nnx.pop(model, nnx.Intermediate)["aux_loss"].value)

    grads = nnx.grad(aux, argnums=nnx.DiffState(0, nnx.Param))(model)
    assert np.abs(np.asarray(grads["query"]["kernel"][...])).max() > 0
    assert np.abs(np.asarray(grads["value"]["kernel"][...])).max() == 0  # routing only
    assert np.abs(f64(model.centroids) - mu0).max() > 1e-3


@pytest.mark.slow
def test_train_step_carries_centroids(tiny_listops_config, listops_dir):
    """The loop's jitted train step returns moved centroids in `rest`; eval leaves them."""
    import lra.tasks
    from lra import train
    from lra.training import optim

    config = tiny_listops_config(listops_dir, model="routing", num_layers=1, emb_dim=16,
                                 qkv_dim=16, mlp_dim=16, num_heads=2, max_length=16,
                                 batch_size=2)
    config.model_hparams.decay = 0.5
    task = lra.tasks.get(config.task)
    graphdef, params, rest = nnx.split(train.build_model(config, task), nnx.Param, ...)
    schedule = optim.learning_rate_schedule(config)
    tx = optim.make_optimizer(config, schedule)
    train_step, eval_step = train.make_steps(graphdef, tx, schedule, task.num_classes)
    rng = np.random.default_rng(0)
    batch = {"inputs": jnp.asarray(rng.integers(1, task.vocab_size, (2, 16)), jnp.int32),
             "mask": jnp.ones((2, 16), jnp.bool_),
             "targets": jnp.asarray([1, 2], jnp.int32), "weights": jnp.ones((2,))}

    def centroids(rest):
        leaves = [v for path, v in nnx.to_flat_state(rest) if path[-1] == "centroids"]
        assert len(leaves) == 1
        return np.asarray(leaves[0][...])

    state = {"step": jnp.int32(0), "params": params, "rest": rest,
             "opt_state": tx.init(params)}
    mu0 = centroids(rest)
    state, metrics = jax.jit(train_step)(state, batch)
    assert float(metrics["aux_loss"]) > 0
    mu1 = centroids(state["rest"])
    assert np.abs(mu1 - mu0).max() > 1e-3
    jax.jit(eval_step)({"params": state["params"], "rest": state["rest"]}, batch)
    np.testing.assert_array_equal(centroids(state["rest"]), mu1)
