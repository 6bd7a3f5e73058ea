"""Block kinds and stacks: the GTrXL gated block and the universal (ACT) stack."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import stacks
from models.blocks import GatedBlock, GruGate
from models.stacks import resolve_block
from models.encoder import Encoder, sinusoidal_positions
from tests.models.helpers import normal

DIM, HEADS, BATCH, LEN, MLP = 16, 2, 2, 8, 32
TOL = dict(rtol=1e-5, atol=1e-5)


def gated_block(model: str = "transformer", gate_bias: float = 2.0, seed: int = 0):
    return GatedBlock(dim=DIM, num_heads=HEADS, mlp_dim=MLP, max_len=LEN, model=model,
                      block=resolve_block(model, {"kind": "gated", "gate_bias": gate_bias}),
                      dropout_rate=0.0, rngs=nnx.Rngs(params=seed, dropout=1))


def test_gru_gate_matches_formula():
    gate = GruGate(DIM, gate_bias=2.0, rngs=nnx.Rngs(0))
    x, y = normal(0, (BATCH, LEN, DIM)), normal(1, (BATCH, LEN, DIM))
    w = np.asarray(gate.w_rzg.kernel[...], np.float64)
    u = np.asarray(gate.u_rz.kernel[...], np.float64)
    u_g = np.asarray(gate.u_g.kernel[...], np.float64)
    w_r, w_z, w_g = w[:, :DIM], w[:, DIM:2 * DIM], w[:, 2 * DIM:]
    u_r, u_z = u[:, :DIM], u[:, DIM:]
    xd, yd = np.asarray(x, np.float64), np.asarray(y, np.float64)

    def sigmoid(a):
        return 1 / (1 + np.exp(-a))

    r = sigmoid(yd @ w_r + xd @ u_r)
    z = sigmoid(yd @ w_z + xd @ u_z - 2.0)
    h = np.tanh(yd @ w_g + (r * xd) @ u_g)
    np.testing.assert_allclose(np.asarray(gate(x, y)), (1 - z) * xd + z * h, **TOL)


def relative_deviation(block, x) -> float:
    y = block(x, None, deterministic=True)
    return float(jnp.max(jnp.abs(y - x)) / jnp.max(jnp.abs(x)))


def test_gated_block_starts_near_identity():
    x = normal(2, (BATCH, LEN, DIM))
    deviations = {b: relative_deviation(gated_block(gate_bias=b), x) for b in (0.0, 2.0, 8.0)}
    print("max |block(x) - x| / max |x| at init, by gate_bias:", deviations)
    # b_g > 0 pulls both gates towards passing x through, monotonically.
    assert deviations[8.0] < 0.01 < deviations[2.0] < 0.6
    assert deviations[2.0] < deviations[0.0]


@pytest.mark.parametrize("model", ["local", "linear"])
def test_gated_kind_wraps_any_mixer(model):
    encoder = Encoder(vocab_size=11, max_len=LEN, model=model, emb_dim=DIM, num_heads=HEADS,
                      num_layers=1, mlp_dim=MLP, block={"kind": "gated"},
                      rngs=nnx.Rngs(params=0, dropout=1))
    assert isinstance(encoder.stack.blocks[0], GatedBlock)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 11, (BATCH, LEN)))
    mask = jnp.arange(LEN)[None] < jnp.array([[LEN], [5]])
    y, _ = encoder(tokens, mask, deterministic=True)
    changed = jnp.where(mask, tokens, 3)
    y_changed, _ = encoder(changed, mask, deterministic=True)
    real = np.asarray(mask)
    assert np.isfinite(np.asarray(y)).all()
    np.testing.assert_allclose(np.asarray(y)[real], np.asarray(y_changed)[real], **TOL)


def universal_stack(model: str = "transformer", **block) -> nnx.Module:
    settings = resolve_block(model, {"stack": "universal", **block})
    return stacks.UniversalStack(num_layers=2, dim=DIM, num_heads=HEADS, mlp_dim=MLP,
                                 max_len=LEN, model=model, model_hparams={}, causal=False,
                                 dropout_rate=0.0, block=settings,
                                 rngs=nnx.Rngs(params=0, dropout=1))


def set_halting(stack, bias: float, kernel_scale: float = 0.0, seed: int = 0) -> None:
    kernel = stack.halting.kernel
    kernel[...] = kernel_scale * normal(seed, kernel.shape)
    stack.halting.bias[...] = jnp.full(stack.halting.bias.shape, bias)


@pytest.mark.parametrize("max_steps", [3, 6])
def test_act_with_constant_halting_probability(max_steps):
    """p = 0.3 at every step: weights 0.3, 0.3, 0.3 then the remainder 0.1 (N = 4,
    R = 0.1), or with T = 3 a forced halt at step 3 with R = 0.4."""
    stack = universal_stack(act_max_steps=max_steps, ponder_weight=0.5)
    set_halting(stack, float(np.log(0.3 / 0.7)))
    x = normal(3, (BATCH, LEN, DIM))
    y, weights, steps, remainders = stack.act(x, None, deterministic=True)
    expected = [0.3, 0.3, 0.4] if max_steps == 3 else [0.3, 0.3, 0.3, 0.1, 0.0, 0.0]
    np.testing.assert_allclose(np.asarray(weights)[:, 0, 0], expected, atol=1e-6)
    np.testing.assert_allclose(np.asarray(steps), min(max_steps, 4))
    np.testing.assert_allclose(np.asarray(remainders), 0.4 if max_steps == 3 else 0.1,
                               atol=1e-6)
    # Every position halts together, so the output is the weighted sum of the shared
    # block applied to the state plus the position and timestep signals.
    state, ref = x, 0.0
    signals = sinusoidal_positions(LEN, DIM)[None]
    for t, w in enumerate(expected):
        state = stack.layer(state + signals + sinusoidal_positions(max_steps, DIM)[t], None,
                            deterministic=True)
        ref = ref + w * state
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), **TOL)

    stack(x, None, deterministic=True)
    (aux,) = jax.tree.leaves(nnx.pop(stack, nnx.Intermediate))
    np.testing.assert_allclose(float(aux), 0.5 * (min(max_steps, 4) + float(remainders[0, 0])),
                               rtol=1e-5)


def act_reference(stack, x, max_steps: int, threshold: float = 0.99) -> np.ndarray:
    """Graves' ACT written per position in numpy around the stack's own block and halting
    unit; a halted position's state is copied to later steps (Dehghani et al. 2.2)."""
    kernel = np.asarray(stack.halting.kernel[...], np.float64)[:, 0]
    bias = float(stack.halting.bias[...][0])
    state, out = x, np.zeros(x.shape)
    cumulative, halted = np.zeros(x.shape[:2]), np.zeros(x.shape[:2], bool)
    for t in range(max_steps):
        inp = state + sinusoidal_positions(LEN, DIM)[None] + sinusoidal_positions(
            max_steps, DIM)[t]
        p = 1 / (1 + np.exp(-(np.asarray(inp, np.float64) @ kernel + bias)))
        new = stack.layer(inp, None, deterministic=True)
        weight, halts = np.zeros(x.shape[:2]), np.zeros(x.shape[:2], bool)
        for b in range(x.shape[0]):
            for i in range(x.shape[1]):
                if halted[b, i]:
                    continue
                if t == max_steps - 1 or cumulative[b, i] + p[b, i] > threshold:
                    weight[b, i], halts[b, i] = 1 - cumulative[b, i], True
                else:
                    weight[b, i] = p[b, i]
                    cumulative[b, i] += p[b, i]
        out += weight[..., None] * np.asarray(new, np.float64)
        state = jnp.where(jnp.asarray(halted)[..., None], state, new)
        halted |= halts
    return out


