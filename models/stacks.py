"""How an encoder applies its layers: `block["stack"]` picks one of `STACKS`.

Every stack is built as

    stack(num_layers=, dim=, num_heads=, mlp_dim=, max_len=, model=, model_hparams=,
          causal=, dropout_rate=, prefix_len=, rotary=, block=resolved_block_dict, rngs=)

(`resolve_block(model, overrides)` gives the block dict). `prefix_len` positions come
before the content (the CLS slot); the blocks pass it to the mixers, and `rotary`
(pos_emb='rotary': queries and keys rotated by position) too.

Hybrid stacks (issue 45): a stack is a list of layers, each a registered mixer with its
own hparams and block. `layers=None` is `num_layers` copies of (model, model_hparams,
block): the single-mixer model, built exactly as before (same parameter tree, same
random draws). Otherwise `layers` is one dict per layer, `{"model": name,
"model_hparams": {...}, "block": resolved_block_dict}` (`resolve_layer_block` gives the
block: the model's with the layer's own per-layer keys, `BLOCK_LAYER_KEYS`, over it); the
stack-level keys (`stack`, segment and ACT settings) are the model's. Layer i is built in
place i with the same random stream, so caches, parameter groups, precision marks and
kernels are per layer by construction. The sequential, reversible and segment_recurrent
stacks take a layer list; the universal stack (one shared block) refuses one.

and called as `stack(x_BxLxD, padding_mask_BxL, deterministic=...) -> x_BxLxD`.

Decoding (DESIGN.md 10, models.decoding): a causal stack also has
`init_cache(batch, max_len)`, `prefill(cache, x_BxLxD, mask) -> (y_BxLxD, cache)` (a
right-padded prompt, one parallel call) and `step(cache, x_BxD) -> (y_BxD, cache)`, equal
to the parallel stack at every position; dropout is off.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import decoding, layers, registry
from models.blocks import BLOCK_DEFAULTS, BLOCK_KINDS, EncoderBlock, mega_pre_ln_refusal


def layer_args(block_args: Mapping[str, Any], layer: int) -> dict[str, Any]:
    """block_args for layer `layer`: a mixer whose pattern is drawn from a `seed` (random
    keys: `random`, `bigbird`) gets seed + layer, so each layer has its own fixed pattern,
    as in BigBird; with one seed for all, every layer would draw the same keys."""
    model = block_args.get("model", "transformer")
    accepted = registry.accepted_hparams(model)
    if "seed" not in accepted:
        return dict(block_args)
    hparams = dict(block_args.get("model_hparams") or {})
    hparams["seed"] = int(hparams.get("seed", accepted["seed"])) + layer
    return {**block_args, "model_hparams": hparams}


# Block settings a layer of a hybrid stack may set for itself; the others (the stack and
# its segment / ACT settings) belong to the whole stack, i.e. to the model.
BLOCK_LAYER_KEYS = ("kind", "ffn", "ffn_chunks", "gate_bias", "short_conv")


def per_layer(num_layers: int, block: Mapping[str, Any], block_args: Mapping[str, Any],
              layers: Sequence[Mapping[str, Any]] | None
              ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(resolved block, block_args) of every layer (module docstring): `layers=None` is
    the model's mixer, hparams and block in every layer, exactly as before hybrids."""
    if layers is None:
        return [(dict(block), layer_args(block_args, l)) for l in range(num_layers)]
    if len(layers) != num_layers:
        raise ValueError(f"the layer list has {len(layers)} layers, num_layers is "
                         f"{num_layers}")
    # A layer's own positions and heads (configs/hybrid.py LAYER_FIELDS): `rotary` on
    # top of the stack's, `num_heads` instead of the model's.
    return [(dict(spec["block"]),
             layer_args({**block_args, "model": spec["model"],
                         "model_hparams": dict(spec.get("model_hparams") or {}),
                         **({"rotary": True} if spec.get("rotary") else {}),
                         **({"num_heads": int(spec["num_heads"])} if spec.get("num_heads")
                            else {})}, l))
            for l, spec in enumerate(layers)]


