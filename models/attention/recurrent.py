"""Recurrent decoding of the kernelised variants (models/attention/linear.py): the
"recurrent_state" form of `models.decoding`.

Katharopoulos et al. ("Transformers are RNNs"): causal linear attention is an RNN. Per
head it carries the sums S = sum_j w_j phi(k_j) v_j^T (FxK) and z = sum_j w_j phi(k_j)
(F), w_j the decay since key j (1 without a gate), and reads a query as phi(q) S over
phi(q) z; the delta rule (fast_weight) carries its memory S alone. The state has the same
size at every position, so a token costs O(F K) time and memory, never O(position).

`RecurrentDecoding` is the driver that `_KernelAttention` mixes in: `init_cache`,
`prefill` and `step` do the projections, the positions and the cache's "pos", and a
variant supplies
    empty_state(batch)                         -> state
    prompt(q, k, v, x, padding_mask)           -> (outputs BxHxLxK, state after the prompt)
    recur(state, q, k, v, x_BxD, pos_B)        -> (outputs BxHxK, state)
The state is a dict of float32 arrays (a pytree: jit, `jax.lax.scan` and donation take
it as it is); decoding is deterministic (no feature redraws, no dropout).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models import decoding

State = dict[str, jax.Array]


# ----------------------------------------------------------------------------- the sums
# Linear attention under rotary puts rotated features in S and plain ones in z (see
# linear.py's docstring), so these take S's and z's features separately; the other
# variants pass the same features twice.


def zero_sums(batch: int, heads: int, features: int, dim: int) -> State:
    """S (BxHxFxK) and z (BxHxF) of no key."""
    return {"s": jnp.zeros((batch, heads, features, dim), jnp.float32),
            "z": jnp.zeros((batch, heads, features), jnp.float32)}


def prompt_sums(s_key_BxHxLxF: jax.Array, z_key_BxHxLxF: jax.Array,
                v_BxHxLxK: jax.Array) -> State:
    """S and z of a whole prompt, each key's weight already folded in (padded keys 0)."""
    f32 = jnp.float32
    s_BxHxFxK = jnp.einsum("bhlf,bhlk->bhfk", s_key_BxHxLxF.astype(f32), v_BxHxLxK.astype(f32))
    return {"s": s_BxHxFxK, "z": jnp.sum(z_key_BxHxLxF.astype(f32), axis=2)}


def add_token(state: State, s_key_BxHxF: jax.Array, z_key_BxHxF: jax.Array,
              v_BxHxK: jax.Array, decay_BxH: jax.Array | None = None) -> State:
    """S <- decay S + phi(k) v^T and z <- decay z + phi(k); the other entries kept."""
    f32 = jnp.float32
    s_BxHxFxK, z_BxHxF = state["s"], state["z"]
    if decay_BxH is not None:
        s_BxHxFxK = decay_BxH[..., None, None] * s_BxHxFxK
        z_BxHxF = decay_BxH[..., None] * z_BxHxF
    write_BxHxFxK = jnp.einsum("bhf,bhk->bhfk", s_key_BxHxF.astype(f32), v_BxHxK.astype(f32))
    return {**state, "s": s_BxHxFxK + write_BxHxFxK, "z": z_BxHxF + z_key_BxHxF.astype(f32)}


def read(state: State, s_query_BxHxF: jax.Array,
         z_query_BxHxF: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A query's numerator phi(q) S (BxHxK) and denominator phi(q) z (BxH)."""
    f32 = jnp.float32
    return (jnp.einsum("bhf,bhfk->bhk", s_query_BxHxF.astype(f32), state["s"]),
            jnp.einsum("bhf,bhf->bh", z_query_BxHxF.astype(f32), state["z"]))


# ----------------------------------------------------------------------------- the driver


class RecurrentDecoding:
    """`init_cache` / `prefill` / `step` of `models.decoding`'s "recurrent_state" form,
    for a `MultiHeadAttention` with `qkv(x, positions)` (q, k rotated as its `attend`
    takes them) and the three methods of the module docstring."""

    def init_cache(self, batch: int, max_len: int) -> State:
        """"pos" (int32[B], zeros) and the empty state, whose size does not depend on
        `max_len`."""
        del max_len  # the state never grows with the position
        self._check_decodes()
        return {"pos": jnp.zeros((batch,), jnp.int32), **self.empty_state(batch)}

    def prefill(self, cache: State, x_BxLxD: jax.Array,
                padding_mask_BxL: jax.Array | None) -> tuple[jax.Array, State]:
        """A right-padded prompt: the parallel causal outputs (`__call__`'s) and the cache
        after row b's real tokens (positions < its length), pos = the lengths. One
        parallel call, no loop over tokens."""
        del cache  # a prompt starts at position 0: its state replaces the empty one
        self._check_decodes()
        q_BxHxLxK, k_BxHxLxK, v_BxHxLxK = self.qkv(x_BxLxD)
        o_BxHxLxK, state = self.prompt(q_BxHxLxK, k_BxHxLxK, v_BxHxLxK, x_BxLxD,
                                       padding_mask_BxL)
        y_BxLxD = self.out(self.merge_heads(o_BxHxLxK.astype(x_BxLxD.dtype)))
        pos_B = decoding.lengths_of(padding_mask_BxL, *x_BxLxD.shape[:2])
        return y_BxLxD, {"pos": pos_B, **state}

    def step(self, cache: State, x_BxD: jax.Array) -> tuple[jax.Array, State]:
        """One token per row, row b at position cache["pos"][b]: the parallel causal form's
        output there, and the cache with the token added and pos + 1."""
        self._check_decodes()
        pos_B = cache["pos"]
        state = {name: array for name, array in cache.items() if name != "pos"}
        q_BxHx1xK, k_BxHx1xK, v_BxHx1xK = self.qkv(x_BxD[:, None], pos_B[:, None, None])
        o_BxHxK, state = self.recur(state, q_BxHx1xK, k_BxHx1xK, v_BxHx1xK, x_BxD, pos_B)
        y_BxD = self.out(self.merge_heads(o_BxHxK[:, :, None].astype(x_BxD.dtype)))[:, 0]
        return y_BxD, {"pos": pos_B + 1, **state}

    def _check_decodes(self) -> None:
        if not self.causal:
            raise decoding.DecodingError(
                f"{type(self).__name__} was built with causal=False; only the causal form "
                "reads a state one token at a time")

    def empty_state(self, batch: int) -> State:
        """The state before any token (float32 arrays, none named "pos")."""
        raise NotImplementedError

    def prompt(self, q_BxHxLxK: jax.Array, k_BxHxLxK: jax.Array, v_BxHxLxK: jax.Array,
               x_BxLxD: jax.Array, padding_mask: jax.Array | None
               ) -> tuple[jax.Array, State]:
        """`attend`'s deterministic causal outputs (BxHxLxK) and the state after each
        row's real tokens (the prompt is right-padded)."""
        raise NotImplementedError

    def recur(self, state: State, q_BxHx1xK: jax.Array, k_BxHx1xK: jax.Array,
              v_BxHx1xK: jax.Array, x_BxD: jax.Array, pos_B: jax.Array
              ) -> tuple[jax.Array, State]:
        """One token per row (q, k rotated by pos_B where `qkv` rotates them): its
        per-head output BxHxK and the new state."""
        raise NotImplementedError