def test_act_weights_sum_to_one_and_steps_are_bounded():
    stack = universal_stack(act_max_steps=4)
    # A halting unit that varies by position and step: some halt early, some never.
    set_halting(stack, -0.5, kernel_scale=1.0)
    x = normal(4, (BATCH, LEN, DIM))
    y, weights, steps, remainders = stack.act(x, None, deterministic=True)
    np.testing.assert_allclose(np.asarray(y), act_reference(stack, x, 4), **TOL)
    weights, steps = np.asarray(weights), np.asarray(steps)
    np.testing.assert_allclose(weights.sum(0), 1.0, atol=1e-6)
    assert (weights >= 0).all()
    assert (steps >= 1).all() and (steps <= 4).all()
    assert len(np.unique(steps)) > 1, "test should mix early and late halting"
    # Weights after a position's halting step are exactly zero.
    after = np.arange(4)[:, None, None] >= steps[None]
    assert (weights[after] == 0).all()
    assert ((0 < np.asarray(remainders)) & (np.asarray(remainders) <= 1)).all()


def test_universal_stack_wraps_any_mixer_and_masks_padding():
    encoder = Encoder(vocab_size=11, max_len=LEN, model="local", emb_dim=DIM,
                      num_heads=HEADS, num_layers=2, mlp_dim=MLP,
                      block={"stack": "universal", "kind": "gated"},
                      rngs=nnx.Rngs(params=0, dropout=1))
    tokens = jnp.asarray(np.random.default_rng(1).integers(1, 11, (BATCH, LEN)))
    mask = jnp.arange(LEN)[None] < jnp.array([[LEN], [5]])
    y, _ = encoder(tokens, mask, deterministic=True)
    aux = jax.tree.leaves(nnx.pop(encoder, nnx.Intermediate))
    y_changed, _ = encoder(jnp.where(mask, tokens, 7), mask, deterministic=True)
    aux_changed = jax.tree.leaves(nnx.pop(encoder, nnx.Intermediate))
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(y)[real], np.asarray(y_changed)[real], **TOL)
    # The ponder cost counts real positions only.
    np.testing.assert_allclose(np.asarray(aux), np.asarray(aux_changed), **TOL)


