"""Lowering a kernel call for a GPU or a TPU from this host (no GPU, no TPU here).

CUDA: JAX >= 0.11 asks for the GPU's compute capability when it lowers a Triton kernel,
so the lowering runs under an abstract H100 (sm_90; models.kernels.targets.abstract_gpu).
TPU: `jax.export` for the tpu platform. Each returns the module's text."""
import re

import jax

from models.kernels import targets

TRITON = "__gpu$xla.gpu.triton"
MOSAIC_TPU = "tpu_custom_call"
MOSAIC_GPU = "mosaic_gpu"


def for_cuda(fn, *args) -> str:
    with targets.abstract_gpu():
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
