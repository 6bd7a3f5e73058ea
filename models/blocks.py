"""Residual blocks around a token mixer, and the `block` settings that choose them.

`EncoderBlock` is LRA's pre-LayerNorm Transformer block with the attention
replaced by any registered token mixer. Which block (and which stack, see
`models.stacks`) a model uses is data: a `block` dict, resolved by
`models.stacks.resolve_block(model, overrides)` from `BLOCK_DEFAULTS`, the variant's
`Capabilities.block` and the user's `config.block`. So a residual form (e.g. a
gated or reversible one) wraps any mixer and the classifier has no special cases.

Every block kind is built as

    kind(dim=, num_heads=, mlp_dim=, max_len=, model=, model_hparams=, causal=,
         dropout_rate=, prefix_len=, rotary=, block=resolved_block_dict, rngs=)

and called as `block(x_BxLxD, padding_mask, deterministic=..., carry=None)`,
returning x, or (x, new_carry) when `block.carries_state` (the mixer threads a
state between layers, e.g. Luna). The pre_ln and gated kinds also take
`memory=`, `memory_mask=` (the segment_recurrent stack's previous segment) and
pass them, normalised, to a mixer with `Capabilities.takes_memory`.

Decoding (models.decoding): `init_cache(batch, max_len)`, `prefill(cache, x_BxLxD, mask)`
and `step(cache, x_BxD)` run the same residual form around the mixer's decoding form,
dropout off.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry

# Every key `config.block` may set, with its default. A variant's Capabilities.block
# overrides these; the user's config.block overrides both.
BLOCK_DEFAULTS: dict[str, Any] = {
    "kind": "pre_ln",  # the residual form of one layer: a key of BLOCK_KINDS
    "stack": "sequential",  # how the layers are applied: a key of models.stacks.STACKS
    "ffn": True,  # False: no feed-forward branch, the layer is its mixer (S4's and S5's)
    "ffn_chunks": 1,  # feed-forward applied over this many sequence chunks; 1 = at once
    "gate_bias": 2.0,  # gated kind: b_g, > 0 so each gate starts near the identity
    "segment_len": 256,  # segment_recurrent stack: segment length; 0 = the whole input
    "mem_len": 0,  # segment_recurrent stack: memory length; 0 = segment_len
    "act_max_steps": 0,  # universal stack: at most this many steps T; 0 = num_layers
    "act_epsilon": 0.01,  # universal stack: a position halts at cumulative p > 1 - eps
    "ponder_weight": 0.01,  # universal stack: weight of the ponder cost aux_loss
    # Zoology's "BASED recipe" (issue 43): a short causal depthwise convolution of this
    # kernel size on the mixer's input, before any mixer (ShortConv); 0 = off.
    "short_conv": 0,
}


class ShortConv(nnx.Module):
    """Zoology's ShortConvolution (zoology/mixers/convolution.py at b603008): a depthwise
    causal convolution over the sequence, y_t = b + sum_j w_j * x_{t+j-(k-1)} per channel
    (nn.Conv1d(d, d, k, groups=d, padding=k-1) cut to the first L outputs), initialised as
    torch's Conv1d: U(-1/sqrt(k), 1/sqrt(k)) for weights and bias. Zoology puts one before
    the sequence mixers "for fairness" (the BASED recipe); `block.short_conv=k` puts one on
    the input of any mixer. Causal: a position sees itself and the k-1 before it, so
    right padding never reaches a real position."""

    def __init__(self, dim: int, kernel_size: int, *, rngs: nnx.Rngs):
        bound = 1.0 / kernel_size ** 0.5
        init = jax.nn.initializers.uniform(2 * bound)
        self.kernel_size = kernel_size
        self.weight = layers.param(lambda key, shape, dtype: init(key, shape, dtype) - bound,
                                   (None, "embed"), (kernel_size, dim), rngs=rngs)
        self.bias = layers.param(lambda key, shape, dtype: init(key, shape, dtype) - bound,
                                 ("embed",), (dim,), rngs=rngs)

    def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
        k, length = self.kernel_size, x_BxLxD.shape[1]
        w_KxD = self.weight[...].astype(x_BxLxD.dtype)
        padded = jnp.pad(x_BxLxD, ((0, 0), (k - 1, 0), (0, 0)))
        y_BxLxD = sum(padded[:, j:j + length] * w_KxD[j] for j in range(k))
        return y_BxLxD + self.bias[...].astype(x_BxLxD.dtype)


class MlpBlock(nnx.Module):
    """Dense(dim -> mlp_dim) -> GELU -> Dropout -> Dense(mlp_dim -> dim) -> Dropout.

    With `chunks` > 1 (Reformer's chunked feed-forward) the sequence is split into
    that many chunks (the last one right-padded) and the MLP runs over them one at a
    time under `jax.lax.map` with a rematerialised body, so the B x L x mlp_dim
    hidden is never whole, in the forward nor in the backward pass. Positions are
    independent, so the output equals the unchunked one (dropout masks aside).
    """

    def __init__(self, *, dim: int, mlp_dim: int, dropout_rate: float = 0.1,
                 chunks: int = 1, rngs: nnx.Rngs):
        if chunks < 1:
            raise ValueError(f"MlpBlock: chunks must be >= 1, got {chunks}")
        bias_init = layers.normal(1e-6)  # LRA's MlpBlock
        self.chunks = chunks
        self.fc1 = layers.dense(dim, mlp_dim, ("embed", "mlp"), bias_init=bias_init, rngs=rngs)
        self.fc2 = layers.dense(mlp_dim, dim, ("mlp", "embed"), bias_init=bias_init, rngs=rngs)
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)

    def _apply(self, x_BxLxD: jax.Array, deterministic: bool,
               keys: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
        key1, key2 = keys if keys is not None else (None, None)
        h_BxLxF = self.dropout(jax.nn.gelu(self.fc1(x_BxLxD)), deterministic=deterministic,
                               rngs=key1)
        return self.dropout(self.fc2(h_BxLxF), deterministic=deterministic, rngs=key2)

    def __call__(self, x_BxLxD: jax.Array, *, deterministic: bool) -> jax.Array:
        batch, seq_len, dim = x_BxLxD.shape
        chunks = min(self.chunks, seq_len)
        if chunks == 1:
            return self._apply(x_BxLxD, deterministic)
        chunk_len = -(-seq_len // chunks)
        extra = chunks * chunk_len - seq_len
        x_CxBxTxD = jnp.pad(x_BxLxD, ((0, 0), (0, extra), (0, 0))).reshape(
            batch, chunks, chunk_len, dim).transpose(1, 0, 2, 3)
        use_dropout = not deterministic and self.dropout.rate > 0
        # The stream advances once per call (outside the map: no state changes inside
        # a JAX transform); each chunk and each of its two dropouts gets its own key.
        keys_Cx2 = (jax.random.split(self.dropout.rngs(), (chunks, 2)) if use_dropout
                    else jnp.zeros((chunks, 2), jnp.uint32))

        @jax.checkpoint  # keeps only the chunk inputs for the backward pass
        def one_chunk(args: tuple[jax.Array, jax.Array]) -> jax.Array:
            x_BxTxD, keys_2 = args
            return self._apply(x_BxTxD, deterministic,
                               (keys_2[0], keys_2[1]) if use_dropout else None)

        y_CxBxTxD = jax.lax.map(one_chunk, (x_CxBxTxD, keys_Cx2))
        y_BxPxD = y_CxBxTxD.transpose(1, 0, 2, 3).reshape(batch, chunks * chunk_len, dim)
        return y_BxPxD[:, :seq_len]


class EncoderBlock(nnx.Module):
    """x + Dropout(mixer(LN(x))), then x + MLP(LN(x)); without the second step when
    block["ffn"] is False (S4's and S5's LRA layers: the mixer alone, whose own output
    projection, a GLU, plays the MLP's part)."""

    def __init__(self, *, dim: int, num_heads: int, mlp_dim: int, max_len: int,
                 model: str = "transformer", model_hparams: Mapping[str, Any] | None = None,
                 causal: bool = False, dropout_rate: float = 0.1, prefix_len: int = 0,
                 rotary: bool = False, block: Mapping[str, Any] | None = None,
                 rngs: nnx.Rngs):
        block = {**BLOCK_DEFAULTS, **dict(block or {})}
        self.mixer_norm = layers.layer_norm(dim, rngs=rngs)
        self.carries_state = registry.capabilities(model).carries_state
        self.decode_form = registry.capabilities(model).decode if causal else ""
        self.dim = dim
        self.mixer = registry.build(model, dim=dim, num_heads=num_heads, max_len=max_len,
                                    causal=causal, prefix_len=prefix_len, rotary=rotary,
                                    rngs=rngs, **dict(model_hparams or {}))
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        # Without a feed-forward branch there is no norm for it either (an unused one
        # would still be weight-decayed and counted).
        self.mlp_norm = layers.layer_norm(dim, rngs=rngs) if block["ffn"] else None
        self.mlp = (MlpBlock(dim=dim, mlp_dim=mlp_dim, dropout_rate=dropout_rate,
                             chunks=int(block["ffn_chunks"]), rngs=rngs)
                    if block["ffn"] else None)
        self.short_conv = (ShortConv(dim, int(block["short_conv"]), rngs=rngs)
                           if int(block.get("short_conv", 0)) > 0 else None)

    def conv_input(self, h_BxLxD: jax.Array) -> jax.Array:
        """The mixer's input after block.short_conv's convolution (if any)."""
        return h_BxLxD if self.short_conv is None else self.short_conv(h_BxLxD)

    def branch_input(self, x_BxLxD: jax.Array) -> jax.Array:
        """What the mixer sees: LN(x) (pre-LN)."""
        return self.mixer_norm(x_BxLxD)

    def mix(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None, *,
            deterministic: bool, memory: jax.Array | None = None,
            memory_mask: jax.Array | None = None) -> jax.Array:
        """The attention residual branch, Dropout(mixer(LN(x))) (stateless mixers only).

        `memory` (the previous segment's layer inputs, BxMxD) goes through the same
        LayerNorm, for mixers with `Capabilities.takes_memory` (Transformer-XL).
        """
        extra = {}
        if memory is not None:
            extra = dict(memory=self.branch_input(memory), memory_mask=memory_mask)
        y_BxLxD = self.mixer(self.conv_input(self.branch_input(x_BxLxD)),
                             padding_mask=padding_mask, deterministic=deterministic, **extra)
        return self.dropout(y_BxLxD, deterministic=deterministic)

    def feed_forward(self, x_BxLxD: jax.Array, *, deterministic: bool) -> jax.Array:
        """The feed-forward residual branch, MLP(LN(x)); 0 without one (block["ffn"]
        False; the reversible stack's G is then 0)."""
        if self.mlp is None:
            return jnp.zeros_like(x_BxLxD)
        return self.mlp(self.mlp_norm(x_BxLxD), deterministic=deterministic)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None, *,
                 deterministic: bool, carry: Any = None, memory: jax.Array | None = None,
                 memory_mask: jax.Array | None = None) -> Any:
        """Returns x, or (x, new_carry) when the mixer carries state between layers.

        `memory`, `memory_mask`: see `mix` (passed by the segment_recurrent stack).
        """
        if self.carries_state:
            y_BxLxD, carry = self.mixer(self.conv_input(self.branch_input(x_BxLxD)),
                                        padding_mask=padding_mask,
                                        deterministic=deterministic, carry=carry)
            y_BxLxD = self.dropout(y_BxLxD, deterministic=deterministic)
        else:
            y_BxLxD = self.mix(x_BxLxD, padding_mask, deterministic=deterministic,
                               memory=memory, memory_mask=memory_mask)
        x_BxLxD = self.combine(x_BxLxD, y_BxLxD, deterministic=deterministic)
        return (x_BxLxD, carry) if self.carries_state else x_BxLxD

    def combine(self, x_BxLxD: jax.Array, y_BxLxD: jax.Array, *,
                deterministic: bool) -> jax.Array:
        """The layer's output from its input x and the mixer branch y (dropped out)."""
        x_BxLxD = x_BxLxD + y_BxLxD
        if self.mlp is None:
            return x_BxLxD
        return x_BxLxD + self.feed_forward(x_BxLxD, deterministic=deterministic)

    # ---------------------------------------------------------------- decoding

    def _check_decodes(self) -> None:
        if not self.decode_form or self.decode_form == "segment_memory":
            raise decoding.DecodingError(
                "this block's mixer was built without causal=True" if not self.decode_form
                else "a segment_memory mixer decodes through the segment_recurrent stack")

    # With block.short_conv the cache is {"mixer": the mixer's, "short_conv": the last
    # kernel_size - 1 inputs of the convolution (BxWxD)}; without, the mixer's alone.

    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        self._check_decodes()
        cache = decoding.init_cache(self.mixer, self.decode_form, batch=batch,
                                    max_len=max_len, dim=self.dim)
        if self.short_conv is None:
            return cache
        window = jnp.zeros((batch, self.short_conv.kernel_size - 1, self.dim), jnp.float32)
        return {"mixer": cache, "short_conv": window}

    def conv_prefill(self, h_BxLxD: jax.Array, padding_mask: jax.Array | None
                     ) -> tuple[jax.Array, jax.Array | None]:
        """The convolution on a right-padded prompt, and each row's window: its inputs
        n_b - W .. n_b - 1 (zeros before the start; causal, so the padded tail reaches no
        real position). None without a convolution."""
        if self.short_conv is None:
            return h_BxLxD, None
        batch, length = h_BxLxD.shape[:2]
        w = self.short_conv.kernel_size - 1
        lengths_B = decoding.lengths_of(padding_mask, batch, length)
        padded = jnp.pad(h_BxLxD.astype(jnp.float32), ((0, 0), (w, 0), (0, 0)))
        window = jnp.take_along_axis(padded, (lengths_B[:, None] + jnp.arange(w))[..., None],
                                     axis=1)
        return self.short_conv(h_BxLxD), window

    def conv_step(self, window_BxWxD: jax.Array | None, h_BxD: jax.Array
                  ) -> tuple[jax.Array, jax.Array | None]:
        """One token through the convolution: its output and the next window."""
        if self.short_conv is None:
            return h_BxD, None
        full = jnp.concatenate([window_BxWxD, h_BxD.astype(jnp.float32)[:, None]], axis=1)
        y_BxD = self.short_conv(full.astype(h_BxD.dtype))[:, -1]
        return y_BxD, full[:, 1:]

    def _split_cache(self, cache: decoding.Cache) -> tuple[decoding.Cache, Any]:
        return (cache, None) if self.short_conv is None else (cache["mixer"],
                                                               cache["short_conv"])

    def _join_cache(self, cache: decoding.Cache, window: Any) -> decoding.Cache:
        return cache if self.short_conv is None else {"mixer": cache, "short_conv": window}

    def prefill(self, cache: decoding.Cache, x_BxLxD: jax.Array,
                padding_mask: jax.Array | None) -> tuple[jax.Array, decoding.Cache]:
        """The parallel layer on a right-padded prompt, and the mixer's cache of it."""
        cache, _ = self._split_cache(cache)
        h_BxLxD, window = self.conv_prefill(self.branch_input(x_BxLxD), padding_mask)
        y_BxLxD, cache = decoding.prefill(self.mixer, self.decode_form, cache, h_BxLxD,
                                          padding_mask)
        return self.combine(x_BxLxD, y_BxLxD, deterministic=True), self._join_cache(cache,
                                                                                     window)

    def step(self, cache: decoding.Cache, x_BxD: jax.Array) -> tuple[jax.Array,
                                                                       decoding.Cache]:
        """One token per row through the layer (each row at its cache position)."""
        cache, window = self._split_cache(cache)
        h_BxD, window = self.conv_step(window, self.branch_input(x_BxD))
        y_BxD, cache = decoding.step(self.mixer, self.decode_form, cache, h_BxD)
        return (self.combine(x_BxD[:, None], y_BxD[:, None], deterministic=True)[:, 0],
                self._join_cache(cache, window))


class GruGate(nnx.Module):
    """GTrXL's GRU-type gate g(x, y) (Parisotto et al. 2020, eq. 8), x the residual stream:

    r = sigmoid(W_r y + U_r x), z = sigmoid(W_z y + U_z x - b_g),
    h = tanh(W_g y + U_g (r * x)), g = (1 - z) * x + z * h.
    """

    def __init__(self, dim: int, *, gate_bias: float, rngs: nnx.Rngs):
        proj = dict(use_bias=False, rngs=rngs)
        self.w_rzg = layers.dense(dim, 3 * dim, ("embed", "mlp"), **proj)  # W_r, W_z, W_g
        self.u_rz = layers.dense(dim, 2 * dim, ("embed", "mlp"), **proj)  # U_r, U_z
        self.u_g = layers.dense(dim, dim, ("embed", "mlp"), **proj)
        self.gate_bias = gate_bias

    def __call__(self, x_BxLxD: jax.Array, y_BxLxD: jax.Array) -> jax.Array:
        wr_BxLxD, wz_BxLxD, wg_BxLxD = jnp.split(self.w_rzg(y_BxLxD), 3, axis=-1)
        ur_BxLxD, uz_BxLxD = jnp.split(self.u_rz(x_BxLxD), 2, axis=-1)
        r_BxLxD = jax.nn.sigmoid(wr_BxLxD + ur_BxLxD)
        z_BxLxD = jax.nn.sigmoid(wz_BxLxD + uz_BxLxD - self.gate_bias)
        h_BxLxD = jnp.tanh(wg_BxLxD + self.u_g(r_BxLxD * x_BxLxD))
        return (1.0 - z_BxLxD) * x_BxLxD + z_BxLxD * h_BxLxD


class GatedBlock(EncoderBlock):
    """GTrXL block: LayerNorm on the branch inputs only, a GRU gate instead of each sum.

    y = g1(x, ReLU(Dropout(mixer(LN(x))))), then g2(y, ReLU(MLP(LN(y)))); with
    b_g = block["gate_bias"] > 0 both gates start close to passing x through.
    """

    def __init__(self, *, dim: int, block: Mapping[str, Any] | None = None, rngs: nnx.Rngs,
                 **block_args: Any):
        super().__init__(dim=dim, block=block, rngs=rngs, **block_args)
        gate_bias = float({**BLOCK_DEFAULTS, **dict(block or {})}["gate_bias"])
        self.mixer_gate = GruGate(dim, gate_bias=gate_bias, rngs=rngs)
        self.mlp_gate = (GruGate(dim, gate_bias=gate_bias, rngs=rngs)
                         if self.mlp is not None else None)

    def combine(self, x_BxLxD: jax.Array, y_BxLxD: jax.Array, *,
                deterministic: bool) -> jax.Array:
        """Gates instead of the sums of `EncoderBlock.combine`."""
        x_BxLxD = self.mixer_gate(x_BxLxD, jax.nn.relu(y_BxLxD))
        if self.mlp is None:
            return x_BxLxD
        return self.mlp_gate(
            x_BxLxD, jax.nn.relu(self.feed_forward(x_BxLxD, deterministic=deterministic)))


class PostLNBlock(EncoderBlock):
    """The original Transformer's residual form, the norms after the sums:
    x = LN(x + Dropout(mixer(x))), then LN(x + MLP(x)) (S4's LRA configs with
    `prenorm: false`, ListOps and CIFAR; Mega's `normalize_before=False`). Without the
    feed-forward branch (block["ffn"] False) the layer is LN(x + Dropout(mixer(x)))."""

    def branch_input(self, x_BxLxD: jax.Array) -> jax.Array:
        return x_BxLxD

    def feed_forward(self, x_BxLxD: jax.Array, *, deterministic: bool) -> jax.Array:
        if self.mlp is None:
            return jnp.zeros_like(x_BxLxD)
        return self.mlp(x_BxLxD, deterministic=deterministic)

    def combine(self, x_BxLxD: jax.Array, y_BxLxD: jax.Array, *,
                deterministic: bool) -> jax.Array:
        x_BxLxD = self.mixer_norm(x_BxLxD + y_BxLxD)
        if self.mlp is None:
            return x_BxLxD
        return self.mlp_norm(x_BxLxD + self.feed_forward(x_BxLxD,
                                                        deterministic=deterministic))


class MegaPreLNBlock(EncoderBlock):
    """Mega's pre-norm layer (facebookresearch/mega `MovingAverageGatedAttention` with
    prenorm: `residual = x; x = self.norm(x); ...; torch.addcmul(residual, u, h -
    residual)`), then its normalised FFN with prenorm, x + MLP(LN(x)):

        x = x + Dropout(u o (h - x)),  u, h = the mixer's gate and output on LN(x).

    The norm is on the mixer's input only; the update gate interpolates from the raw
    stream x, which the mixer receives as `residual=x` (Capabilities.takes_residual: the
    `mega` mixer). The pre_ln block gives the same mixer x + u o (h - LN(x)) instead.
    Dropout on the branch as in every block here (Mega's LRA image recipes set it to 0)."""

    def __init__(self, *, model: str = "transformer", **block_args: Any):
        if not registry.capabilities(model).takes_residual:
            raise ValueError(mega_pre_ln_refusal(model))
        super().__init__(model=model, **block_args)

    def mix(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None, *,
            deterministic: bool, memory: jax.Array | None = None,
            memory_mask: jax.Array | None = None) -> jax.Array:
        if memory is not None:
            raise ValueError("the mega_pre_ln block takes no segment memory")
        y_BxLxD = self.mixer(self.conv_input(self.branch_input(x_BxLxD)),
                             padding_mask=padding_mask, deterministic=deterministic,
                             residual=x_BxLxD)
        return self.dropout(y_BxLxD, deterministic=deterministic)

    def prefill(self, cache: decoding.Cache, x_BxLxD: jax.Array,
                padding_mask: jax.Array | None) -> tuple[jax.Array, decoding.Cache]:
        self._check_decodes()
        cache, _ = self._split_cache(cache)
        h_BxLxD, window = self.conv_prefill(self.branch_input(x_BxLxD), padding_mask)
        y_BxLxD, cache = self.mixer.prefill(cache, h_BxLxD, padding_mask, residual=x_BxLxD)
        return self.combine(x_BxLxD, y_BxLxD, deterministic=True), self._join_cache(cache,
                                                                                     window)

    def step(self, cache: decoding.Cache, x_BxD: jax.Array) -> tuple[jax.Array,
                                                                       decoding.Cache]:
        self._check_decodes()
        cache, window = self._split_cache(cache)
        h_BxD, window = self.conv_step(window, self.branch_input(x_BxD))
        y_BxD, cache = self.mixer.step(cache, h_BxD, residual=x_BxD)
        return (self.combine(x_BxD[:, None], y_BxD[:, None], deterministic=True)[:, 0],
                self._join_cache(cache, window))


def mega_pre_ln_refusal(model: str) -> str:
    takers = sorted(name for name in registry.available()
                    if registry.capabilities(name).takes_residual)
    return (f"block kind 'mega_pre_ln' needs a mixer that gates towards its residual "
            f"(Capabilities.takes_residual: {', '.join(takers)}); {model!r} is not one: "
            f"use 'pre_ln' or 'post_ln'")


# kind name -> block class (constructor and call as in the module docstring).
BLOCK_KINDS: dict[str, type[nnx.Module]] = {"pre_ln": EncoderBlock, "gated": GatedBlock,
                                            "post_ln": PostLNBlock,
                                            "mega_pre_ln": MegaPreLNBlock}
