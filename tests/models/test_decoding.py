"""The decoding contract (DESIGN.md 10): for every causal variant, built through the task
configs with objective=causal_lm, prefill(prompt) + step-by-step decoding give the parallel
causal forward's predictions at every position, for a batch whose rows have different
prompt lengths (right-padded prompts, each row at its own position afterwards).

The model is the one `lra.train.build_model` builds from `configs/listops.py:model=<name>,
runlocal,causal,pretrain` (presets, block and stack as a user gets them) at max_length 32,
with weights perturbed away from their initial values so that no branch is near zero.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.tasks
from configs import listops
from lra import train
from models import decoding, registry

from tests import tiers
from tests.models.helpers import apply, randomize_params

CAUSAL = [n for n in registry.available() if registry.capabilities(n).causal]
MAX_LEN = 32
PROMPT_LENS = (1, 7, 12)  # one row per prompt length; right-padded to 12
# float32; the recurrent and chunked forms sum in different orders.
RTOL, ATOL = 1e-5, 1e-5


def config_for(name: str, **overrides):
    config = listops.get_config(f"model={name},runlocal,causal,pretrain")
    config.max_length = MAX_LEN
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


@functools.lru_cache(maxsize=None)
def model_for(name: str, pos_emb: str | None = None, stack: str | None = None, **hparams):
    config = config_for(name)
    if pos_emb is not None:
        config.pos_emb = pos_emb
    if stack is not None:
        config.block.stack = stack
    for key, value in hparams.items():
        config.model_hparams[key] = value
    model = train.build_model(config, lra.tasks.get("listops"))
    return randomize_params(model, seed=5, scale=0.3)


def tokens(batch: int, length: int, vocab: int) -> jax.Array:
    return jax.random.randint(jax.random.key(0), (batch, length), 1, vocab)


def decode(model, tokens_BxT: jax.Array, prompt_lens) -> tuple[np.ndarray, np.ndarray]:
    """(predictions at every position reached, reached_BxT) from prefill + jitted steps."""
    batch, total = tokens_BxT.shape
    lens_B = jnp.asarray(prompt_lens, jnp.int32)
    prompt_len = max(prompt_lens)
    steps = total - prompt_len
    prompt_mask_BxP = jnp.arange(prompt_len)[None] < lens_B[:, None]
    graphdef, state = decoding.split(model)

    @jax.jit
    def run(state, prompt_BxP, mask_BxP, fed_NxB):
        cache = nnx.merge(graphdef, state).init_cache(batch)
        out_prompt, cache = nnx.merge(graphdef, state).prefill(cache, prompt_BxP, mask_BxP)

        def body(cache, token_B):
            out, cache = nnx.merge(graphdef, state).step(cache, token_B)
            return cache, out

        _, out_steps = jax.lax.scan(body, cache, fed_NxB)
        return out_prompt, out_steps

    # Step i feeds row b its token at position lens[b] + i: the prediction there.
    fed_BxN = jnp.take_along_axis(tokens_BxT, lens_B[:, None] + jnp.arange(steps)[None], 1)
    out_prompt, out_steps = run(state, tokens_BxT[:, :prompt_len], prompt_mask_BxP,
                                fed_BxN.T)
    out = np.zeros((batch, total) + out_prompt.shape[2:], np.float32)
    reached = np.zeros((batch, total), bool)
    out_steps = np.moveaxis(np.asarray(out_steps), 0, 1)  # BxN...
    for b, n in enumerate(prompt_lens):
        out[b, :n] = np.asarray(out_prompt)[b, :n]
        out[b, n:n + steps] = out_steps[b]
        reached[b, :n + steps] = True
    return out, reached


def check_equal(model, vocab: int) -> float:
    toks = tokens(len(PROMPT_LENS), MAX_LEN, vocab)
    parallel = np.asarray(apply(model, toks, None))
    stepped, reached = decode(model, toks, PROMPT_LENS)
    assert reached.sum() > len(PROMPT_LENS) * (MAX_LEN // 2)
    np.testing.assert_allclose(stepped[reached], parallel[reached], rtol=RTOL, atol=ATOL)
    return float(np.abs(stepped[reached] - parallel[reached]).max())


@pytest.mark.parametrize("name", tiers.variants(CAUSAL))  # one per module by default
def test_decoding_equals_the_parallel_causal_forward(name):
    model = model_for(name)
    check_equal(model, lra.tasks.get("listops").vocab_size)


@pytest.mark.parametrize("mode", ["dot", "random+factorized_random"])
def test_synthesizer_modes_decode(mode):
    """The dense mode is the config's; the others synthesize their rows their own way."""
    check_equal(model_for("synthesizer", mode=mode), lra.tasks.get("listops").vocab_size)


