"""Lowering a kernel call for a GPU or a TPU from this host (no GPU, no TPU here).

CUDA: JAX >= 0.11 asks for the GPU's compute capability when it lowers a Triton kernel,
so the lowering runs under an abstract H100 (sm_90; models.kernels.targets.abstract_gpu).
TPU: `jax.export` for the tpu platform. Each returns the module's text."""
import re

import jax
import jax.numpy as jnp
from flax import nnx

from models.kernels import targets

TRITON = "__gpu$xla.gpu.triton"
MOSAIC_TPU = "tpu_custom_call"
MOSAIC_GPU = "mosaic_gpu"  # JAX 0.12: mosaic_gpu_v2


def for_cuda(fn, *args, device_kind: str = targets.H100, num_cores: int = 132) -> str:
    with targets.abstract_gpu(device_kind, num_cores):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def for_tpu(fn, *args) -> str:
    # keep_unused: jax.export (JAX 0.10.2) unflattens the arguments that jit pruned (an
    # unused rng stream without dropout) against the full tree, and fails.
    return jax.export.export(jax.jit(fn, keep_unused=True), platforms=["tpu"])(
        *args).mlir_module()


def custom_calls(text: str) -> list[str]:
    """Every custom call target in the module, in order."""
    return [a or b for a, b in re.findall(
        r'custom_call @([\w.$-]+)|call_target_name = "([^"]+)"', text)]


def train_step(config):
    """The training step and abstract (state, batch) of a ListOps-shaped `config` (its
    max_length and batch_size), as lra.train builds them (the parameters never
    materialise); and the number of layers."""
    import lra.tasks
    from lra import train
    from lra.training import objectives, optim
    task = lra.tasks.get("listops")
    schedule = optim.learning_rate_schedule(config)
    tx = optim.make_optimizer(config, schedule)

    def init_state():
        _, params, rest = nnx.split(train.build_model(config, task), nnx.Param, ...)
        return {"step": jnp.int32(0), "params": params, "rest": rest,
                "opt_state": tx.init(params)}

    graphdef = nnx.split(nnx.eval_shape(lambda: train.build_model(config, task)), nnx.Param,
                         ...)[0]
    state = jax.eval_shape(init_state)
    b, length = config.batch_size, config.max_length
    batch = {"inputs": jax.ShapeDtypeStruct((b, length), jnp.int32),
             "mask": jax.ShapeDtypeStruct((b, length), jnp.bool_),
             "targets": jax.ShapeDtypeStruct((b,), jnp.int32)}
    step, _ = objectives.make_steps(graphdef, tx, schedule, task.num_classes, config,
                                    task.vocab_size)
    return step, state, batch, config.num_layers