class SequentialStack(nnx.Module):
    """num_layers blocks of `block["kind"]` (or each layer's own, see `layers`), applied
    in order, each with its own weights."""

    def __init__(self, *, num_layers: int, block: Mapping[str, Any], rngs: nnx.Rngs,
                 layers: Sequence[Mapping[str, Any]] | None = None, **block_args: Any):
        self.blocks = nnx.List([BLOCK_KINDS[b["kind"]](block=b, rngs=rngs, **args)
                                for b, args in per_layer(num_layers, block, block_args,
                                                         layers)])

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array, *,
                 deterministic: bool) -> jax.Array:
        carry = None  # a state-carrying mixer (Luna) starts from its own initial state
        for layer in self.blocks:
            if layer.carries_state:
                x_BxLxD, carry = layer(x_BxLxD, padding_mask, deterministic=deterministic,
                                       carry=carry)
            else:
                x_BxLxD = layer(x_BxLxD, padding_mask, deterministic=deterministic)
            x_BxLxD = layers.constrain(x_BxLxD, ("batch", None, None))
        return x_BxLxD

    def init_cache(self, batch: int, max_len: int) -> list[decoding.Cache]:
        return [layer.init_cache(batch, max_len) for layer in self.blocks]

    def prefill(self, cache: list[decoding.Cache], x_BxLxD: jax.Array,
                padding_mask: jax.Array | None) -> tuple[jax.Array, list[decoding.Cache]]:
        new = []
        for layer, layer_cache in zip(self.blocks, cache):
            x_BxLxD, layer_cache = layer.prefill(layer_cache, x_BxLxD, padding_mask)
            new.append(layer_cache)
        return x_BxLxD, new

    def step(self, cache: list[decoding.Cache], x_BxD: jax.Array
             ) -> tuple[jax.Array, list[decoding.Cache]]:
        new = []
        for layer, layer_cache in zip(self.blocks, cache):
            x_BxD, layer_cache = layer.step(layer_cache, x_BxD)
            new.append(layer_cache)
        return x_BxD, new