@pytest.mark.parametrize("name,pos_emb", [("transformer", "rotary"), ("local", "rotary"),
                                          ("transformer", "sinusoidal")])
def test_decoding_with_other_positions(name, pos_emb):
    """Rotary (rotated at each row's own position) and sinusoidal positions."""
    check_equal(model_for(name, pos_emb), lra.tasks.get("listops").vocab_size)


@pytest.mark.parametrize("name", ["transformer_xl", "gtrxl"])
def test_segment_memory_is_a_ring_of_segment_and_memory(name):
    """Segments of 8, memory of 4 (four segments in 32 positions): each layer keeps 12
    inputs, not max_len, and decoding still equals the parallel segment recurrence."""
    config = config_for(name)
    config.block.segment_len, config.block.mem_len = 8, 4
    model = randomize_params(train.build_model(config, lra.tasks.get("listops")), seed=5,
                             scale=0.3)
    assert all(c["h"].shape[1] == 12 for c in model.init_cache(1)["stack"])
    check_equal(model, lra.tasks.get("listops").vocab_size)


def test_decoding_through_the_reversible_stack():
    check_equal(model_for("local", stack="reversible"), lra.tasks.get("listops").vocab_size)


@pytest.mark.parametrize("name,stack", [("transformer", None), ("gla", None),
                                        ("deltanet", None), ("mega", None),
                                        ("local", "reversible")])
def test_decoding_through_the_shared_short_convolution(name, stack):
    """block.short_conv (a benchmark scaffold's shared convolution, configs/scaffold.py):
    the cache keeps its last kernel_size - 1 inputs beside the mixer's; a kv cache, a
    recurrent state, mega's pre-LN block and the reversible stack decode as the
    parallel form."""
    config = config_for(name)
    config.block.short_conv = 3
    if stack:
        config.block.stack = stack
    model = randomize_params(train.build_model(config, lra.tasks.get("listops")), seed=5,
                             scale=0.3)
    windows = [c["short_conv"] for c in model.init_cache(2)["stack"]]
    assert [w.shape for w in windows] == [(2, 2, config.emb_dim)] * config.num_layers
    check_equal(model, lra.tasks.get("listops").vocab_size)


@pytest.mark.parametrize("name", ["transformer", "local"])
def test_decoding_after_a_fused_prefill(name):
    """attention_impl=flash (issue 69): the prompt goes through the fused path (on CPU its
    chunked form), the steps through the kv cache; together they equal the parallel
    dense forward of the same weights."""
    config = config_for(name, attention_impl="flash")
    fused = train.build_model(config, lra.tasks.get("listops"))
    dense = model_for(name)
    nnx.update(fused, nnx.state(dense))
    vocab = lra.tasks.get("listops").vocab_size
    toks = tokens(len(PROMPT_LENS), MAX_LEN, vocab)
    parallel = np.asarray(apply(dense, toks, None))
    stepped, reached = decode(fused, toks, PROMPT_LENS)
    np.testing.assert_allclose(stepped[reached], parallel[reached], rtol=RTOL, atol=ATOL)


