"""attention_impl=flash (models/kernels/flash_attention.py): the chunked CPU form against
the dense softmax (forward and gradients, padding, causal, each mask family, dropout,
bf16), the splash kernel in the Pallas TPU interpreter, the same through the task configs,
and the GPU and TPU forms by lowering the whole training step from this host."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lra.tasks
from configs import listops
from lra import train
from lra.errors import ConfigError
from models import masks
from models.attention.dense import dot_product_attention
from models.kernels import flash_attention as fa
from models.kernels.block_sparse_tiles import dropout_multiplier
from models.kernels.chunked_attention import chunked_attention
from tests.kernels import lowering
from tests.models.helpers import randomize_params

PATTERNS = {"all": masks.all_(), "causal": masks.causal(), "local": masks.local(5),
            "causal_band": masks.local(6, after=0) & masks.causal(),
            "strided_or_local": masks.strided(4) | masks.local(3),
            "per_head": masks.per_head([masks.local(2), masks.causal()])}


@pytest.fixture(autouse=True)
def _full_float32_matmuls():
    # Both sides at full float32: on an Ampere-or-later GPU JAX's default float32 matmul is
    # TF32 (10-bit mantissa), which puts the dense reference and the chunked form ~3e-4
    # apart (results/gpu/h200/kernels_tests.md, the H200 run); on CPU this changes nothing.
    with jax.default_matmul_precision("highest"):
        yield


def _qkv(b=2, h=2, length=77, k=16, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal((b, h, length, k)), dtype) for _ in range(3))


def _dense(q, k, v, pattern, valid, dropout=None):
    allowed = pattern.dense(q.shape[2], k.shape[2])
    mask = (allowed[None, None] if allowed.ndim == 2 else allowed[None]) & valid[:, None, None]
    return dot_product_attention(q, k, v, mask=mask, dropout_fn=dropout)


def _max_err(a, b):
    return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))


@pytest.mark.parametrize("name", list(PATTERNS))
def test_chunked_equals_dense_forward_and_gradients(name):
    pattern = PATTERNS[name]
    q, k, v = _qkv()
    valid = jnp.arange(77)[None] < jnp.array([[50], [77]])  # a right-padded row
    # Chunks that do not divide the length: the padded tail of each chunked axis.
    chunked = lambda q, k, v: chunked_attention(q, k, v, pattern, valid_BxKv=valid,
                                                chunk_q=16, chunk_k=24)
    dense = lambda q, k, v: _dense(q, k, v, pattern, valid)
    assert _max_err(chunked(q, k, v), dense(q, k, v)) < 2e-6
    weights = jnp.asarray(np.random.default_rng(1).standard_normal((2, 2, 77, 16)))
    loss = lambda f: lambda *a: jnp.sum(f(*a) * weights)
    for g1, g2 in zip(jax.grad(loss(chunked), (0, 1, 2))(q, k, v),
                      jax.grad(loss(dense), (0, 1, 2))(q, k, v)):
        assert _max_err(g1, g2) < 1e-5


def test_chunked_rows_without_keys_are_zero_with_zero_gradients():
    q, k, v = _qkv(length=40)
    valid = jnp.zeros((2, 40), bool).at[1].set(True)  # row 0 has no key at all
    f = lambda q, k, v: chunked_attention(q, k, v, masks.local(2), valid_BxKv=valid,
                                          chunk_q=8, chunk_k=8)
    out = f(q, k, v)
    assert float(jnp.abs(out[0]).max()) == 0.0
    grads = jax.grad(lambda *a: jnp.sum(f(*a) ** 2), (0, 1, 2))(q, k, v)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)
    assert float(jnp.abs(grads[0][0]).max()) == 0.0


def test_chunked_dropout_is_the_hashed_mask_of_the_kernels():
    """With dropout the chunked form drops exactly the weights `dropout_multiplier` says,
    in the forward and in the backward pass."""
    b, h, length, rate, seed = 2, 2, 50, 0.3, jnp.int32(7)
    q, k, v = _qkv(b, h, length)
    valid = jnp.arange(length)[None] < jnp.array([[length], [31]])
    bh = (jnp.arange(b)[:, None] * h + jnp.arange(h))[:, :, None, None]
    keep = dropout_multiplier(seed, bh, jnp.arange(length)[None, None, :, None],
                              jnp.arange(length)[None, None, None, :], rate)
    chunked = lambda q, k, v: chunked_attention(q, k, v, masks.causal(), valid_BxKv=valid,
                                                dropout_rate=rate, dropout_seed=seed,
                                                chunk_q=16, chunk_k=16)
    dense = lambda q, k, v: _dense(q, k, v, masks.causal(), valid, lambda w: w * keep)
    assert _max_err(chunked(q, k, v), dense(q, k, v)) < 5e-6
    loss = lambda f: lambda *a: jnp.sum(f(*a) ** 2)
    for g1, g2 in zip(jax.grad(loss(chunked), (0, 1, 2))(q, k, v),
                      jax.grad(loss(dense), (0, 1, 2))(q, k, v)):
        assert _max_err(g1, g2) < 5e-5


def test_chunked_bfloat16_within_bf16_of_float32():
    q, k, v = _qkv(length=64, k=32)
    valid = jnp.ones((2, 64), bool)
    ref = _dense(q, k, v, masks.causal(), valid)
    b16 = chunked_attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), masks.causal(),
                            valid_BxKv=valid, chunk_q=16, chunk_k=16)
    assert b16.dtype == jnp.bfloat16
    assert _max_err(b16, ref) / float(jnp.abs(ref).max()) < 2e-2


@pytest.mark.parametrize("name", ["causal", "strided_or_local"])
def test_splash_in_the_tpu_interpreter_equals_dense(name):
    """The TPU form (splash, interpreted): padding as segment ids, the length padded to
    128, 1/sqrt(K) on the queries. Rows with a key only (splash averages a keyless row)."""
    pattern = PATTERNS[name]
    q, k, v = _qkv(length=150, k=32)
    valid = jnp.arange(150)[None] < jnp.array([[100], [150]])
    splash = lambda q, k, v: fa._splash(q, k, v, pattern=pattern, padding_mask=valid,
                                        dropout_rate=0.0, dropout_seed=None, interpret=True)
    dense = lambda q, k, v: _dense(q, k, v, pattern, valid)
    has_key = jnp.any(pattern.dense(150, 150)[None] & valid[:, None], -1)[:, None, :, None]
    assert _max_err(jnp.where(has_key, splash(q, k, v), 0), dense(q, k, v)) < 2e-6
    loss = lambda f: lambda *a: jnp.sum(jnp.where(has_key, f(*a), 0) ** 2)
    for g1, g2 in zip(jax.grad(loss(splash), (0, 1, 2))(q, k, v),
                      jax.grad(loss(dense), (0, 1, 2))(q, k, v)):
        assert _max_err(g1, g2) < 2e-5


def test_cudnn_and_splash_masks_of_the_patterns():
    assert fa.cudnn_mask(masks.all_()) == (False, None)
    assert fa.cudnn_mask(masks.all_() & masks.causal()) == (True, None)
    assert fa.cudnn_mask(masks.local(8, after=0) & masks.causal()) == (True, 8)
    assert fa.cudnn_mask(masks.local(8)) is None  # cuDNN has no right window: a bias
    assert fa.cudnn_mask(masks.strided(4)) is None
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    kinds = {name: type(fa.splash_mask(p, 128, 2).masks[0]).__name__
             for name, p in PATTERNS.items() if name != "per_head"}
    assert kinds == {"all": "FullMask", "causal": "CausalMask", "local": "LocalMask",
                     "causal_band": "LocalMask", "strided_or_local": "NumpyMask"}
    local = fa.splash_mask(masks.local(5), 128, 1).masks[0]
    assert np.array_equal(local[:, :], masks.local(5).dense_np(128, 128))
    per_head = fa.splash_mask(PATTERNS["per_head"], 128, 2)
    assert isinstance(per_head, sm.MultiHeadMask) and len(per_head.masks) == 2


def _config(arg, length=64):
    config = listops.get_config(arg)
    config.max_length, config.batch_size = length, 2
    return config


def _loss_and_grads(model, tokens, mask):
    def loss(model):
        out = model(tokens, mask, deterministic=True)
        return jnp.sum(out.astype(jnp.float32) ** 2)
    return nnx.value_and_grad(loss)(model)


@pytest.mark.parametrize("arg", ["model=transformer,runlocal",
                                 "model=transformer,runlocal,pretrain,causal",
                                 "model=local,runlocal", "model=bigbird,runlocal",
                                 "model=fox,runlocal", "model=fox,runlocal,pretrain,causal",
                                 "model=moba,runlocal", "model=moba,runlocal,pretrain,causal",
                                 "model=nsa,runlocal", "model=nsa,runlocal,pretrain,causal",
                                 "model=path,runlocal", "model=path,runlocal,pretrain,causal"])
def test_flash_equals_dense_through_the_task_config(arg):
    """configs/listops.py with attention_impl=flash against the same weights under dense:
    the model's output and every parameter's gradient (CLS prefix, padding, causal LM,
    the local and BigBird patterns, fox's forget bias both ways and causal; moba's and
    nsa's chosen blocks and path's transforms, each O(L)-memory form against its dense
    one)."""
    task = lra.tasks.get("listops")
    dense = randomize_params(train.build_model(_config(arg), task), seed=2, scale=0.3)
    flash = train.build_model(_config(arg + ",attention_impl=flash"), task)
    assert _config(arg + ",attention_impl=flash").attention_impl == "flash"
    nnx.update(flash, nnx.state(dense, nnx.Param))
    tokens = jax.random.randint(jax.random.key(0), (2, 64), 1, task.vocab_size)
    mask = jnp.arange(64)[None] < jnp.array([[64], [37]])
    (l1, g1), (l2, g2) = (_loss_and_grads(m, tokens, mask) for m in (dense, flash))
    assert abs(float(l1 - l2)) <= 1e-5 * abs(float(l1))
    g1, g2 = (jax.tree.leaves(nnx.state(g, nnx.Param)) for g in (g1, g2))
    scale = max(float(jnp.abs(a).max()) for a in g1)
    # Relative per parameter, and absolute at the gradients' scale for those whose exact
    # gradient is 0 (the key bias: softmax does not see a shift shared by all keys).
    for a, b in zip(g1, g2):
        assert _max_err(a, b) <= 1e-4 * float(jnp.abs(a).max()) + 1e-6 * scale


def test_config_argument_refuses_an_unknown_impl():
    with pytest.raises(ConfigError, match="attention_impl='flsh'"):
        listops.get_config("model=transformer,attention_impl=flsh")


def _train_step(arg: str, dtype: str, dropout: float = 0.0, length: int = 64):
    config = _config(arg + ",attention_impl=flash", length)
    config.dtype, config.attention_dropout_rate = dtype, dropout
    return lowering.train_step(config)


@pytest.fixture
def cudnn_9_10(monkeypatch):
    """This host has no CUDA libraries: JAX's cuDNN version and compute-capability checks
    answer as for cuDNN 9.10 on an H100 (sm_90), so that the program can be lowered."""
    from jax._src.cudnn import fused_attention_stablehlo as fas
    monkeypatch.setattr(fas, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fas, "check_compute_capability", lambda capability: True)
    fa.cudnn_missing.cache_clear()
    yield
    fa.cudnn_missing.cache_clear()


@pytest.mark.parametrize("arg, bias", [("model=transformer,runlocal", False),
                                       ("model=local,runlocal", True)])
def test_train_step_lowered_for_cuda_holds_cudnn_flash_attention(cudnn_9_10, arg, bias):
    step, state, batch, layers = _train_step(arg, "bfloat16")
    calls = collections.Counter(lowering.custom_calls(lowering.for_cuda(step, state, batch)))
    fwd = "__cudnn$fmhaScaleBiasSoftmax" if bias else "__cudnn$fmhaSoftmax"
    assert calls[fwd] == layers and calls[fwd + "Backward"] == layers, calls
    assert lowering.MOSAIC_TPU not in calls


def test_float32_lowered_for_cuda_takes_the_chunked_form(cudnn_9_10):
    """cuDNN takes fp16/bf16 only: a float32 program holds no cuDNN call (not silently
    computed in bf16)."""
    step, state, batch, _ = _train_step("model=transformer,runlocal", "float32")
    calls = lowering.custom_calls(lowering.for_cuda(step, state, batch))
    assert not any(c.startswith("__cudnn$fmha") for c in calls), calls


def test_train_step_exported_for_tpu_holds_splash():
    step, state, batch, layers = _train_step("model=transformer,runlocal", "bfloat16")
    calls = collections.Counter(lowering.custom_calls(lowering.for_tpu(step, state, batch)))
    # splash: a forward, a dq and a dkv kernel per layer.
    assert calls[lowering.MOSAIC_TPU] == 3 * layers, calls


def test_dropout_has_no_tpu_form_and_runs_on_cpu(monkeypatch):
    step, state, batch, _ = _train_step("model=transformer,runlocal", "float32", dropout=0.1)
    with pytest.raises(Exception, match="platform"):  # JAX: no branch for tpu
        lowering.for_tpu(step, state, batch)
    jax.jit(step).trace(state, batch).lower()  # the CPU (chunked) form takes it
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # as run on a TPU
    with pytest.raises(fa.FlashError, match="splash attention has no attention-weight "
                                            "dropout .*attention_dropout_rate=0,"):
        jax.jit(_train_step("model=transformer,runlocal", "float32", dropout=0.1)[0]).trace(
            state, batch)