def _ln(x, norm):
    """LayerNorm in float64 numpy with the module's scale and bias (eps as flax's)."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + norm.epsilon) * np.asarray(norm.scale[...], np.float64)
            + np.asarray(norm.bias[...], np.float64))


def _block(kind: str, ffn: bool, model: str = "local"):
    from models.blocks import BLOCK_KINDS

    return BLOCK_KINDS[kind](dim=DIM, num_heads=HEADS, mlp_dim=MLP, max_len=LEN, model=model,
                             block=resolve_block(model, {"kind": kind, "ffn": ffn}),
                             dropout_rate=0.0, rngs=nnx.Rngs(params=0, dropout=1))


@pytest.mark.parametrize("ffn", [True, False])
def test_post_ln_block_normalises_after_each_sum(ffn):
    """post_ln: h = LN1(x + mixer(x)), out = LN2(h + MLP(h)) (S4's prenorm=false);
    without the feed-forward branch, out = h."""
    block = _block("post_ln", ffn)
    x = normal(3, (BATCH, LEN, DIM))
    y = np.asarray(block.mixer(x, padding_mask=None), np.float64)
    h = _ln(np.asarray(x, np.float64) + y, block.mixer_norm)
    if ffn:
        mlp = np.asarray(block.mlp(jnp.asarray(h, jnp.float32), deterministic=True), np.float64)
        h = _ln(h + mlp, block.mlp_norm)
    np.testing.assert_allclose(np.asarray(block(x, None, deterministic=True)), h, **TOL)


@pytest.mark.parametrize("kind", ["pre_ln", "gated"])
def test_a_block_without_feed_forward_is_its_mixer_branch(kind):
    """block.ffn=False (S4's and S5's layers): no MLP parameters, and the pre-LN layer is
    x + mixer(LN(x)) (the gated one: its first gate only)."""
    block = _block(kind, ffn=False)
    names = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(block, nnx.Param))}
    # No feed-forward parameters, its norm included (an unused norm would be decayed).
    assert not any(n.startswith(("mlp/", "mlp_gate/", "mlp_norm/")) for n in names), names
    x = normal(4, (BATCH, LEN, DIM))
    branch = block.mixer(block.mixer_norm(x), padding_mask=None)
    expected = x + branch if kind == "pre_ln" else block.mixer_gate(x, jax.nn.relu(branch))
    np.testing.assert_allclose(np.asarray(block(x, None, deterministic=True)),
                               np.asarray(expected), **TOL)
    with_ffn = _block(kind, ffn=True)
    assert len(nnx.to_flat_state(nnx.state(with_ffn, nnx.Param))) > len(names)


@pytest.mark.parametrize("kind, ffn", [("post_ln", True), ("pre_ln", False),
                                       ("post_ln", False)])
def test_other_residual_forms_decode_through_the_config(kind, ffn):
    """prefill + steps equal the parallel causal forward for the new residual forms
    (through configs/listops.py, as tests/models/test_decoding.py)."""
    import lra.tasks
    from lra import train
    from tests.models.helpers import randomize_params
    from tests.models.test_decoding import check_equal, config_for

    config = config_for("lru")
    config.block.kind, config.block.ffn = kind, ffn
    model = randomize_params(train.build_model(config, lra.tasks.get("listops")), seed=5,
                             scale=0.3)
    check_equal(model, lra.tasks.get("listops").vocab_size)


def test_the_reversible_stack_refuses_post_ln():
    with pytest.raises(ValueError, match="needs block kind 'pre_ln'"):
        stacks.ReversibleStack(num_layers=1, block=resolve_block("local", {
            "kind": "post_ln", "stack": "reversible"}), rngs=nnx.Rngs(0), dim=DIM,
            num_heads=HEADS, mlp_dim=MLP, max_len=LEN, model="local")


# ------------------------------------------------------------ Mega's pre-norm layer


def _mega_update_gate(mixer, xh_BxLxD):
    """u of Mega's layer on input xh (the mixer's own gate, from its EMA output)."""
    return mixer._gates(mixer.ema(xh_BxLxD, None), True)[0]


def _mega_prenorm_expected(block, x_BxLxD):
    """Mega's prenorm layer from the mixer's default form (compared with Mega's own
    layer in results/cpu/mega_vs_original.md): that form returns y0 = u (h - xh) on
    xh = LN(x), so h = y0 / u + xh and Mega's x + u (h - x) = x + y0 + u (xh - x); then
    the normalised FFN, z + MLP(LN(z))."""
    xh = block.mixer_norm(x_BxLxD)
    y0 = np.asarray(block.mixer(xh, padding_mask=None), np.float64)
    u = np.asarray(_mega_update_gate(block.mixer, xh), np.float64)
    x, xh = np.asarray(x_BxLxD, np.float64), np.asarray(xh, np.float64)
    z = x + y0 + u * (xh - x)
    if block.mlp is not None:
        z32 = jnp.asarray(z, jnp.float32)
        z = z + np.asarray(block.mlp(block.mlp_norm(z32), deterministic=True), np.float64)
    return z


@pytest.mark.parametrize("ffn", [True, False])
def test_mega_pre_ln_is_megas_prenorm_layer(ffn):
    """mega_pre_ln: x + u (h - x) with u, h from LN(x) (Mega's addcmul(residual, u,
    h - residual)), not pre_ln's x + u (h - LN(x))."""
    block = _block("mega_pre_ln", ffn, model="mega")
    from tests.models.helpers import randomize_params
    randomize_params(block, seed=7, scale=0.3)
    x = 3.0 * normal(5, (BATCH, LEN, DIM)) + 1.0  # far from its normalisation
    expected = _mega_prenorm_expected(block, x)
    got = np.asarray(block(x, None, deterministic=True), np.float64)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)
    # The residual the mixer is given is the raw stream: the pre_ln block (same weights)
    # differs from it by u (LN(x) - x), which is not small here.
    pre_ln = _block("pre_ln", ffn, model="mega")
    nnx.update(pre_ln, nnx.state(block, nnx.Param))
    assert np.abs(np.asarray(pre_ln(x, None, deterministic=True)) - got).max() > 0.1


