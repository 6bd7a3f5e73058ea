"""Positions of the gated linear family as fla runs them (issue 41, section 3).

fla-org/flash-linear-attention at bc3b101dcb713ddc5bd8924b66754eb68b5ccf89: its models
(fla/models/<name>/modeling_<name>.py) add no position table to the token embeddings;
fla/layers/multiscale_retention.py always rotates q and k
(`self.rotary = RotaryEmbedding(dim=self.head_k_dim)`, then `q, k = self.rotary(q, k, ...)`);
fla/layers/gla.py, delta_net.py, gated_deltanet.py and mamba2.py have no rotary. So the
task configs give retnet pos_emb='rotary' and gla, deltanet, gated_deltanet, mamba2 'none'
(Capabilities.pos_emb).

Parameter trees change with it: the learned table ((max_length + 1) x emb_dim with CLS
pooling, max_length x emb_dim without) is gone from these five models' configs, so their
checkpoints from before do not restore into the new default (`--config.pos_emb=learned`
builds the old tree); the param counts below are pinned for that reason.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.tasks
from configs import listops
from lra.train import build_model
from models import registry
from models.attention.retention import MultiScaleRetention
from models.encoder import pool
from tests.models.helpers import apply

# What fla's layers and models use (module docstring): the configs' default per variant.
FLA_POSITIONS = {"retnet": "rotary", "gla": "none", "deltanet": "none",
                 "gated_deltanet": "none", "mamba2": "none"}
ARGS = ("", ",mini", ",mini,pretrain,causal")


def config_model(arg: str, **overrides):
    c = listops.get_config(arg)
    for key, value in overrides.items():
        c[key] = value
    return c, build_model(c, lra.tasks.get("listops"))


def num_params(model: nnx.Module) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("name", sorted(FLA_POSITIONS))
def test_task_configs_give_fla_positions(name):
    for arg in ARGS:
        assert listops.get_config(f"model={name}{arg}").pos_emb == FLA_POSITIONS[name], arg
    assert registry.capabilities(name).pos_emb == FLA_POSITIONS[name]
    for name in ("transformer", "linear"):  # unchanged: LRA's absolute positions
        assert listops.get_config(f"model={name},mini").pos_emb == "learned"


def test_every_rotary_default_can_rotate():
    """A variant whose configs default to pos_emb='rotary' must take the rotation, or
    its default config would fail to build (build() refuses rotary elsewhere)."""
    for name in registry.available():
        if registry.capabilities(name).pos_emb == "rotary":
            assert registry.capabilities(name).rotary, name


def test_retnet_config_builds_rotating_retention_without_a_table():
    c, model = config_model("model=retnet,mini")
    assert c.pos_emb == "rotary" and model.encoder.embeddings.position is None
    retentions = [m for _, m in model.iter_modules() if isinstance(m, MultiScaleRetention)]
    assert len(retentions) == c.num_layers and all(m.rotary for m in retentions)
    # The parameter tree loses the learned table, (64 + 1 CLS) x 64, and nothing else.
    _, learned = config_model("model=retnet,mini", pos_emb="learned")
    assert learned.encoder.embeddings.position is not None
    assert num_params(learned) - num_params(model) == (c.max_length + 1) * c.emb_dim
    assert (num_params(model), num_params(learned)) == (110_090, 114_250)
    # The rotation acts: the same weights without it encode differently.
    inputs = jnp.asarray(np.random.default_rng(0).integers(1, 16, (2, c.max_length)))
    mask = jnp.ones(inputs.shape, bool)
    encoded, _ = apply(model.encoder, inputs, mask)
    twin = nnx.clone(model)
    for _, m in twin.iter_modules():
        if isinstance(m, MultiScaleRetention):
            m.rotary = False
    plain, _ = apply(twin.encoder, inputs, mask)
    assert not np.allclose(np.asarray(encoded), np.asarray(plain), rtol=1e-4, atol=1e-4)


def test_retnet_causal_lm_config_rotates():
    c, model = config_model("model=retnet,mini,pretrain,causal")
    assert c.pos_emb == "rotary" and model.encoder.embeddings.position is None
    assert all(m.rotary for _, m in model.iter_modules() if isinstance(m, MultiScaleRetention))
    assert num_params(model) == 101_456  # 105,552 with the 64 x 64 table (the old row)


@pytest.mark.parametrize("name", ["gla", "deltanet", "gated_deltanet", "mamba2"])
def test_no_position_variants_build_without_positions(name):
    c, model = config_model(f"model={name},mini")
    assert c.pos_emb == "none" and model.encoder.embeddings.position is None
    assert not any(getattr(m, "rotary", False) is True for _, m in model.iter_modules())
    _, learned = config_model(f"model={name},mini", pos_emb="learned")
    assert num_params(learned) - num_params(model) == (c.max_length + 1) * c.emb_dim
    # The same token embeds to the same vector wherever it stands.
    x = model.encoder.embeddings(jnp.ones((1, 5), jnp.int32), deterministic=True)
    assert bool((x[:, 1:] == x[:, 1:2]).all())


@pytest.mark.parametrize("name", ["retnet", "gated_deltanet", "mamba2"])
def test_the_cls_vector_trains_without_an_added_position(name):
    """With CLS pooling and no absolute position, the CLS slot's input starts at zero and
    the output gates (SiLU(W_g 0) = 0) give it no update at initialisation; the loss's
    gradient still reaches the CLS vector, so it leaves zero at the first step."""
    c, model = config_model(f"model={name},mini")
    assert c.pooling == "CLS"
    inputs = jnp.asarray(np.random.default_rng(1).integers(1, 16, (4, c.max_length)))
    labels = jnp.arange(4) % 10

    def loss(model):
        encoded, real = model.encoder(inputs, jnp.ones(inputs.shape, bool),
                                      deterministic=True)
        logits = model.head(pool(encoded, real, model.pooling))
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(4), labels])

    grads = nnx.grad(loss)(model)
    g = np.asarray(grads.encoder.embeddings.cls[...])
    assert np.isfinite(g).all() and np.abs(g).max() > 0