def _zero_cotangent(x: jax.Array) -> Any:
    """The cotangent of an input that gets none: float0 for ints, bools and RNG keys."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


class ReversibleStack(nnx.Module):
    """RevNet residuals (Gomez et al. 2017, as in Reformer): activations recomputed
    in the backward pass, so activation memory does not grow with depth.

    The input is duplicated, x1 = x2 = x, and each pre_ln block maps

        y1 = x1 + F(x2),  F = Dropout(mixer(LN(.)))   (EncoderBlock.mix)
        y2 = x2 + G(y1),  G = MLP(LN(.))              (EncoderBlock.feed_forward)

    and the stack returns (y1 + y2) / 2 (Reformer concatenates the halves and
    projects; the mean keeps the width and the encoder unchanged). A `jax.custom_vjp`
    over the whole stack keeps only the last (y1, y2) from the forward pass; the
    backward pass inverts one layer at a time, x2 = y2 - G(y1), x1 = y1 - F(x2),
    and takes `jax.vjp` of F and G there. The blocks' RNG states (dropout, hashing)
    go into the pure functions explicitly, so the recomputation draws the same
    masks as the forward pass; the advanced states are written back afterwards.

    Mixers that carry state between layers (Luna) or sow an aux_loss, and block
    kinds other than pre_ln, are refused with a ValueError. With attention dropout
    on, XLA (CPU) still holds about two L x L buffers per layer; a forward pass of
    the sequential stack alone shows the same growth, so it is not the recomputation.
    """

    def __init__(self, *, num_layers: int, block: Mapping[str, Any], rngs: nnx.Rngs,
                 layers: Sequence[Mapping[str, Any]] | None = None, **block_args: Any):
        self.model = block_args.get("model", "transformer")
        built = per_layer(num_layers, block, block_args, layers)
        for b, args in built:
            model = args.get("model", self.model)
            if b["kind"] != "pre_ln":
                raise ValueError(f"the reversible stack needs block kind 'pre_ln' (its "
                                 f"residual branches are F and G), got {b['kind']!r}")
            if registry.capabilities(model).carries_state:
                raise ValueError(f"model {model!r} carries state between layers, which the "
                                 "reversible stack does not support; use stack 'sequential'")
        self.blocks = nnx.List([EncoderBlock(block=b, rngs=rngs, **args) for b, args in built])

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None, *,
                 deterministic: bool) -> jax.Array:
        splits = [nnx.split(layer, nnx.Param, ...) for layer in self.blocks]
        graphdefs = [g for g, _, _ in splits]
        model = self.model

        def branch(i: int, which: str, params: Any, rest: Any, x_BxLxD: jax.Array,
                   mask: jax.Array | None) -> tuple[jax.Array, Any]:
            # Fresh Variables: the RNG counters are advanced here, maybe inside jax.vjp.
            layer = nnx.merge(graphdefs[i], params, rest, copy=True)
            if which == "F":
                out_BxLxD = layer.mix(x_BxLxD, mask, deterministic=deterministic)
            else:
                out_BxLxD = layer.feed_forward(x_BxLxD, deterministic=deterministic)
            if jax.tree.leaves(nnx.state(layer, nnx.Intermediate)):
                raise ValueError(f"model {model!r} sows an aux_loss, which the reversible "
                                 "stack does not support; use stack 'sequential'")
            return out_BxLxD, nnx.state(layer, nnx.Not(nnx.Param))

        def forward(params, rests, x_BxLxD, mask):
            x1_BxLxD = x2_BxLxD = x_BxLxD
            mids, outs = [], []
            for i, (p, r) in enumerate(zip(params, rests)):
                f_BxLxD, mid = branch(i, "F", p, r, x2_BxLxD, mask)
                y1_BxLxD = x1_BxLxD + f_BxLxD
                g_BxLxD, out = branch(i, "G", p, mid, y1_BxLxD, mask)
                x1_BxLxD, x2_BxLxD = y1_BxLxD, x2_BxLxD + g_BxLxD
                mids.append(mid)
                outs.append(out)
            return x1_BxLxD, x2_BxLxD, mids, outs

        @jax.custom_vjp
        def run(params, rests, x_BxLxD, mask):
            y1_BxLxD, y2_BxLxD, _, outs = forward(params, rests, x_BxLxD, mask)
            return (y1_BxLxD + y2_BxLxD) / 2, outs

        def run_fwd(params, rests, x_BxLxD, mask):
            y1_BxLxD, y2_BxLxD, mids, outs = forward(params, rests, x_BxLxD, mask)
            # Residuals: the last activations and the (small) RNG states, nothing per layer.
            return ((y1_BxLxD + y2_BxLxD) / 2, outs), (params, rests, mids, y1_BxLxD,
                                                       y2_BxLxD, mask)

        def run_bwd(residuals, cotangents):
            params, rests, mids, y1_BxLxD, y2_BxLxD, mask = residuals
            dy_BxLxD, _ = cotangents  # RNG states get no cotangent
            dy1_BxLxD = dy2_BxLxD = dy_BxLxD / 2
            dparams = [None] * len(params)
            for i in reversed(range(len(params))):
                # The barrier ties this layer's recomputation (its RNG states included)
                # to the cotangents of the layer above, so that XLA cannot schedule it
                # early and hold every layer's activations at once again.
                y1_BxLxD, y2_BxLxD, dy1_BxLxD, dy2_BxLxD, rest, mid = (
                    jax.lax.optimization_barrier(
                        (y1_BxLxD, y2_BxLxD, dy1_BxLxD, dy2_BxLxD, rests[i], mids[i])))
                g_BxLxD, g_vjp = jax.vjp(
                    lambda p, h: branch(i, "G", p, mid, h, mask)[0], params[i], y1_BxLxD)
                x2_BxLxD = y2_BxLxD - g_BxLxD
                dp_g, dy1_from_g = g_vjp(dy2_BxLxD)
                dy1_BxLxD = dy1_BxLxD + dy1_from_g
                f_BxLxD, f_vjp = jax.vjp(
                    lambda p, h: branch(i, "F", p, rest, h, mask)[0], params[i], x2_BxLxD)
                x1_BxLxD = y1_BxLxD - f_BxLxD
                dp_f, dx2_from_f = f_vjp(dy1_BxLxD)
                dparams[i] = jax.tree.map(jnp.add, dp_f, dp_g)
                y1_BxLxD, y2_BxLxD = x1_BxLxD, x2_BxLxD
                dy2_BxLxD = dy2_BxLxD + dx2_from_f  # dx1 = dy1: the identity path
            return (dparams, jax.tree.map(_zero_cotangent, rests), dy1_BxLxD + dy2_BxLxD,
                    jax.tree.map(_zero_cotangent, mask))

        run.defvjp(run_fwd, run_bwd)
        y_BxLxD, outs = run([p for _, p, _ in splits], [r for _, _, r in splits], x_BxLxD,
                            padding_mask)
        if not deterministic:  # deterministic calls draw nothing: states are unchanged
            for layer, out in zip(self.blocks, outs):
                nnx.update(layer, out)  # advanced RNG states: new dropout masks next call
        return y_BxLxD

    # Decoding: the same two branches per layer, F through the mixer's decoding form.
    def init_cache(self, batch: int, max_len: int) -> list[decoding.Cache]:
        return [layer.init_cache(batch, max_len) for layer in self.blocks]

    def _decode(self, cache, x, run_mixer):
        x1 = x2 = x
        new = []
        for layer, layer_cache in zip(self.blocks, cache):
            f, layer_cache = run_mixer(layer, layer_cache, layer.branch_input(x2))
            new.append(layer_cache)
            y1 = x1 + f
            x1, x2 = y1, x2 + layer.feed_forward(y1, deterministic=True)
        return (x1 + x2) / 2, new

    def prefill(self, cache, x_BxLxD, padding_mask):
        def mixer_prefill(layer, layer_cache, h_BxLxD):  # block.short_conv's window too
            layer_cache, _ = layer._split_cache(layer_cache)
            h_BxLxD, window = layer.conv_prefill(h_BxLxD, padding_mask)
            y, layer_cache = decoding.prefill(layer.mixer, layer.decode_form, layer_cache,
                                              h_BxLxD, padding_mask)
            return y, layer._join_cache(layer_cache, window)

        return self._decode(cache, x_BxLxD, mixer_prefill)

    def step(self, cache, x_BxD):
        def mixer_step(layer, layer_cache, h_Bx1xD):
            layer_cache, window = layer._split_cache(layer_cache)
            h_BxD, window = layer.conv_step(window, h_Bx1xD[:, 0])
            y_BxD, layer_cache = decoding.step(layer.mixer, layer.decode_form, layer_cache,
                                               h_BxD)
            return y_BxD[:, None], layer._join_cache(layer_cache, window)

        y_Bx1xD, cache = self._decode(cache, x_BxD[:, None], mixer_step)
        return y_Bx1xD[:, 0], cache


class SegmentRecurrentStack(nnx.Module):
    """Transformer-XL's segment-level recurrence (Dai et al. 2019).

    The sequence is cut into segments of `block["segment_len"]` (0 = the whole
    input; the last segment is padded and masked), processed left to right by all
    layers; layer i of segment s attends to its memory, the stop-gradient inputs
    of layer i over the last `block["mem_len"]` positions (0 = segment_len) before
    the segment, padding mask included. Segment outputs are concatenated back to
    BxLxD. Needs a mixer with `Capabilities.takes_memory`. Segments are a Python
    loop (their count is static): the blocks hold dropout RNG state and may sow
    aux losses, which a `jax.lax.scan` body would have to thread by hand.
    """

    def __init__(self, *, num_layers: int, block: Mapping[str, Any], rngs: nnx.Rngs,
                 layers: Sequence[Mapping[str, Any]] | None = None, **block_args: Any):
        built = per_layer(num_layers, block, block_args, layers)
        for b, args in built:
            model = args.get("model", "transformer")
            caps = registry.capabilities(model)
            if not caps.takes_memory or caps.carries_state:
                raise ValueError(f"the segment_recurrent stack needs a mixer that takes "
                                 f"memory (Capabilities.takes_memory), e.g. 'transformer_xl', "
                                 f"in every layer; {model!r} does not")
            if "memory" not in inspect.signature(BLOCK_KINDS[b["kind"]].__call__).parameters:
                raise ValueError(f"block kind {b['kind']!r} does not pass memory to its "
                                 "mixer; the segment_recurrent stack needs 'pre_ln' or "
                                 "'gated'")
        self.segment_len = int(block["segment_len"])
        self.mem_len = int(block["mem_len"])
        if self.segment_len < 0 or self.mem_len < 0:
            raise ValueError(f"block segment_len ({self.segment_len}) and mem_len "
                             f"({self.mem_len}) must be >= 0 (0 = default)")
        self.blocks = nnx.List([BLOCK_KINDS[b["kind"]](block=b, rngs=rngs, **args)
                                for b, args in built])

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None, *,
                 deterministic: bool) -> jax.Array:
        return self._run(x_BxLxD, padding_mask, deterministic=deterministic)[0]

    def _lengths(self, length: int) -> tuple[int, int]:
        """(segment length, memory length) for an input of `length` positions."""
        seg_len = min(self.segment_len or length, length)
        return seg_len, self.mem_len or seg_len

    def _run(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None, *,
             deterministic: bool) -> tuple[jax.Array, list[jax.Array]]:
        """(output, every layer's inputs BxLxD): the second is the decoding cache."""
        batch, length, _ = x_BxLxD.shape
        seg_len, mem_len = self._lengths(length)
        num_segments = -(-length // seg_len)
        extra = num_segments * seg_len - length
        mask_BxL = layers.valid_mask(padding_mask, batch, length)
        x_BxPxD = jnp.pad(x_BxLxD, ((0, 0), (0, extra), (0, 0)))
        mask_BxP = jnp.pad(mask_BxL, ((0, 0), (0, extra)))
        memories: list[tuple[jax.Array, jax.Array] | None] = [None] * len(self.blocks)
        outputs, inputs = [], [[] for _ in self.blocks]
        for s in range(num_segments):
            h_BxSxD = x_BxPxD[:, s * seg_len:(s + 1) * seg_len]
            m_BxS = mask_BxP[:, s * seg_len:(s + 1) * seg_len]
            for i, layer in enumerate(self.blocks):
                inputs[i].append(h_BxSxD)
                memory = memories[i]
                if memory is None:
                    new_memory = (h_BxSxD, m_BxS)
                else:
                    new_memory = (jnp.concatenate([memory[0], h_BxSxD], axis=1),
                                  jnp.concatenate([memory[1], m_BxS], axis=1))
                memories[i] = (jax.lax.stop_gradient(new_memory[0][:, -mem_len:]),
                               new_memory[1][:, -mem_len:])
                h_BxSxD = layer(h_BxSxD, m_BxS, deterministic=deterministic,
                                memory=None if memory is None else memory[0],
                                memory_mask=None if memory is None else memory[1])
            outputs.append(h_BxSxD)
        return (jnp.concatenate(outputs, axis=1)[:, :length],
                [jnp.concatenate(h, axis=1)[:, :length] for h in inputs])

    # Decoding, the segment memory: each layer's inputs at the last segment_len + mem_len
    # positions, in a ring (slot p % size). A token at position p, in the segment starting
    # at s0 = p - p % segment_len, is the last row of that layer run on the segment's inputs
    # up to p with, as memory, the inputs at the mem_len positions before s0 (masked where
    # they do not exist): what the parallel form's memory holds there. Writing p overwrites
    # position p - size < s0 - mem_len, which no later token of this segment reads. Per
    # token and layer: one segment_len x (segment_len + mem_len) attention.
    def _ring(self, max_len: int) -> int:
        seg_len, mem_len = self._lengths(max_len)
        return min(seg_len + mem_len, max_len)

    def init_cache(self, batch: int, max_len: int) -> list[decoding.Cache]:
        size = self._ring(max_len)
        return [{"pos": jnp.zeros((batch,), jnp.int32),
                 "h": jnp.zeros((batch, size, layer.dim), jnp.float32)}
                for layer in self.blocks]

    def prefill(self, cache, x_BxLxD, padding_mask):
        y_BxLxD, inputs = self._run(x_BxLxD, padding_mask, deterministic=True)
        batch, length, _ = x_BxLxD.shape
        pos_B = decoding.lengths_of(padding_mask, batch, length)
        size = cache[0]["h"].shape[1]
        held_BxS = decoding.slot_positions(pos_B - 1, size)
        index_BxSx1 = jnp.clip(held_BxS, 0, length - 1)[..., None]
        return y_BxLxD, [
            {**c, "pos": pos_B,
             "h": jnp.where((held_BxS >= 0)[..., None], jnp.take_along_axis(
                 h_BxLxD.astype(jnp.float32), index_BxSx1, axis=1), 0.0)}
            for c, h_BxLxD in zip(cache, inputs)]

    def step(self, cache, x_BxD):
        # The ring holds a whole segment (size >= segment length; = max_len when the
        # segment is the whole input or longer), so the lengths follow from its size.
        size = cache[0]["h"].shape[1]
        seg_len = min(self.segment_len or size, size)
        mem_len = self.mem_len or seg_len
        pos_B = cache[0]["pos"]
        start_B = pos_B - pos_B % seg_len
        seg_idx_BxS = start_B[:, None] + jnp.arange(seg_len)[None]
        seg_mask_BxS = seg_idx_BxS <= pos_B[:, None]
        mem_idx_BxM = start_B[:, None] - mem_len + jnp.arange(mem_len)[None]
        mem_mask_BxM = mem_idx_BxM >= 0
        gather = lambda h_BxRxD, idx: jnp.take_along_axis(  # noqa: E731
            h_BxRxD, jnp.mod(idx, size)[..., None], axis=1).astype(x_BxD.dtype)
        new = []
        for layer, c in zip(self.blocks, cache):
            h_BxRxD = decoding.write_row(c["h"], pos_B % size, x_BxD)
            new.append({**c, "pos": pos_B + 1, "h": h_BxRxD})
            y_BxSxD = layer(gather(h_BxRxD, seg_idx_BxS), seg_mask_BxS, deterministic=True,
                            memory=gather(h_BxRxD, mem_idx_BxM), memory_mask=mem_mask_BxM)
            x_BxD = decoding.row_at(y_BxSxD, pos_B - start_B)
        return x_BxD, new


class UniversalStack(nnx.Module):
    """Universal Transformer (Dehghani et al. 2019) with ACT halting (Graves 2016).

    One block of `block["kind"]` (shared weights) is applied up to T =
    `block["act_max_steps"]` (0 = num_layers) times. Before each step the position
    and timestep sinusoids are added to the block's input; a halting unit
    p = sigmoid(Linear(.)) per position accumulates until it would pass 1 - eps
    (`act_epsilon`), when the position halts with the remainder R as its last
    weight; at step T every running position halts. The output is the sum of the
    step outputs weighted by these halting weights (summing to 1 per position); a
    halted position's state is copied unchanged to later steps (it is still a key
    for the others). The ponder cost `ponder_weight * mean(N + R)` over real
    positions is sown as `aux_loss`. All T steps are computed (static shapes);
    halting only sets the weights. With rotary (pos_emb='rotary') positions come from
    the mixer's rotations alone: the position sinusoid is not added, the timestep one is.
    """

    def __init__(self, *, num_layers: int, dim: int, block: Mapping[str, Any],
                 rngs: nnx.Rngs, **block_args: Any):
        if block_args.pop("layers", None) is not None:
            raise ValueError("the universal stack applies one shared block at every step; "
                             "a list of layers (a hybrid) needs stack 'sequential'")
        kind = BLOCK_KINDS[block["kind"]]
        self.layer = kind(dim=dim, block=dict(block), rngs=rngs, **block_args)
        self.rotary = bool(block_args.get("rotary", False))
        self.max_steps = int(block["act_max_steps"]) or num_layers
        self.threshold = 1.0 - float(block["act_epsilon"])
        self.ponder_weight = float(block["ponder_weight"])
        if self.max_steps < 1 or not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"universal stack: act_max_steps must be >= 0 and act_epsilon "
                             f"in [0, 1), got {block['act_max_steps']}, {block['act_epsilon']}")
        # Bias 1 as in tensor2tensor's ACT: positions start by halting after a few steps.
        self.halting = layers.dense(dim, 1, ("embed", None),
                                    bias_init=jax.nn.initializers.constant(1.0), rngs=rngs)

    def act(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None, *,
            deterministic: bool) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """(output_BxLxD, weights_TxBxL, steps_BxL (N), remainders_BxL (R))."""
        carry = None

        def apply(t: int, in_BxLxD: jax.Array) -> jax.Array:
            nonlocal carry
            if self.layer.carries_state:
                new_BxLxD, carry = self.layer(in_BxLxD, padding_mask,
                                              deterministic=deterministic, carry=carry)
                return new_BxLxD
            return self.layer(in_BxLxD, padding_mask, deterministic=deterministic)

        length, dim = x_BxLxD.shape[1:]
        return self._act(x_BxLxD, self._positions(length, dim)[None], apply)

    def _positions(self, length: int, dim: int) -> jax.Array:
        """The position signal added before every step (none under rotary)."""
        if self.rotary:
            return jnp.zeros((length, dim), jnp.float32)
        return layers.sinusoidal_positions(length, dim)

    def _act(self, x_BxLxD: jax.Array, position_BxLxD: jax.Array, apply: Any
             ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """ACT over `apply(t, step_input) -> step_output` (the shared block at step t)."""
        batch, length, dim = x_BxLxD.shape
        timestep_TxD = layers.sinusoidal_positions(self.max_steps, dim)
        cumulative_BxL = jnp.zeros((batch, length), jnp.float32)
        remainders_BxL = jnp.zeros_like(cumulative_BxL)
        steps_BxL = jnp.zeros_like(cumulative_BxL)
        output_BxLxD = jnp.zeros_like(x_BxLxD)
        # Tracked as its own flag: 1 - cumulative after halting may round below 1.
        running_BxL = jnp.ones_like(cumulative_BxL)
        state_BxLxD, weights = x_BxLxD, []
        for t in range(self.max_steps):
            in_BxLxD = state_BxLxD + position_BxLxD.astype(x_BxLxD.dtype) + timestep_TxD[t]
            p_BxL = jax.nn.sigmoid(self.halting(in_BxLxD)[..., 0].astype(jnp.float32))
            if t == self.max_steps - 1:
                halts_BxL, continues_BxL = running_BxL, jnp.zeros_like(running_BxL)
            else:
                passes_BxL = cumulative_BxL + p_BxL * running_BxL > self.threshold
                halts_BxL = jnp.where(passes_BxL, running_BxL, 0.0)
                continues_BxL = jnp.where(passes_BxL, 0.0, running_BxL)
            cumulative_BxL = cumulative_BxL + p_BxL * continues_BxL
            step_remainder_BxL = halts_BxL * (1.0 - cumulative_BxL)
            remainders_BxL = remainders_BxL + step_remainder_BxL
            cumulative_BxL = cumulative_BxL + step_remainder_BxL
            steps_BxL = steps_BxL + continues_BxL + halts_BxL
            weight_BxL = p_BxL * continues_BxL + step_remainder_BxL
            weights.append(weight_BxL)
            new_BxLxD = apply(t, in_BxLxD)
            weight_BxLx1 = weight_BxL[..., None].astype(new_BxLxD.dtype)
            output_BxLxD = output_BxLxD + weight_BxLx1 * new_BxLxD
            state_BxLxD = jnp.where(running_BxL[..., None] > 0, new_BxLxD, state_BxLxD)
            running_BxL = continues_BxL
        return output_BxLxD, jnp.stack(weights), steps_BxL, remainders_BxL

    # Decoding: the shared block has one cache per ACT step (step t's keys are the
    # positions' step-t inputs; a halted position's state is copied on, as in `act`).
    def init_cache(self, batch: int, max_len: int) -> list[decoding.Cache]:
        return [self.layer.init_cache(batch, max_len) for _ in range(self.max_steps)]

    def prefill(self, cache, x_BxLxD, padding_mask):
        new = list(cache)

        def apply(t, in_BxLxD):
            out_BxLxD, new[t] = self.layer.prefill(cache[t], in_BxLxD, padding_mask)
            return out_BxLxD

        length, dim = x_BxLxD.shape[1:]
        output_BxLxD = self._act(x_BxLxD, self._positions(length, dim)[None], apply)[0]
        return output_BxLxD, new

    def step(self, cache, x_BxD):
        new = list(cache)

        def apply(t, in_Bx1xD):
            out_BxD, new[t] = self.layer.step(cache[t], in_Bx1xD[:, 0])
            return out_BxD[:, None]

        pos_B = cache[0]["pos"]
        position_Bx1xD = (jnp.zeros_like(x_BxD) if self.rotary
                          else layers.sinusoidal_at(pos_B, x_BxD.shape[-1]))[:, None]
        return self._act(x_BxD[:, None], position_Bx1xD, apply)[0][:, 0], new

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None, *,
                 deterministic: bool) -> jax.Array:
        output_BxLxD, _, steps_BxL, remainders_BxL = self.act(
            x_BxLxD, padding_mask, deterministic=deterministic)
        ponder_BxL = steps_BxL + remainders_BxL
        if padding_mask is None:
            ponder = jnp.mean(ponder_BxL)
        else:  # padded positions do not count
            real_BxL = padding_mask.astype(jnp.float32)
            ponder = jnp.sum(ponder_BxL * real_BxL) / jnp.maximum(jnp.sum(real_BxL), 1.0)
        self.sow(nnx.Intermediate, "aux_loss", self.ponder_weight * ponder)
        return output_BxLxD


# stack name -> stack class (constructor and call as in the module docstring).
STACKS: dict[str, type[nnx.Module]] = {"sequential": SequentialStack,
                                       "reversible": ReversibleStack,
                                       "segment_recurrent": SegmentRecurrentStack,
                                       "universal": UniversalStack}


def resolve_block(model: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The block settings `model` runs with: defaults < variant's < overrides.

    Raises ValueError on an unknown key, kind or stack (listing the valid ones).
    """
    implied = registry.capabilities(model).block or {}
    overrides = dict(overrides or {})
    for source, values in (("Capabilities.block of " + repr(model), implied),
                           ("config.block", overrides)):
        unknown = sorted(set(values) - set(BLOCK_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown {source} key(s) {', '.join(map(repr, unknown))}; "
                             f"valid: {', '.join(sorted(BLOCK_DEFAULTS))}")
    resolved = {**BLOCK_DEFAULTS, **implied, **overrides}
    if resolved["kind"] not in BLOCK_KINDS:
        raise ValueError(f"unknown block kind {resolved['kind']!r}; "
                         f"valid: {', '.join(sorted(BLOCK_KINDS))}")
    if resolved["stack"] not in STACKS:
        raise ValueError(f"unknown block stack {resolved['stack']!r}; "
                         f"valid: {', '.join(sorted(STACKS))}")
    if (resolved["kind"] == "mega_pre_ln"
            and not registry.capabilities(model).takes_residual):
        raise ValueError(mega_pre_ln_refusal(model))
    if not isinstance(resolved["ffn"], bool):
        raise ValueError(f"block ffn must be true or false, got {resolved['ffn']!r}")
    if int(resolved["ffn_chunks"]) < 1:
        raise ValueError(f"block ffn_chunks must be >= 1, got {resolved['ffn_chunks']}")
    short = resolved["short_conv"]
    if isinstance(short, bool) or not isinstance(short, int) or short < 0:
        raise ValueError(f"block short_conv is a kernel size (0 = off), got {short!r}")
    if short and resolved["stack"] == "segment_recurrent":
        raise ValueError("block short_conv with the segment_recurrent stack: the "
                         "convolution would not see the memory segment; not supported")
    return resolved


def resolve_layer_block(block: Mapping[str, Any], base: str, model: str,
                        overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The block of one layer of a hybrid stack whose model (`base`) runs with `block`
    (resolve_block's): `block`, then, for a layer of another mixer, the per-layer keys
    that mixer implies (Capabilities.block, e.g. gtrxl's gated kind), then the layer's own
    `overrides` (BLOCK_LAYER_KEYS only: the stack is the model's). ValueError in one line
    on another key or a kind the mixer cannot take."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(BLOCK_LAYER_KEYS))
    if unknown:
        raise ValueError(f"a layer's block sets {', '.join(map(repr, unknown))}; a layer may "
                         f"set only {', '.join(BLOCK_LAYER_KEYS)} (the stack and its "
                         "settings are the model's: config.block)")
    implied = {} if model == base else {
        k: v for k, v in (registry.capabilities(model).block or {}).items()
        if k in BLOCK_LAYER_KEYS}
    resolved = {**dict(block), **implied, **overrides}
    if resolved["kind"] not in BLOCK_KINDS:
        raise ValueError(f"unknown block kind {resolved['kind']!r}; "
                         f"valid: {', '.join(sorted(BLOCK_KINDS))}")
    if resolved["kind"] == "mega_pre_ln" and not registry.capabilities(model).takes_residual:
        raise ValueError(mega_pre_ln_refusal(model) + " (a layer's own block kind)")
    if not isinstance(resolved["ffn"], bool):
        raise ValueError(f"block ffn must be true or false, got {resolved['ffn']!r}")
    if int(resolved["ffn_chunks"]) < 1:
        raise ValueError(f"block ffn_chunks must be >= 1, got {resolved['ffn_chunks']}")
    short = resolved.get("short_conv", 0)
    if isinstance(short, bool) or not isinstance(short, int) or short < 0:
        raise ValueError(f"block short_conv is a kernel size (0 = off), got {short!r}")
    return resolved
