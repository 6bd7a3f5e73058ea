"""The block-sparse forward as a Mosaic GPU kernel (models/kernels/block_sparse_mgpu.py),
checked on this CPU: its numerics in the Mosaic GPU interpreter (race detection on) against
the Triton form's forward, the model path (`attention_impl=pallas_mosaic` through
configs/listops.py) against `attention_impl=pallas`, and the training step lowered for
sm_90 with the Mosaic GPU call in it. Needs a JAX with the Mosaic GPU interpreter (0.12:
CI's newest-JAX stage, `make ci-latest`); on an older JAX only the fallback test runs.
Nothing here runs on a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import masks
from models.kernels import (block_sparse_attention, block_sparse_mgpu, block_sparse_pallas,
                            mgpu_common)
from models.kernels.block_sparse_tiles import make_config
from tests.kernels import lowering
from tests.kernels.interpreters import (assert_pallas_mosaic_equals_pallas, gpu_races_found,
                                        listops_bf16, mosaic_calls_in_train_step, needs_mgpu,
                                        reset_gpu_interpreter)


PATTERNS = {
    "all": masks.all_(),
    "causal": masks.causal(),
    "local": masks.local(40),
    "strided_or_local": masks.strided(24) | masks.local(8),
    "per_head": masks.per_head([masks.causal(), masks.local(20)]),
}


@pytest.fixture(autouse=True)
def _fresh_interpreter():
    reset_gpu_interpreter()
    yield


_races_found = gpu_races_found


def _inputs(b, h, q_len, kv_len, d, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    shapes = ((b, h, q_len, d), (b, h, kv_len, d), (b, h, kv_len, d))
    return tuple(jax.random.normal(k, s, jnp.float32).astype(dtype) for k, s in zip(ks, shapes))


SCALARS = jnp.array([7, 0, 0, 2], jnp.int32)  # seed, batch offset, head offset, heads


@needs_mgpu
@pytest.mark.parametrize("dtype, dropout", [("bfloat16", 0.0), ("float16", 0.0),
                                            ("bfloat16", 0.25)])
@pytest.mark.parametrize("name", list(PATTERNS))
def test_forward_in_the_interpreter_equals_the_triton_forward(name, dtype, dropout):
    """Output and log-sum-exp against the Triton forward on the same (16-bit) values in
    float32; odd lengths (whole tiles padded), fewer queries than keys, padded keys (a
    whole block of them), head dim 32 (padded to 64 inside), the hashed dropout, no
    races."""
    pattern = PATTERNS[name]
    b, h, q_len, kv_len, d = 2, 2, 100, 170, 32
    q, k, v = _inputs(b, h, q_len, kv_len, d, dtype)
    cfg = make_config(q, k, pattern, block_q=64, block_k=64, platform="gpu", interpret=True,
                      dropout_rate=dropout)
    qp, kp, vp = block_sparse_pallas._padded_qkv(q, k, v, cfg)
    lengths = jnp.array([kv_len, 57])  # batch 1: keys 57.. padded, blocks 1-2 wholly
    valid = block_sparse_pallas.key_validity(jnp.arange(kv_len)[None] < lengths[:, None], b,
                                             kv_len, cfg)
    out, lse = jax.jit(lambda *a: block_sparse_mgpu.forward(*a, cfg, interpret=True))(
        qp, kp, vp, valid, SCALARS)
    assert not _races_found()
    f32 = lambda x: x.astype(jnp.float32)
    ref_out, ref_lse = block_sparse_pallas._forward(f32(qp), f32(kp), f32(vp), valid, SCALARS,
                                                    cfg)
    assert out.shape == ref_out.shape and out.dtype == q.dtype and lse.shape == ref_lse.shape
    tol = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10  # the output's rounding
    np.testing.assert_allclose(f32(out), ref_out, atol=tol * 2, rtol=tol)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5, rtol=1e-5)


@needs_mgpu
@pytest.mark.parametrize("name, dropout", [("all", 0.0), ("causal", 0.25), ("local", 0.0),
                                           ("per_head", 0.0)])
def test_backward_in_the_interpreter_equals_the_triton_backward(name, dropout):
    """dQ, dK, dV against the Triton passes on the same values in float32 (same padding,
    odd lengths, fewer queries than keys, head dim 32, the hashed dropout), no races."""
    b, h, q_len, kv_len = 2, 2, 100, 170
    q, k, v = _inputs(b, h, q_len, kv_len, 32, "bfloat16")
    cfg = make_config(q, k, PATTERNS[name], block_q=64, block_k=64, platform="gpu",
                      interpret=True, dropout_rate=dropout)
    qp, kp, vp = block_sparse_pallas._padded_qkv(q, k, v, cfg)
    do = jax.random.normal(jax.random.key(9), qp.shape).astype(jnp.bfloat16)
    valid = block_sparse_pallas.key_validity(
        jnp.arange(kv_len)[None] < jnp.array([[kv_len], [57]]), b, kv_len, cfg)
    f32 = lambda x: x.astype(jnp.float32)
    out, lse = block_sparse_pallas._forward(f32(qp), f32(kp), f32(vp), valid, SCALARS, cfg)
    delta = jnp.sum(f32(do) * out, -1, keepdims=True)
    got = jax.jit(lambda *a: block_sparse_mgpu.backward(*a, cfg, interpret=True))(
        qp, kp, vp, valid, SCALARS, do, lse, delta)
    assert not _races_found()
    args = (f32(qp), f32(kp), f32(vp), valid, SCALARS, f32(do), lse, delta, cfg)
    ref = (block_sparse_pallas._backward_dq(*args), *block_sparse_pallas._backward_dkv(*args))
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == jnp.float32
        # P and dS are rounded to bfloat16 before their matmuls, as in the Triton form.
        assert float(jnp.max(jnp.abs(g - r))) <= 1e-2 * float(jnp.max(jnp.abs(r)))


@needs_mgpu
def test_rows_without_keys_are_zero():
    """A query whose keys are all masked gets output 0 and lse 0, as the Triton form."""
    q, k, v = _inputs(1, 1, 64, 64, 64, "bfloat16")
    pattern = masks.local(4)
    cfg = make_config(q, k, pattern, block_q=64, block_k=64, platform="gpu", interpret=True)
    valid = jnp.zeros((1, 1, 64), jnp.int32).at[..., :10].set(1)
    out, lse = block_sparse_mgpu.forward(q, k, v, valid, SCALARS, cfg, interpret=True)
    assert not np.any(np.asarray(out[0, 0, 20:], np.float32))  # rows 15.. see no valid key
    assert not np.any(np.asarray(lse[0, 0, 20:]))
    assert np.all(np.asarray(lse[0, 0, :10]) != 0)


def _loss_and_grads(fn, q, k, v, mask):
    return jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v, mask).astype(jnp.float32)
                                                     ** 2), argnums=(0, 1, 2))(q, k, v)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_gpu_form_mosaic_equals_triton_with_gradients(capfd, dropout):
    """`gpu_form="mosaic"` against the Triton form: output and gradients, with and without
    the hashed dropout.
    Under a JAX without the Mosaic GPU interpreter this is the fallback: the Triton form,
    said once."""
    q, k, v = _inputs(2, 2, 96, 96, 64, "bfloat16", seed=1)
    mask = jnp.arange(96)[None] < jnp.array([[96], [70]])
    run = lambda form: lambda q, k, v, m: block_sparse_attention(
        q, k, v, masks.causal() | masks.global_tokens([0]), padding_mask=m, backend="pallas",
        gpu_form=form, dropout_rate=dropout, dropout_seed=jnp.int32(5))
    with mgpu_common.interpreted():
        (l1, g1), (l2, g2) = (_loss_and_grads(run(f), q, k, v, mask)
                              for f in ("triton", "mosaic"))
    err = capfd.readouterr().err
    if mgpu_common.available():
        assert "Mosaic GPU kernels (interpreted)" in err
    else:
        assert "Triton form, not Mosaic GPU (JAX" in err
    assert abs(float(l1 - l2)) <= 2e-2 * abs(float(l1))
    for a, b in zip(g1, g2):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.max(np.abs(a - b)) <= 3e-2 * np.max(np.abs(a)), np.max(np.abs(a - b))


@needs_mgpu
def test_float32_keeps_the_triton_form(capfd):
    """wgmma takes 16-bit operands: a float32 call takes the Triton form and says why."""
    q, k, v = _inputs(1, 1, 64, 64, 64, "float32")
    with mgpu_common.interpreted():
        out = block_sparse_attention(q, k, v, masks.causal(), backend="pallas",
                                     gpu_form="mosaic")
        ref = block_sparse_attention(q, k, v, masks.causal(), backend="pallas")
        np.testing.assert_array_equal(out, ref)
        assert ("Triton form, not Mosaic GPU (wgmma takes 16-bit operands"
                in capfd.readouterr().err)


def test_outside_the_interpreter_switch_a_cpu_run_takes_the_triton_form(capfd):
    """On a CPU, gpu_form="mosaic" runs the Triton form in the Pallas interpreter unless
    asked for the Mosaic GPU interpreter (whose callbacks would keep the program from
    lowering for a GPU too): same values as the Triton form, said once."""
    q, k, v = _inputs(1, 2, 64, 64, 64, "bfloat16")
    out = block_sparse_attention(q, k, v, masks.causal(), backend="pallas", gpu_form="mosaic")
    ref = block_sparse_attention(q, k, v, masks.causal(), backend="pallas")
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
    assert "runs the Triton form in the interpreter here" in capfd.readouterr().err


def test_unknown_gpu_form_is_refused():
    q, k, v = _inputs(1, 1, 16, 16, 16, "float32")
    with pytest.raises(ValueError, match="gpu_form must be one of triton, mosaic"):
        block_sparse_attention(q, k, v, masks.causal(), backend="pallas", gpu_form="cutlass")


@needs_mgpu
@pytest.mark.parametrize("arg", ["model=transformer,runlocal",
                                 "model=local,runlocal,pretrain,causal"])
def test_pallas_mosaic_equals_pallas_through_the_task_config(arg):
    """configs/listops.py in bfloat16 with attention_impl=pallas_mosaic against the same
    weights under attention_impl=pallas (Triton): the model's output and every gradient
    (CLS prefix, padding; local's pattern as a causal LM)."""
    assert_pallas_mosaic_equals_pallas(arg)


@needs_mgpu
def test_train_step_lowered_for_cuda_holds_the_mosaic_gpu_kernels():
    """The bfloat16 training step of configs/listops.py:model=transformer,runlocal,
    attention_impl=pallas_mosaic lowered for sm_90 (an abstract H100): one Mosaic GPU call
    per pass (forward, dQ, dK/dV) per layer, no Triton call, no interpreter."""
    arg = "model=transformer,runlocal,attention_impl=pallas_mosaic"
    assert listops_bf16(arg).attention_dropout_rate > 0  # the hashed dropout, both forms
    mosaic, triton, layers = mosaic_calls_in_train_step(arg)
    assert (mosaic, triton) == (3 * layers, 0)


@needs_mgpu
@pytest.mark.parametrize("name, dropout", [("causal", 0.0), ("strided_or_local", 0.1),
                                           ("per_head", 0.0)])
def test_each_pass_lowers_for_sm90(name, dropout):
    """Mosaic GPU's layout inference runs at lowering, not in the interpreter: forward and
    backward of partial-block patterns (the predicate in registers), per-head lists and the
    dropout hash lowered for an abstract H100: three Mosaic GPU calls."""
    q = jax.ShapeDtypeStruct((1, 2, 256, 64), jnp.bfloat16)

    def loss(q):
        out = block_sparse_attention(q, q, q, PATTERNS[name], backend="pallas",
                                     gpu_form="mosaic", dropout_rate=dropout,
                                     dropout_seed=jnp.int32(1))
        return jnp.sum(out.astype(jnp.float32))

    found = lowering.custom_calls(lowering.for_cuda(jax.grad(loss), q))
    assert sum(c.startswith(lowering.MOSAIC_GPU) for c in found) == 3, found
    assert lowering.TRITON not in found


def test_a_gpu_other_than_hopper_keeps_the_triton_form():
    """wgmma and TMA are Hopper's: lowered for an abstract B200 (Blackwell: tcgen05) or an
    A100, every Mosaic GPU kernel declines with the reason; for an H100 (or no device
    named) they take the call, where this JAX has them."""
    from models.kernels import decayed_mgpu, linear_mgpu, targets
    q = jnp.ones((1, 1, 64, 64), jnp.bfloat16)
    cfg = make_config(q, q, masks.causal(), block_q=64, block_k=64, platform="gpu")
    for kind in ("NVIDIA B200", "NVIDIA A100-SXM4-80GB"):
        with targets.abstract_gpu(kind):
            for why in (block_sparse_mgpu.supports(cfg, q.dtype, 64, 64),
                        linear_mgpu.supports(q.dtype, 64, 64, 64),
                        decayed_mgpu.supports(q.dtype, 64, 64, False)):
                assert why and ("written for Hopper" in why or "lacks the Mosaic" in why)
    with targets.abstract_gpu():  # an H100
        assert mgpu_common.not_hopper() is None
    assert mgpu_common.not_hopper() is None  # no device named: the interpreter


@pytest.mark.parametrize("kernel", ["block_sparse", "linear"])
def test_without_triton_a_declined_mosaic_call_takes_the_xla_path(monkeypatch, kernel):
    """A JAX without Pallas's Triton backend keeps the GPU flavour for gpu_form="mosaic";
    where the Mosaic GPU kernels then decline (float32 here), the XLA path runs, not a
    Triton kernel that does not exist: the values of backend="xla". Run on this CPU as a
    compiled GPU target would be (interpret=False)."""
    import importlib
    la = importlib.import_module("models.kernels.linear_attention")
    from models.kernels import targets
    monkeypatch.setattr(mgpu_common, "available", lambda: True)
    monkeypatch.setattr(targets, "gpu_backend", lambda: None)
    q, k, v = (jnp.abs(x) for x in _inputs(1, 2, 40, 40, 16, "float32"))
    if kernel == "block_sparse":
        call = lambda **kw: block_sparse_attention(q, k, v, masks.causal(), **kw)
    else:
        call = lambda **kw: la.linear_attention(q, k, v, causal=True, **kw)
    got = call(backend="pallas", gpu_form="mosaic", interpret=False)
    np.testing.assert_allclose(got, call(backend="xla"), rtol=1e-5, atol=1e-6)
