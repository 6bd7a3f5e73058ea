"""Classifier-level fidelity: which input positions reach which outputs, for every variant
built the way the task configs build it (Classifier, CLS and MEAN pooling, the variant's
stack and block), against what the variant declares (`Capabilities.receptive_field`).

The mixer-level conformance suite cannot see a CLS slot that shears a 2-D raster, or a
stack that hides later segments from the pooled summary; these checks can. Dependence
is measured by perturbing one embedded input position at a time (one batch) and
comparing outputs bitwise: an output that never reads a position stays exactly equal.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import image, listops
from lra import train
import lra.tasks
from models import registry
from models.encoder import pool
from tests import tiers

LENGTH = 24  # 1-D content length: long enough that no pattern preset covers it
SIDE = 8  # 2-D variants: an 8 x 8 image
PAD = 3  # padded positions at the end (variants that take padding)
TWO_D = ("axial", "local_2d")


def _config(name: str, pooling: str, num_layers: int = 1):
    """The task config the user would run, shrunk: listops for 1-D variants, image for
    the 2-D ones (both CLS by default)."""
    two_d = name in TWO_D
    config = (image if two_d else listops).get_config(f"model={name},runlocal")
    config.max_length = SIDE * SIDE if two_d else LENGTH
    config.emb_dim = config.qkv_dim = 16
    config.num_heads, config.mlp_dim, config.num_layers = 2, 32, num_layers
    config.dropout_rate = config.attention_dropout_rate = 0.0
    config.pooling = pooling
    if config.block.stack == "segment_recurrent":  # three segments of 8
        config.block.segment_len = config.block.mem_len = 8
    if two_d:  # the presets' sizes are for 32 x 32; these keep their shape at 8 x 8
        config.model_hparams.update({"local_2d": dict(query_height=2, query_width=4,
                                                      flange_height=2, flange_width=2),
                                     "axial": {}}[name])
    return config


def _build(name: str, pooling: str, num_layers: int = 1):
    config = _config(name, pooling, num_layers)
    task = lra.tasks.get(config.task)
    return config, train.build_model(config, task)


def _dependence(model, length: int, pad: int):
    """(per_position [L', L'] bool: output i depends on input j, pooled [L'] bool: the
    logits depend on input j, real [L'] bool), L' including the CLS slot, for one
    example with `pad` padded positions at the end.

    By perturbation, not gradients: Transformer-XL's memory is a stop-gradient, yet its
    values reach the next segment. Example j of one batch has its embedded input j moved
    by a random vector; an output that never reads input j stays bitwise the same as
    example j of a second batch of unmoved copies. Compared at the same batch position:
    XLA's CPU kernels may take another path (another summation order) for some rows of a
    batch, e.g. the last, which moved outputs by 1e-7 where nothing was read.
    """
    graphdef, state = nnx.split(model)
    tokens = jnp.arange(1, length + 1, dtype=jnp.int32)[None] % 7 + 1
    mask = jnp.arange(length)[None] < length - pad
    x_1xLxD = model.encoder.embeddings(tokens, deterministic=True)
    if model.encoder.cls_token:
        mask = jnp.concatenate([jnp.ones((1, 1), bool), mask], axis=1)
    n, dim = x_1xLxD.shape[1:]
    # Example j moves position j; the reference batch holds n unmoved copies.
    delta_NxLxD = jnp.eye(n)[:, :, None] * jax.random.normal(jax.random.key(1), (n, 1, dim))
    x_NxLxD = x_1xLxD + delta_NxLxD
    same_NxLxD = jnp.broadcast_to(x_1xLxD, x_NxLxD.shape)
    mask_NxL = jnp.broadcast_to(mask, (n, n))

    @jax.jit
    def forward(state, x, m):
        model = nnx.merge(graphdef, state)
        h = model.encoder.stack(x, m, deterministic=True)
        return h, model.head(pool(model.encoder.norm(h), m, model.pooling))

    h_NxLxD, logits_NxC = forward(state, x_NxLxD, mask_NxL)
    h0_NxLxD, logits0_NxC = forward(state, same_NxLxD, mask_NxL)
    per_position = np.asarray(jnp.any(h_NxLxD != h0_NxLxD, axis=-1)).T  # [i, j]
    pooled = np.asarray(jnp.any(logits_NxC != logits0_NxC, axis=-1))
    return per_position, pooled, np.asarray(mask[0])


def _segment_field(length: int, segment_len: int, mem_len: int) -> np.ndarray:
    """One segment_recurrent layer: own segment, and mem_len positions before it."""
    seg = np.arange(length) // segment_len
    start = seg * segment_len
    j = np.arange(length)[None]
    return ((j >= start[:, None] - (mem_len or segment_len))
            & (j < (start + segment_len)[:, None]))


def _expected(name: str, model, length: int) -> np.ndarray | None:
    """What one layer of `name` declares: output i may depend on input j."""
    caps = registry.capabilities(name)
    field = caps.receptive_field
    block = model.encoder.block
    if block["stack"] == "segment_recurrent":
        return _segment_field(length, min(int(block["segment_len"]) or length, length),
                              int(block["mem_len"]))
    if field == "global":
        return np.ones((length, length), bool)
    if field == "pattern":
        blocks = model.encoder.stack.blocks
        allowed = np.asarray(blocks[0].mixer.pattern.dense(length, length))
        if allowed.ndim == 3:  # per head: a position reaches i through any head
            allowed = allowed.any(0)
        return allowed | np.eye(length, dtype=bool)  # the residual
    return None  # limited: chosen by the data or by windows; no per-position claim


def _image_field(name: str, hparams: dict) -> np.ndarray:
    """The 2-D variants' receptive field stated in image coordinates (row, column), with
    the CLS slot first and global, written independently of models.masks."""
    n = SIDE * SIDE
    r, c = np.divmod(np.arange(n), SIDE)
    ri, ci, rj, cj = r[:, None], c[:, None], r[None], c[None]
    if name == "axial":
        pixels = (ri == rj) | (ci == cj)
    else:  # local_2d: the query rectangle, flange rows above, flange columns each side
        qh, qw = hparams["query_height"], hparams["query_width"]
        fh, fw = hparams["flange_height"], hparams["flange_width"]
        r0, c0 = ri // qh * qh, ci // qw * qw
        pixels = (rj >= r0 - fh) & (rj < r0 + qh) & (cj >= c0 - fw) & (cj < c0 + qw + fw)
    field = np.ones((n + 1, n + 1), bool)
    field[1:, 1:] = pixels | np.eye(n, dtype=bool)
    return field


@functools.lru_cache(maxsize=None)
def _measured(name: str, pooling: str, num_layers: int = 1):
    config, model = _build(name, pooling, num_layers)
    length = config.max_length
    pad = PAD if registry.capabilities(name).padding and name not in TWO_D else 0
    return config, model, _dependence(model, length, pad)


def _cls_refused(name: str) -> bool:
    try:
        _build(name, "CLS")
    except ValueError as e:
        assert "pooling='MEAN'" in str(e)
        return True
    return False


SEGMENT_RECURRENT = ("transformer_xl", "gtrxl")


# CLS in the variant's tier (MEAN where the stack refuses CLS: the segment-recurrent ones,
# below); the other pooling exhaustive.
@pytest.mark.parametrize("name,pooling", tiers.cases(
    ["CLS", "MEAN"], lambda n: "MEAN" if n in SEGMENT_RECURRENT else "CLS"))
def test_positions_reach_what_the_variant_declares(name, pooling):
    if pooling == "CLS" and _cls_refused(name):
        pytest.skip("CLS refused for this stack (tested below)")
    config, model, (per_position, pooled, real) = _measured(name, pooling)
    prefix = int(model.encoder.cls_token)
    expected = _expected(name, model, len(real))
    real_rows = real[:, None] & real[None]
    # Padded positions never reach a real output.
    assert not (per_position & real[:, None] & ~real[None]).any(), "padding leaks"
    if expected is not None:
        got, want = per_position & real_rows, expected & real_rows
        diff = np.argwhere(got != want)
        assert not len(diff), (f"{name} ({pooling}): {len(diff)} (output, input) pairs "
                               f"differ from the declared receptive field, e.g. "
                               f"{diff[:5].tolist()} (got {got[tuple(diff[0])]})")
    if name in TWO_D and prefix:
        want = _image_field(name, dict(config.model_hparams))
        got = per_position[:want.shape[0], :want.shape[1]]
        assert (got == want).all(), (f"{name}: the 2-D field is not the image's rows and "
                                     f"columns ({int((got != want).sum())} pairs differ)")
    # The pooled logits see every real position (a limited field's CLS summary sees
    # what the method routes to position 0; MEAN pools every position).
    if registry.capabilities(name).receptive_field == "limited" and pooling == "CLS":
        return
    assert pooled[real].all(), (f"{name} ({pooling}): the logits do not depend on real "
                                f"positions {np.flatnonzero(real & ~pooled).tolist()}")


@pytest.mark.parametrize("name", SEGMENT_RECURRENT)
def test_segment_recurrent_cls_is_refused_and_mean_sees_every_segment(name):
    assert _cls_refused(name)
    # As the task configs build it: MEAN pooling, 2 layers, several segments.
    assert listops.get_config(f"model={name}").pooling == "MEAN"
    config, model, (_, pooled, real) = _measured(name, "MEAN", num_layers=2)
    assert int(model.encoder.block["segment_len"]) < config.max_length
    assert pooled[real].all()


def test_a_sheared_raster_would_be_caught():
    """The check is not vacuous: axial over the CLS-inclusive sequence (the old geometry,
    width = ceil(sqrt(L + 1))) differs from the image's rows and columns."""
    from models import masks

    n = SIDE * SIDE
    old = masks.axial(SIDE + 1, 0) | masks.axial(SIDE + 1, 1)
    sheared = np.asarray(old.dense(n + 1, n + 1)) | np.eye(n + 1, dtype=bool)
    assert (sheared != _image_field("axial", {})).any()
