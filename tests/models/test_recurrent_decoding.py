"""The "recurrent_state" decoding form of the linear family (linear, performer, rfa,
fast_weight; models/attention/linear.py and models/attention/recurrent.py).

Through `models.decoding`'s dispatch: a right-padded prompt is prefilled in one call,
then every row is stepped one token at a time from its own position (jitted, inside
`jax.lax.scan`); the outputs must equal the parallel causal forward at every position of
every row. And the state's size must not depend on max_len (O(1) memory per token).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import decoding, registry
from tests.models.helpers import apply, normal

DIM, HEADS, LENGTH, PROMPT = 16, 2, 12, 7
HEAD = DIM // HEADS
FORM = "recurrent_state"
TOL = dict(rtol=1e-5, atol=1e-5)
# Prompt lengths per row: ragged across the chunk size (4), and 0 (a row whose prefill
# leaves the empty state); None: no prefill, every row steps from `init_cache`.
PROMPT_LENGTHS = ([1, 4, 7], [0, 7, 2], None)
# rfa gets its test_hparams' 32 features: its sin/cos denominator can cancel, and with 8
# it fell to 2e-3 at one position here, where the chunked and the recurrent summation
# orders differ by ~1e-5 relative in float32 (conditioning, not a wrong state).
SMALL = {"linear": {}, "performer": {"num_features": 8}, "rfa": {"num_features": 32},
         "fast_weight": {}}

# (variant, hparams, rotary[, input scale])
CASES = [
    ("linear", {}, False),
    ("linear", {}, True),
    # A large eps, so that where it sits (num / (den + eps)) shows above the tolerance.
    ("linear", {"eps": 0.5}, True),
    ("performer", {"kernel": "relu"}, False),
    ("performer", {"kernel": "relu"}, True),
    ("performer", {"kernel": "softmax"}, False),
    ("performer", {"kernel": "softmax"}, True),
    # Inputs x20: every key's logit is below -100, where exp underflows in float32, so the
    # outputs are right only if the state is stabilised by the same running max.
    ("performer", {"kernel": "softmax"}, True, 20.0),
    ("rfa", {"gate": False}, False),
    ("rfa", {"gate": False}, True),
    ("rfa", {"gate": True}, False),
    ("rfa", {"gate": True}, True),
    ("fast_weight", {"feature_map": "dpfp"}, False),
    ("fast_weight", {"feature_map": "dpfp"}, True),
    ("fast_weight", {"feature_map": "elu"}, False),
    ("fast_weight", {"feature_map": "elu"}, True),
    # The Pallas forms decode with the same state (rfa's kernel normalises by den + eps).
    ("linear", {"attention_impl": "pallas"}, False),
    ("performer", {"kernel": "relu", "attention_impl": "pallas"}, False),
    ("rfa", {"attention_impl": "pallas"}, False),
]


def case_id(case) -> str:
    name, hparams, rotary, *scale = case
    return "-".join([name, *(str(v) for v in hparams.values())] + (["rotary"] if rotary else [])
                    + [f"x{v:g}" for v in scale])


def build(name: str, hparams: dict, *, rotary: bool = False, max_len: int = LENGTH,
          causal: bool = True) -> nnx.Module:
    return registry.build(name, dim=DIM, num_heads=HEADS, max_len=max_len, causal=causal,
                          rngs=nnx.Rngs(0), rotary=rotary, chunk_size=4,
                          **{**SMALL[name], **hparams})


def decoder(mixer: nnx.Module, *, prefill: bool):
    """A jitted decode: prefill the first lengths[b] prompt tokens of row b (prefill=False:
    none, every row from the empty cache), then LENGTH steps in a scan, each row fed x at
    its own position (clipped once a row is past the end; those outputs go uncompared).
    (x_BxLxD, prompt_BxPxD, lengths_B) -> (prefill outputs BxPxD, step positions TxB,
    step outputs TxBxD, final pos B)."""
    graphdef, weights = nnx.split(mixer)

    @jax.jit
    def run(x_BxLxD, prompt_BxPxD, lengths_B):
        model = nnx.merge(graphdef, weights)
        batch, length, dim = x_BxLxD.shape
        mask_BxP = jnp.arange(prompt_BxPxD.shape[1])[None] < lengths_B[:, None]
        cache = decoding.init_cache(model, FORM, batch=batch, max_len=length, dim=dim)
        y_BxPxD = jnp.zeros_like(prompt_BxPxD)
        if prefill:
            y_BxPxD, cache = decoding.prefill(model, FORM, cache, prompt_BxPxD, mask_BxP)

        def one(cache, _):
            pos_B = cache["pos"]
            x_BxD = decoding.row_at(x_BxLxD, jnp.minimum(pos_B, length - 1))
            y_BxD, cache = decoding.step(model, FORM, cache, x_BxD)
            return cache, (pos_B, y_BxD)

        cache, (pos_TxB, y_TxBxD) = jax.lax.scan(one, cache, length=length)
        return y_BxPxD, pos_TxB, y_TxBxD, cache["pos"]

    return run


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_prefill_then_steps_equal_parallel_causal_form(case):
    name, hparams, rotary, *scale = case
    assert registry.capabilities(name).decode == FORM
    mixer = build(name, hparams, rotary=rotary)
    x = normal(0, (3, LENGTH, DIM)) * (scale[0] if scale else 1.0)
    want_BxLxD = np.asarray(apply(mixer, x, padding_mask=None))
    decoders = {flag: decoder(mixer, prefill=flag) for flag in (True, False)}
    for lengths in PROMPT_LENGTHS:
        prefill = lengths is not None
        lengths = lengths if prefill else [0, 0, 0]
        real_BxP = np.arange(PROMPT)[None] < np.array(lengths)[:, None]
        # Padded prompt positions hold other tokens: they must not reach the state.
        other = 3.0 * normal(1, (3, PROMPT, DIM))
        prompt = jnp.where(real_BxP[..., None], x[:, :PROMPT], other)
        y_prompt, pos_TxB, y_TxBxD, final_pos = (
            np.asarray(a) for a in decoders[prefill](x, prompt, jnp.asarray(lengths)))
        got, want = [y_prompt[real_BxP]], [want_BxLxD[:, :PROMPT][real_BxP]]
        stepped_TxB = pos_TxB < LENGTH
        rows_TxB = np.broadcast_to(np.arange(3)[None], pos_TxB.shape)
        got.append(y_TxBxD[stepped_TxB])
        want.append(want_BxLxD[rows_TxB[stepped_TxB], pos_TxB[stepped_TxB]])
        got, want = np.concatenate(got), np.concatenate(want)
        # Every position of every row is compared exactly once.
        assert len(got) == 3 * LENGTH
        np.testing.assert_array_equal(pos_TxB[0], lengths)
        np.testing.assert_array_equal(final_pos, np.array(lengths) + LENGTH)
        error = np.abs(got - want).max()
        # Scaled inputs: logits near -100 carry |logit| x float32's rounding (1e-5
        # relative) through exp in either form; an unstabilised state is off by far more
        # (underflow to 0/0).
        tol = dict(TOL, rtol=TOL["rtol"] * scale[0]) if scale else TOL
        np.testing.assert_allclose(got, want, **tol,
                                   err_msg=f"prompt lengths {lengths}: max |error| {error:.2e}")


# The state per variant (B = 2, H = 2, K = 8): independent of max_len.
STATE_SHAPES = {
    ("linear", ()): {"s": (2, HEADS, HEAD, HEAD), "z": (2, HEADS, HEAD)},
    ("performer", ("relu",)): {"s": (2, HEADS, 8, HEAD), "z": (2, HEADS, 8)},
    ("performer", ("softmax",)): {"s": (2, HEADS, 8, HEAD), "z": (2, HEADS, 8),
                                  "key_max": (2, HEADS)},
    ("rfa", (False,)): {"s": (2, HEADS, 64, HEAD), "z": (2, HEADS, 64)},
    ("rfa", (True,)): {"s": (2, HEADS, 64, HEAD), "z": (2, HEADS, 64)},
    ("fast_weight", ("dpfp",)): {"s": (2, HEADS, HEAD, 2 * HEAD)},
    ("fast_weight", ("elu",)): {"s": (2, HEADS, HEAD, HEAD)},
}
HPARAM_NAMES = {"performer": "kernel", "rfa": "gate", "fast_weight": "feature_map"}


@pytest.mark.parametrize("variant", list(STATE_SHAPES), ids=lambda v: "-".join(map(str, (
    v[0], *v[1]))))
def test_state_size_does_not_depend_on_max_len(variant):
    name, values = variant
    hparams = dict(zip([HPARAM_NAMES[name]] if values else [], values))
    want = {"pos": ((2,), jnp.int32),
            **{key: (shape, jnp.float32) for key, shape in STATE_SHAPES[variant].items()}}
    x = jnp.zeros((2, 5, DIM))
    for max_len in (LENGTH, 1000):
        mixer = build(name, hparams, rotary=True, max_len=max_len)
        empty = mixer.init_cache(2, max_len)
        via_dispatch = decoding.init_cache(mixer, FORM, batch=2, max_len=max_len, dim=DIM)
        # Shapes only (no compute): after a prompt and after a token the cache is the same.
        prompted = jax.eval_shape(lambda c: mixer.prefill(c, x, None)[1], empty)
        stepped = jax.eval_shape(lambda c: mixer.step(c, x[:, 0])[1], empty)
        for cache in (empty, via_dispatch, prompted, stepped):
            got = {key: (a.shape, a.dtype) for key, a in cache.items()}
            assert got == want, (max_len, got)


def test_non_causal_mixer_refuses_to_decode():
    mixer = build("linear", {}, causal=False)
    with pytest.raises(decoding.DecodingError, match="causal=False"):
        mixer.init_cache(2, LENGTH)
