"""Chunked linear attention as Mosaic GPU kernels (models/kernels/linear_mgpu.py: the
forward and both backward passes), checked on this CPU: in the Mosaic GPU interpreter
(race detection on) against the Triton passes, with gradients, through
configs/listops.py (`model=linear,attention_impl=pallas_mosaic`), and the bf16 training
step lowered for sm_90. Needs JAX's Mosaic GPU interpreter (0.12: CI's newest-JAX stage);
on an older JAX only the fallback runs. Nothing here runs on a GPU."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.kernels import linear_mgpu, mgpu_common
from tests.kernels import lowering
from tests.kernels.interpreters import (assert_pallas_mosaic_equals_pallas, gpu_races_found,
                                        mosaic_calls_in_train_step, needs_mgpu,
                                        reset_gpu_interpreter)

# The module (models.kernels exports its function under the same name).
la = importlib.import_module("models.kernels.linear_attention")


@pytest.fixture(autouse=True)
def _fresh():
    reset_gpu_interpreter()
    yield


_races_found = gpu_races_found


def _inputs(length, dk, dv, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q, k = (jax.nn.elu(jax.random.normal(kk, (2, 2, length, dk))) + 1 for kk in ks[:2])
    v, g = (jax.random.normal(kk, (2, 2, length, dv)) for kk in ks[2:])
    return tuple(x.astype(dtype) for x in (q, k, v, g))


@needs_mgpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dk, dtype", [(64, "bfloat16"), (128, "bfloat16"), (64, "float16")])
def test_forward_in_the_interpreter_equals_the_triton_forward(causal, dk, dtype):
    """Padded rows (L 150 in chunks of 64), feature dims 64 and 128, no races: the same
    roundings as the Triton form (S and the masked scores in the inputs' dtype)."""
    q, k, v, _ = _inputs(150, dk, 64, dtype)
    cfg = la.make_config(q, causal=causal, chunk_size=64, platform="gpu", interpret=True)
    qp, kp, vp = la._pad(q, cfg, 1.0), la._pad(k, cfg), la._pad(v, cfg)
    out = jax.jit(lambda *a: linear_mgpu.forward(*a, causal=causal, eps=cfg.eps,
                                                 interpret=True))(qp, kp, vp)
    assert not _races_found()
    ref = la._run(la._FORWARD, (qp, kp, vp), (q.dtype,), cfg)[0]
    f32 = lambda x: np.asarray(x, np.float32)
    np.testing.assert_allclose(f32(out), f32(ref), atol=2.0 ** -8, rtol=2.0 ** -7)


@needs_mgpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_backward_in_the_interpreter_equals_the_triton_backward(causal):
    """dq, dk, dv of the Mosaic passes against the Triton passes on the same forward
    output and cotangent (padded rows, L 150), within a bf16 rounding; no races."""
    q, k, v, g = _inputs(150, 64, 64, "bfloat16", seed=3)
    cfg = la.make_config(q, causal=causal, chunk_size=64, platform="gpu", interpret=True)
    out = la._forward(q, k, v, cfg)
    got = la._backward(q, k, v, out, g, cfg._replace(gpu_form="mosaic"))
    assert not _races_found()
    for a, r in zip(got, la._backward(q, k, v, out, g, cfg)):
        assert a.shape == r.shape and a.dtype == r.dtype
        a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
        assert np.max(np.abs(a - r)) <= 2e-3 * np.max(np.abs(r))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_form_mosaic_equals_triton_with_gradients(capfd, causal):
    """Output and gradients of q, k, v against the Triton form; under a JAX without the
    Mosaic GPU interpreter, the fallback (the Triton form, said once)."""
    q, k, v, g = _inputs(100, 64, 64, "bfloat16", seed=1)

    def run(form):
        def f(q, k, v):
            return la.linear_attention(q, k, v, causal=causal, backend="pallas",
                                       chunk_size=64, gpu_form=form)
        out, vjp = jax.vjp(f, q, k, v)
        return (out, *vjp(g))

    with mgpu_common.interpreted():
        ref, got = run("triton"), run("mosaic")
    err = capfd.readouterr().err
    if mgpu_common.available():
        assert "Mosaic GPU kernels (interpreted)" in err
    else:
        assert "Triton form, not Mosaic GPU (JAX" in err
    for a, b in zip(ref, got):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.max(np.abs(a - b)) <= 1e-2 * np.max(np.abs(a))


def test_refusals():
    q, k, v, _ = _inputs(16, 16, 16, "float32")
    with pytest.raises(ValueError, match="gpu_form must be one of triton, mosaic"):
        la.linear_attention(q, k, v, causal=True, gpu_form="cutlass")
    why = linear_mgpu.supports(jnp.float32, 64, 64, 64)
    assert "wgmma takes 16-bit" in why or "lacks the Mosaic GPU API" in why
    assert linear_mgpu.supports(jnp.bfloat16, 32, 64, 64) is not None


@needs_mgpu
def test_pallas_mosaic_equals_pallas_through_the_task_config():
    """configs/listops.py:model=linear,...,pretrain,causal in bfloat16 with
    attention_impl=pallas_mosaic against attention_impl=pallas on the same weights: the
    loss and every gradient (64 features per head)."""
    assert_pallas_mosaic_equals_pallas("model=linear,runlocal,pretrain,causal", head_dim=64)


@needs_mgpu
def test_train_step_lowered_for_cuda_holds_the_mosaic_gpu_kernels():
    """The bf16 training step of configs/listops.py:model=linear,runlocal,
    attention_impl=pallas_mosaic lowered for sm_90: three Mosaic GPU calls per layer (the
    forward, dq and dk/dv passes) and no Triton call."""
    mosaic, triton, layers = mosaic_calls_in_train_step("model=linear,runlocal,attention_impl=pallas_mosaic", head_dim=64)
    assert (mosaic, triton) == (3 * layers, 0)


@needs_mgpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dk", [64, 128])
def test_each_pass_lowers_for_sm90(causal, dk):
    """Mosaic GPU's layout inference runs at lowering, not in the interpreter: the three
    passes lowered for an abstract H100, one Mosaic GPU call each."""
    q = jax.ShapeDtypeStruct((1, 2, 128, dk), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((1, 2, 128, 64), jnp.bfloat16)
    for fn, calls in ((lambda q, v: linear_mgpu.forward(q, q, v, causal=causal, eps=1e-6), 1),
                      (lambda q, v: linear_mgpu.backward(q, q, v, v, v, causal=causal,
                                                         eps=1e-6), 2)):
        found = lowering.custom_calls(lowering.for_cuda(fn, q, v))
        assert sum(c.startswith(lowering.MOSAIC_GPU) for c in found) == calls, found
