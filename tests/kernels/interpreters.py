"""The interpreters the kernels' tests run in, and what the Mosaic GPU forms' tests share.

- TPU flavour: Mosaic's TPU interpreter (`pltpu.InterpretParams`: simulated VMEM, DMAs and
  semaphores) with race detection on, not the generic Pallas interpreter; conftest.py
  fails a test whose kernels raced.
- Mosaic GPU forms (`gpu_form="mosaic"`, `attention_impl=pallas_mosaic`): the Mosaic GPU
  interpreter (JAX 0.12), race detection on (`gpu_races_found`), its state reset per test
  (`reset_gpu_interpreter`); `assert_pallas_mosaic_equals_pallas` compares a model built
  from configs/listops.py under both attention_impls, in bfloat16, gradients included.
"""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from models.kernels import mgpu_common, targets

TPU_INTERPRETER = pltpu.InterpretParams(detect_races=True)

needs_mgpu = pytest.mark.skipif(not mgpu_common.available(),
                                reason=f"JAX {jax.__version__} has no Mosaic GPU interpreter")


def reset_gpu_interpreter() -> None:
    """A fresh Mosaic GPU interpreter (an exception leaves its state behind, its docs say)
    and the once-only lines heard anew."""
    targets._SAID.clear()
    if mgpu_common.available():
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
        gpu_callbacks.reset_gpu_interpret_mode_state()


def gpu_races_found() -> bool:
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call
    return bool(interpret_pallas_call.get_races().races_found)


def listops_bf16(arg: str, length: int = 64, head_dim: int | None = None):
    """configs/listops.py at `length` tokens, batch 2, computing in bfloat16 (and
    `head_dim` features per head where the kernel needs 64)."""
    from configs import listops
    config = listops.get_config(arg)
    config.max_length, config.batch_size, config.dtype = length, 2, "bfloat16"
    if head_dim:
        config.qkv_dim = head_dim * config.num_heads
    return config


def assert_pallas_mosaic_equals_pallas(arg: str, head_dim: int | None = None) -> None:
    """The loss and every parameter's gradient of `arg` under attention_impl=pallas_mosaic
    (in the Mosaic GPU interpreter) against attention_impl=pallas on the same weights,
    through the bfloat16 compute view the training step uses; padding in the batch; no
    races."""
    import lra.tasks
    from flax import nnx
    from lra import train
    from models import precision
    from tests.models.helpers import randomize_params

    task = lra.tasks.get("listops")
    build = lambda impl: train.build_model(  # noqa: E731
        listops_bf16(f"{arg},attention_impl={impl}", head_dim=head_dim), task)
    ref = randomize_params(build("pallas"), seed=2, scale=0.3)
    mosaic = build("pallas_mosaic")
    nnx.update(mosaic, nnx.state(ref, nnx.Param))
    tokens = jax.random.randint(jax.random.key(0), (2, 64), 1, task.vocab_size)
    mask = jnp.arange(64)[None] < jnp.array([[64], [37]])

    def loss_and_grads(model):
        def loss(model):
            out = precision.compute_view(model, jnp.bfloat16)(tokens, mask,
                                                              deterministic=True)
            return jnp.sum(out.astype(jnp.float32) ** 2)
        return nnx.value_and_grad(loss)(model)

    with mgpu_common.interpreted():
        (l1, g1), (l2, g2) = loss_and_grads(ref), loss_and_grads(mosaic)
    assert not gpu_races_found()
    assert abs(float(l1 - l2)) <= 2e-2 * abs(float(l1))
    g1, g2 = (jax.tree.leaves(nnx.state(g, nnx.Param)) for g in (g1, g2))
    scale = max(float(jnp.abs(a.astype(jnp.float32)).max()) for a in g1)
    for a, b in zip(g1, g2):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.max(np.abs(a - b)) <= 5e-2 * np.max(np.abs(a)) + 1e-2 * scale


def mosaic_calls_in_train_step(arg: str, head_dim: int | None = None):
    """(Mosaic GPU calls, Triton calls, layers) in the bf16 training step of `arg` lowered
    for sm_90 (an abstract H100)."""
    from tests.kernels import lowering
    step, state, batch, layers = lowering.train_step(listops_bf16(arg, head_dim=head_dim))
    calls = collections.Counter(lowering.custom_calls(lowering.for_cuda(step, state, batch)))
    mosaic = sum(n for c, n in calls.items() if c.startswith(lowering.MOSAIC_GPU))
    return mosaic, calls[lowering.TRITON], layers
