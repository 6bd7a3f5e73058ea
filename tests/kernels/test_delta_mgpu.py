"""The chunked delta rule (deltanet, gated_deltanet) as Mosaic GPU kernels
(models/kernels/delta_mgpu.py), checked on this CPU: the forward (o, S_L, the chunks' start
states) and the backward in the Mosaic GPU interpreter (race detection on) against the
Triton passes on the same padded rows; through `delta_rule(gpu_form="mosaic")` against the
XLA chunked form with every gradient, a wide value head cut into blocks; the fallbacks;
through configs/listops.py (`attention_impl=pallas_mosaic`); the bf16 training step and
each pass lowered for sm_90. Needs JAX's Mosaic GPU interpreter (0.12: CI's newest-JAX
stage). Nothing here runs on a GPU."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import delta
from models.kernels import delta_mgpu, mgpu_common
from tests.kernels import lowering
from tests.kernels.interpreters import (assert_pallas_mosaic_equals_pallas, gpu_races_found,
                                        mosaic_calls_in_train_step, needs_mgpu,
                                        reset_gpu_interpreter)

dr = importlib.import_module("models.kernels.delta_rule")


@pytest.fixture(autouse=True)
def _fresh():
    reset_gpu_interpreter()
    yield


def _inputs(length, dv=64, seed=0, dtype=jnp.bfloat16, gated=True):
    """L2-normalised q, k (as the layer feeds them), normal v, beta in (0, 2) (the
    negative-eigenvalue range), log alpha = logsigmoid(3 + normal) (None: deltanet) and
    cotangents of o and S_L."""
    rng = np.random.default_rng(seed)
    normal = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32))  # noqa: E731
    q, k = (delta.l2_normalise(normal(2, 2, length, 64)).astype(dtype) for _ in range(2))
    v = normal(2, 2, length, dv).astype(dtype)
    beta = 2.0 * jax.nn.sigmoid(normal(2, 2, length))
    log_a = jax.nn.log_sigmoid(3.0 + normal(2, 2, length)) if gated else None
    return (q, k, v, beta, log_a), (normal(2, 2, length, dv).astype(dtype),
                                    0.1 * normal(2, 2, dv, 64))


def _close(got, ref, tol, names):
    for name, a, r in zip(names, got, ref):
        assert a.shape == r.shape, (name, a.shape, r.shape)
        a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
        assert np.max(np.abs(a - r)) <= tol * np.max(np.abs(r)), (
            name, float(np.max(np.abs(a - r)) / np.max(np.abs(r))))


@needs_mgpu
@pytest.mark.parametrize("gated, dtype", [(True, jnp.bfloat16), (False, jnp.float16)],
                         ids=["gated-bf16", "deltanet-fp16"])
def test_passes_in_the_interpreter_equal_the_triton_passes(gated, dtype):
    """Both kernels on padded rows (L 150: two chunks and a padded third) against the
    Triton passes: o within one bf16 rounding, the start states, S_L and every gradient
    within 5e-3 of their scale (measured <= 2e-3); no races."""
    (q, k, v, beta, log_a), (g, ds) = _inputs(150, gated=gated, dtype=dtype)
    log_a = jnp.zeros(beta.shape) if log_a is None else log_a
    cfg = dr.make_config(q, k, v, beta, log_a, chunk_size=64, platform="gpu", interpret=True)
    rows = dr._padded(q, k, v, beta, log_a, cfg)
    o, s_last, states = delta_mgpu.forward(*rows[:3], rows[3][..., 0], rows[4][..., 0],
                                           states=True, interpret=True)
    grads = delta_mgpu.backward(*rows[:3], rows[3][..., 0], rows[4][..., 0],
                                dr._pad(g, cfg), states, ds, interpret=True)
    assert not gpu_races_found()
    ro, r_states, r_last = dr._run(dr._FORWARD_STATES, rows, (), None,
                                   ((64, v.dtype),), 1, cfg)
    _close((o,), (ro,), 8e-3, ["o"])
    _close((states, s_last), (r_states, r_last), 5e-3, ["states", "S_L"])
    ref = dr._run(dr._BACKWARD, rows + (dr._pad(g, cfg),), (r_states,), ds,
                  ((64, jnp.float32),) * 3 + ((1, jnp.float32),) * 2, 0, cfg)[:5]
    _close([x.reshape(r.shape) for x, r in zip(grads, ref)], ref, 5e-3,
           ["dq", "dk", "dv", "dbeta", "dlog_alpha"])


@needs_mgpu
def test_gpu_form_mosaic_against_the_xla_chunked_form_with_a_wide_value_head(capfd):
    """`delta_rule(gpu_form="mosaic")` with gated_deltanet's value heads twice the key
    heads (two value blocks of 64), L 100, against `backend="xla"` (delta.py's chunked
    form): o, S_L and the gradients of q, k, v, beta, log alpha within the bf16 tolerance
    of test_delta_rule.py."""
    args, cot = _inputs(100, dv=128, seed=1)

    def run(**kw):
        out, vjp = jax.vjp(lambda *xs: dr.delta_rule(*xs, chunk_size=64, **kw), *args)
        return (*out, *vjp(cot))

    with mgpu_common.interpreted():
        got = run(backend="pallas", gpu_form="mosaic")
    assert not gpu_races_found()
    assert "delta rule: Mosaic GPU kernels (interpreted)" in capfd.readouterr().err
    with jax.default_matmul_precision("highest"):
        ref = run(backend="xla")
    _close(got, ref, 3e-2, ["o", "S_L", "dq", "dk", "dv", "dbeta", "dlog_alpha"])


def test_fallbacks_say_why_and_run_the_triton_form(capfd):
    """float32 inputs and a key dim of 32 keep the Triton form, said once each (under a JAX
    without the Mosaic GPU API, that is the reason); a bad gpu_form is refused."""
    for dtype, dk in ((jnp.float32, 64), (jnp.bfloat16, 32)):
        assert delta_mgpu.supports(dtype, dk, 64) is not None
        args, _ = _inputs(20, dtype=dtype)
        args = (args[0][..., :dk], args[1][..., :dk]) + args[2:]
        with mgpu_common.interpreted():
            got = dr.delta_rule(*args, gpu_form="mosaic")
            ref = dr.delta_rule(*args, gpu_form="triton")
        np.testing.assert_array_equal(got[0], ref[0])
    err = capfd.readouterr().err
    if mgpu_common.available():
        assert "wgmma takes 16-bit operands, got float32" in err
        assert "take a key dim of 64" in err
    with pytest.raises(ValueError, match="gpu_form must be one of triton, mosaic"):
        dr.delta_rule(*_inputs(20)[0], gpu_form="cutlass")


@needs_mgpu
@pytest.mark.parametrize("model", ["deltanet", "gated_deltanet"])
def test_pallas_mosaic_equals_pallas_through_the_task_config(model):
    """configs/listops.py:model=<model>,runlocal,pretrain,causal in bfloat16 (head dim 64;
    gated_deltanet's values 128: two blocks): the loss and every gradient under
    attention_impl=pallas_mosaic against attention_impl=pallas."""
    assert_pallas_mosaic_equals_pallas(f"model={model},runlocal,pretrain,causal", head_dim=64)


@needs_mgpu
def test_train_step_lowered_for_cuda_holds_the_mosaic_gpu_kernels():
    """The bf16 training step of configs/listops.py:model=gated_deltanet,runlocal,
    attention_impl=pallas_mosaic (bidirectional: two scans a layer; values 128 wide: two
    blocks a scan) lowered for sm_90: a forward and a backward call per block, no Triton."""
    mosaic, triton, layers = mosaic_calls_in_train_step(
        "model=gated_deltanet,runlocal,attention_impl=pallas_mosaic", head_dim=64)
    assert (mosaic, triton) == (2 * 2 * 2 * layers, 0)


@needs_mgpu
def test_each_pass_lowers_for_sm90():
    """Mosaic GPU's layout inference runs at lowering, not in the interpreter: both
    kernels lowered for an abstract H100, one Mosaic GPU call each."""
    q = jax.ShapeDtypeStruct((1, 2, 128, 64), jnp.bfloat16)
    vec = jax.ShapeDtypeStruct((1, 2, 128), jnp.float32)
    states = jax.ShapeDtypeStruct((1, 2, 2, 64, 64), jnp.float32)
    last = jax.ShapeDtypeStruct((1, 2, 64, 64), jnp.float32)
    fwd = lambda q, vec: delta_mgpu.forward(q, q, q, vec, vec, states=True)  # noqa: E731
    bwd = lambda q, vec, st, ds: delta_mgpu.backward(q, q, q, vec, vec, q, st, ds)  # noqa: E731
    for fn, args in ((fwd, (q, vec)), (bwd, (q, vec, states, last))):
        found = lowering.custom_calls(lowering.for_cuda(fn, *args))
        assert sum(c.startswith(lowering.MOSAIC_GPU) for c in found) == 1, found
