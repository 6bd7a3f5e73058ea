"""The delta-rule kernels (models/kernels/delta_rule.py) against models/attention/delta.py's
chunked form (`chunk_delta_rule`) and recurrence (`delta_rule_reference`): outputs, final
state and gradients (q, k, v, beta, log alpha: the Pallas backward pass), gated and not,
float32 and bfloat16, a length that is not a multiple of the chunk; the Triton and Mosaic
forms lowered for a GPU and exported for a TPU (lowered only); the ListOps training step
under attention_impl=pallas against dense (its lowering with the kernels, per layer:
tests/test_model_lowering.py). On a GPU (the GPU suite's kernel_tests stage) the Triton
form runs compiled.

On CPU the Triton flavour runs in Pallas's interpreter (interpret=True), the Mosaic flavour
in Mosaic's TPU interpreter (`pltpu.InterpretParams`)."""
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.experimental.pallas import tpu as pltpu

from models.attention import delta
from tests.kernels import lowering
from tests.kernels.interpreters import TPU_INTERPRETER

dr = importlib.import_module("models.kernels.delta_rule")

IMPLS = {"xla": ("xla", None), "triton": ("pallas", "gpu"), "mosaic": ("pallas", "tpu")}
# Relative to the reference's largest magnitude. float32: the same algorithm up to the
# summation order (measured <= 1e-6). bfloat16: inputs and the big matmuls' operands (q, k,
# v, W, S, V_new) rounded to 8 bits, float32 accumulation and UT transform (measured
# <= 6.8e-3 on these inputs, outputs and gradients alike).
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 3e-2}
B, H, L, K, V = 2, 2, 37, 8, 12  # L: two chunks of 16 and a ragged third
NAMES = ("o", "s", "dq", "dk", "dv", "dbeta", "dlog_alpha")


@pytest.fixture(autouse=True)
def _full_float32_matmuls():
    # Every reference at full float32, as the kernels compute float32: on an
    # Ampere-or-later GPU JAX's default float32 matmul is TF32 (10-bit mantissa), 1e-4 to
    # 1e-3 relative errors (results/gpu/NOTES.md), against tolerances of 2e-5 and the
    # training step's 1e-5; on CPU this changes nothing.
    with jax.default_matmul_precision("highest"):
        yield


def _inputs(seed):
    """L2-normalised q, k (as the layer feeds them), normal v, beta in (0, 2) (fla's
    allow_neg_eigval range), log alpha = logsigmoid(3 x normal) and cotangents for o and
    S_L. numpy draws (jax.random compiles per shape)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32))  # noqa: E731
    q, k = delta.l2_normalise(normal(B, H, L, K)), delta.l2_normalise(normal(B, H, L, K))
    beta = 2.0 * jax.nn.sigmoid(normal(B, H, L))
    log_alpha = jax.nn.log_sigmoid(3.0 * normal(B, H, L))
    return (q, k, normal(B, H, L, V), beta, log_alpha), (normal(B, H, L, V),
                                                         normal(B, H, V, K))


def _value_and_grads(fn, args, cotangents, gated):
    """(o, S_L) and the VJP, one program, compiled without backend optimisation on CPU."""
    def run(args, cotangents):
        if not gated:
            args = args[:4]
        out, vjp = jax.vjp(fn, *args)
        grads = vjp(tuple(c.astype(o.dtype) for c, o in zip(cotangents, out)))
        return tuple(out) + tuple(grads) + ((jnp.zeros(()),) if not gated else ())

    return jax.jit(run).lower(args, cotangents).compile(
        {"xla_backend_optimization_level": 0})(args, cotangents)


@functools.lru_cache(maxsize=None)
def _references(gated):
    """delta.py's chunked form (chunk 5) and its recurrence, each with its gradients."""
    args, cot = _inputs(1)
    with jax.default_matmul_precision("highest"):
        chunked = _value_and_grads(functools.partial(delta.chunk_delta_rule, chunk_size=5),
                                   args, cot, gated)
        recurrent = _value_and_grads(delta.delta_rule_reference, args, cot, gated)
    return chunked, recurrent


def _assert_close(actual, expected, dtype, what):
    expected = np.asarray(expected, np.float32)
    actual = np.asarray(jnp.asarray(actual, jnp.float32))
    assert actual.shape == expected.shape, what
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    scale = max(float(np.abs(expected).max()), 1e-6)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE[dtype] * scale,
                               err_msg=what)