def test_mega_pre_ln_is_what_megas_image_recipes_build():
    """Through configs/image.py, pathfinder.py, pathx.py with model=mega,paper (Mega's
    --encoder-normalize-before): every layer is the mega_pre_ln block, and the first one
    of the image model computes Mega's prenorm layer; the text tasks' post_ln is kept."""
    import importlib

    import lra.tasks
    from lra import train
    from tests.models.helpers import randomize_params

    from models.blocks import MegaPreLNBlock, PostLNBlock
    for task, kind in (("image", MegaPreLNBlock), ("pathfinder", MegaPreLNBlock),
                       ("pathx", MegaPreLNBlock), ("listops", PostLNBlock)):
        config = importlib.import_module(f"configs.{task}").get_config("model=mega,paper")
        model = nnx.eval_shape(lambda: train.build_model(config, lra.tasks.get(task)))
        assert all(type(b) is kind for b in model.encoder.stack.blocks), task
    config = importlib.import_module("configs.image").get_config("model=mega,paper")
    model = train.build_model(config, lra.tasks.get("image"))
    block = randomize_params(model.encoder.stack.blocks[0], seed=3, scale=0.3)
    x = 2.0 * normal(6, (BATCH, 24, config.emb_dim)) + 0.5
    expected = _mega_prenorm_expected(block, x)
    np.testing.assert_allclose(np.asarray(block(x, None, deterministic=True), np.float64),
                               expected, rtol=5e-5, atol=5e-5)


def test_mega_pre_ln_refuses_other_mixers_in_one_line():
    with pytest.raises(ValueError, match="mega_pre_ln.*takes_residual: mega.*'local'"):
        resolve_block("local", {"kind": "mega_pre_ln"})
    from models.blocks import MegaPreLNBlock
    with pytest.raises(ValueError, match="'transformer' is not one"):
        MegaPreLNBlock(dim=DIM, num_heads=HEADS, mlp_dim=MLP, max_len=LEN,
                       model="transformer", block=resolve_block("transformer"),
                       rngs=nnx.Rngs(0))


def test_mega_pre_ln_decodes_through_the_config():
    """prefill + steps (the residual passed to the mixer's step and prefill) equal the
    parallel causal forward, through configs/listops.py."""
    import lra.tasks
    from lra import train
    from tests.models.helpers import randomize_params
    from tests.models.test_decoding import check_equal, config_for

    config = config_for("mega")
    config.block.kind = "mega_pre_ln"
    model = randomize_params(train.build_model(config, lra.tasks.get("listops")), seed=5,
                             scale=0.3)
    check_equal(model, lra.tasks.get("listops").vocab_size)