def test_the_check_fails_on_a_wrong_cache():
    """Not vacuous: a cache that forgets the first prompt token changes the steps."""
    model = model_for("transformer")
    toks = tokens(len(PROMPT_LENS), MAX_LEN, lra.tasks.get("listops").vocab_size)
    parallel = np.asarray(model(toks, None, deterministic=True))
    original = decoding.kv_fill

    def forgetful(mixer, cache, x, pos):
        cache = original(mixer, cache, x, pos)
        return {**cache, "k": cache["k"].at[:, :, 0].set(0.0)}

    decoding.kv_fill = forgetful
    try:
        stepped, reached = decode(model, toks, PROMPT_LENS)
    finally:
        decoding.kv_fill = original
    assert not np.allclose(stepped[reached], parallel[reached], rtol=RTOL, atol=ATOL)


def test_window_cache_is_the_window():
    """local's cache holds window + 1 slots, not max_len: memory O(window)."""
    model = model_for("local")
    cache = model.init_cache(2)
    window = config_for("local").model_hparams.window
    assert window + 1 < MAX_LEN
    assert all(c["k"].shape[2] == window + 1 for c in cache["stack"])
    full = model_for("transformer").init_cache(2)
    assert all(c["k"].shape[2] == MAX_LEN for c in full["stack"])


def test_a_soft_span_cache_holds_the_largest_span():
    """adaptive_span with max_span 5 and ramp 2: 8 slots (ramp + span + 1), and decoding
    through the ring still equals the parallel form."""
    model = model_for("adaptive_span", max_span=5, ramp=2.0, span_init=0.6)
    assert all(c["k"].shape[2] == 8 for c in model.init_cache(1)["stack"])
    check_equal(model, lra.tasks.get("listops").vocab_size)


def test_a_model_that_cannot_decode_says_why():
    config = listops.get_config("model=transformer,runlocal,pretrain")  # mlm, bidirectional
    model = train.build_model(config, lra.tasks.get("listops"))
    with pytest.raises(decoding.DecodingError, match="next token"):
        model.init_cache(1)
    config = config_for("transformer")
    config.causal = False
    config.objective = "classify"
    classifier = train.build_model(config, lra.tasks.get("listops"))
    with pytest.raises(decoding.DecodingError, match="causal=False"):
        classifier.encoder.init_cache(1)


@pytest.mark.parametrize("name", ["fox", "moba", "path"])
def test_own_decoding_refuses_the_bidirectional_form(name):
    mixer = registry.build(name, dim=16, num_heads=2, max_len=16, causal=False,
                           rngs=nnx.Rngs(0))
    with pytest.raises(decoding.DecodingError, match=f"{name} was built with causal=False"):
        mixer.init_cache(1, 8)


@pytest.mark.parametrize("name", ["fox", "moba", "nsa", "path"])
def test_flash_forms_decode_as_their_parallel_form(name):
    """attention_impl=flash (the O(L)-memory parallel form, docs/precision_and_kernels.md)
    serves the parallel forward and the prefill; the steps equal it."""
    model = randomize_params(train.build_model(config_for(name, attention_impl="flash"),
                                               lra.tasks.get("listops")), seed=5, scale=0.3)
    assert {m.attention_impl for _, m in model.iter_modules()
            if hasattr(m, "attention_impl") and hasattr(m, "init_cache")} == {"flash"}
    check_equal(model, lra.tasks.get("listops").vocab_size)


@pytest.mark.parametrize("scheme", ["zoology", "grazzi"])
def test_a_tied_head_decodes_as_its_parallel_form(scheme):
    """config.tie_head (the logits are the token table's transpose, configs/scaffold.py
    `tie_head`) under a benchmark's initialisation (config.init_scheme): prefill and steps
    read the same table as the parallel forward; the model has no lm_head parameters."""
    config = config_for("gla", tie_head=True, init_scheme=scheme)
    model = train.build_model(config, lra.tasks.get("listops"))
    assert model.lm_head is None
    model = randomize_params(model, seed=7, scale=0.3)
    check_equal(model, lra.tasks.get("listops").vocab_size)