def _cases():
    """float32: Triton gated and not, XLA and Mosaic one each (the others under slow);
    bfloat16: Triton gated, Mosaic plain."""
    for impl in IMPLS:
        for gated in (False, True):
            default = impl == "triton" or gated == (impl == "xla")
            yield pytest.param(impl, gated, jnp.float32,
                               id=f"{impl}-{'gated' if gated else 'plain'}-float32",
                               marks=[] if default else [pytest.mark.slow])
    yield pytest.param("triton", True, jnp.bfloat16, id="triton-gated-bfloat16")
    yield pytest.param("mosaic", False, jnp.bfloat16, id="mosaic-plain-bfloat16")


@pytest.mark.parametrize("impl,gated,dtype", list(_cases()))
def test_equals_chunked_and_recurrent_forms(impl, gated, dtype):
    backend, platform = IMPLS[impl]
    (q, k, v, beta, log_alpha), cot = _inputs(1)
    args = (q.astype(dtype), k.astype(dtype), v.astype(dtype), beta, log_alpha)
    fn = functools.partial(dr.delta_rule, backend=backend, platform=platform, chunk_size=16,
                           interpret=TPU_INTERPRETER if platform == "tpu" else None)
    got = _value_and_grads(fn, args, cot, gated)
    assert got[0].dtype == dtype and got[1].dtype == jnp.float32
    assert [g.dtype for g in got[2:5]] == [dtype] * 3
    for ref in _references(gated):
        for name, a, e in zip(NAMES, got, ref):
            _assert_close(a, e, dtype, name)


def test_default_chunk_and_short_rows():
    """The default chunk (64, capped at 16 for short rows) on a length of 1 and of 70
    (one full chunk and a ragged one), Triton, gated, against the recurrence."""
    (q, k, v, beta, log_alpha), _ = _inputs(2)
    for length in (1, 70):
        if length > L:
            q, k, v, beta, log_alpha = (jnp.concatenate([x, x], axis=2)
                                        for x in (q, k, v, beta, log_alpha))
        xs = tuple(x[:, :, :length] for x in (q, k, v, beta, log_alpha))
        o, s = jax.jit(functools.partial(dr.delta_rule, platform="gpu"))(*xs)
        ref_o, ref_s = delta.delta_rule_reference(*xs)
        _assert_close(o, ref_o, jnp.float32, f"o at L={length}")
        _assert_close(s, ref_s, jnp.float32, f"s at L={length}")


def test_keys_alike_stay_exact():
    """Every key in a chunk the same and beta near 1: the UT transform's inverse is where
    a power series (Neumann) would cancel catastrophically; the blocked inverse stays
    exact at the 64 chunk."""
    rng = np.random.default_rng(3)
    k = jnp.broadcast_to(delta.l2_normalise(jnp.asarray(rng.standard_normal((1, 1, 1, 16)),
                                                        jnp.float32)), (1, 1, 64, 16))
    k = delta.l2_normalise(k + 1e-3 * jnp.asarray(rng.standard_normal(k.shape), jnp.float32))
    q, v = k[..., ::-1], jnp.asarray(rng.standard_normal((1, 1, 64, 16)), jnp.float32)
    beta = jnp.full((1, 1, 64), 0.99, jnp.float32)
    o, s = jax.jit(functools.partial(dr.delta_rule, platform="gpu", chunk_size=64))(
        q, k, v, beta)
    ref_o, ref_s = delta.delta_rule_reference(q, k, v, beta)
    _assert_close(o, ref_o, jnp.float32, "o")
    _assert_close(s, ref_s, jnp.float32, "s")


def _forward_and_backward(platform, gated):
    def fn(q, k, v, beta, log_alpha, do, ds):
        f = functools.partial(dr.delta_rule, platform=platform, interpret=False)
        args = (q, k, v, beta) + ((log_alpha,) if gated else ())
        out, vjp = jax.vjp(f, *args)
        return out, vjp((do, ds))
    return fn


def _lowering_args(dtype):
    q = jax.ShapeDtypeStruct((2, 4, 300, 64), dtype)
    v = jax.ShapeDtypeStruct((2, 4, 300, 32), dtype)
    beta = jax.ShapeDtypeStruct((2, 4, 300), jnp.float32)
    return q, q, v, beta, beta, v, jax.ShapeDtypeStruct((2, 4, 32, 64), jnp.float32)


LOWERING = pytest.mark.parametrize("dtype,gated", [(jnp.float32, True), (jnp.bfloat16, False)],
                                   ids=["f32-gated", "bf16-plain"])


@LOWERING
def test_triton_kernel_lowers_for_cuda(dtype, gated):
    """Forward and backward: two Triton calls."""
    calls = lowering.custom_calls(lowering.for_cuda(_forward_and_backward("gpu", gated),
                                                    *_lowering_args(dtype)))
    assert calls.count(lowering.TRITON) == 2 and lowering.MOSAIC_TPU not in calls, calls


@LOWERING
def test_mosaic_kernel_exports_for_tpu(dtype, gated):
    calls = lowering.custom_calls(lowering.for_tpu(_forward_and_backward("tpu", gated),
                                                   *_lowering_args(dtype)))
    assert calls.count(lowering.MOSAIC_TPU) == 2 and lowering.TRITON not in calls, calls


def test_bad_arguments_raise():
    q = jnp.ones((1, 1, 8, 4))
    beta = jnp.ones((1, 1, 8))
    with pytest.raises(ValueError, match="backend"):
        dr.delta_rule(q, q, q, beta, backend="cuda")
    with pytest.raises(ValueError, match="power of two"):
        dr.delta_rule(q, q, q, beta, platform="tpu", chunk_size=24)
    with pytest.raises(ValueError, match="beta"):
        dr.delta_rule(q, q, q, beta[..., None])
    with pytest.raises(ValueError, match="InterpretParams"):
        dr.delta_rule(q, q, q, beta, platform="gpu", interpret=pltpu.InterpretParams())
    with pytest.raises(ValueError, match="q and k"):
        dr.delta_rule(q, q[..., :2], q, beta)


def _one_train_step(model: str, impl: str):
    """One training step of `configs/listops.py:model=<model>,runlocal` with
    --config.attention_impl=<impl>, at 24 tokens and a batch of 2 (one row padded), as
    lra.train builds it: the metrics, the updated parameters and the step's jaxpr."""
    from flax import nnx

    import lra.tasks
    from configs import listops
    from lra import train
    from lra.training import objectives, optim

    config = listops.get_config(f"model={model},runlocal")
    config.max_length, config.batch_size, config.attention_impl = 24, 2, impl
    task = lra.tasks.get("listops")
    schedule = optim.learning_rate_schedule(config)
    tx = optim.make_optimizer(config, schedule)
    built = train.build_model(config, task)
    assert built.encoder.stack.blocks[0].mixer.attention_impl == impl
    graphdef, params, rest = nnx.split(built, nnx.Param, ...)
    state = {"step": jnp.int32(0), "params": params, "rest": rest,
             "opt_state": tx.init(params)}
    rng = np.random.default_rng(7)
    batch = {"inputs": jnp.asarray(rng.integers(1, task.vocab_size, (2, 24)), jnp.int32),
             "mask": jnp.arange(24)[None] < jnp.array([[24], [15]]),
             "targets": jnp.asarray(rng.integers(0, task.num_classes, (2,)), jnp.int32)}
    train_step, _ = objectives.make_steps(graphdef, tx, schedule, task.num_classes, config,
                                          task.vocab_size)
    traced = jax.jit(train_step).trace(state, batch)
    new_state, metrics = traced.lower().compile({"xla_backend_optimization_level": 0})(
        state, batch)
    return metrics, new_state["params"], str(traced.jaxpr)


@pytest.mark.parametrize("model", ["deltanet",
                                   pytest.param("gated_deltanet", marks=pytest.mark.slow)])
def test_train_step_through_the_config_equals_dense(model):
    """The user's path, `configs/listops.py:model=<model>,runlocal` with
    --config.attention_impl=pallas (bidirectional: both scans through the kernel,
    interpreted on CPU): the same loss, gradient norm and updated parameters as dense."""
    dense, dense_params, dense_jaxpr = _one_train_step(model, "dense")
    got, got_params, jaxpr = _one_train_step(model, "pallas")
    assert "delta_rule_forward" in jaxpr and "delta_rule_forward" not in dense_jaxpr
    for name in ("loss", "grad_norm", "accuracy"):
        np.testing.assert_allclose(got[name], dense[name], rtol=1e-5, err_msg=name)
    for a, e in zip(jax.tree.leaves(got_params), jax.tree.leaves(dense_params)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
