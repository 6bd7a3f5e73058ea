"""Which form of a Pallas kernel a call lowers to, chosen per lowering platform.

A kernel call traced on one machine may be lowered for another: `jax.jit(f).trace(...)
.lower(lowering_platforms=("cuda",))` or `jax.export(..., platforms=["tpu"])` on a CPU
host. So the kernels do not read `jax.default_backend()` when they are traced: `dispatch`
traces one form per lowering platform and stages them with `lax.platform_dependent`,
which keeps only the form for the platform that the program is lowered for:

- cpu: the GPU (Triton) flavour in the Pallas interpreter (the numerics the tests check);
- cuda, rocm: the GPU flavour compiled: Triton, the only backend that `pl.pallas_call`
  lowers to on a GPU in JAX 0.11 and 0.12 (see `gpu_backend`); where the installed JAX
  has no Triton backend, the kernel's plain-JAX path instead (`xla`), said in one line;
- tpu: the Mosaic (TPU) flavour compiled.

An explicit `platform` ("gpu" or "tpu") fixes the flavour on every platform and an
explicit `interpret` the interpret mode; left at None, interpret is on for CPU only.

`abstract_gpu()` lets a host without a GPU lower the Triton kernels: JAX >= 0.11 asks the
device (or an abstract one) for the GPU's compute capability (JAX 0.10 assumed sm_90).
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Callable, NamedTuple

import jax
from jax import lax
from jax.experimental.pallas import tpu as pltpu

# The platforms `lax.platform_dependent` names (a lowering platform, not a device kind).
LOWERING_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
# What `abstract_gpu` lowers for by default: the lent GPU machine's card (sm_90).
H100 = "NVIDIA H100 80GB HBM3"


class Target(NamedTuple):
    backend: str  # "pallas" (a kernel) or "xla" (the kernel's plain-JAX path)
    platform: str | None  # "gpu" (Triton) or "tpu" (Mosaic); None for "xla"
    interpret: bool


@functools.cache
def resolve_backend(backend: str, platform: str | None,
                    interpret: bool | None) -> tuple[str, bool]:
    """A chunked kernel's (platform, interpret) from its arguments: an unset platform
    follows this host's default backend (TPU there, else the GPU flavour), an unset
    interpret is True on a CPU host; bad values are refused in one line."""
    if backend not in ("pallas", "xla"):
        raise ValueError(f"backend must be 'pallas' or 'xla', got {backend!r}")
    device = jax.default_backend()
    if platform is None:
        platform = "tpu" if device == "tpu" else "gpu"
    if platform not in ("gpu", "tpu"):
        raise ValueError(f"platform must be 'gpu' or 'tpu', got {platform!r}")
    if interpret is None:
        interpret = device == "cpu"
    return platform, interpret


def interpret_mode(interpret, platform: str | None):
    """A kernel config's interpret field: a `pltpu.InterpretParams` kept as given (Mosaic's
    TPU interpreter, simulating VMEM, DMAs and semaphores, race detection if asked; the
    TPU flavour only), anything else as a bool (the generic Pallas interpreter or none)."""
    if isinstance(interpret, pltpu.InterpretParams):
        if platform != "tpu":
            raise ValueError("pltpu.InterpretParams interprets the Mosaic (platform='tpu') "
                             "form")
        return interpret
    return bool(interpret)


def interpret_for(target: "Target", interpret):
    """The interpret mode of a kernel built for `target`: the caller's
    `pltpu.InterpretParams` where that target is the interpreted TPU flavour, else the
    target's own bool."""
    if (target.interpret and target.platform == "tpu"
            and isinstance(interpret, pltpu.InterpretParams)):
        return interpret
    return target.interpret


def tpu_races_found() -> bool:
    """Whether Mosaic's TPU interpreter found a race since its state was last reset (the
    kernels' tests run it with `pltpu.InterpretParams(detect_races=True)`)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call
    races = getattr(interpret_pallas_call, "races", None)  # JAX 0.10-0.12: a module global
    return bool(races is not None and races.races_found)


def gpu_backend() -> str | None:
    """"triton" where this JAX lowers `pl.pallas_call` for a GPU through Triton, else None.

    Evidence (read in the installed sources): JAX 0.10.2 lowers `pl.pallas_call` on a GPU
    through Mosaic GPU by default and through Triton when given Triton's CompilerParams
    (our kernels: tile math, `dot_general`, in-kernel loops). JAX 0.11.2 and 0.12.0.1
    register a `pallas_call` GPU lowering for Triton's CompilerParams only (a deprecation
    warning: "will be removed"); Mosaic GPU kernels go through `plgpu.kernel`, whose
    lowering has no `dot_general` (matmuls are `plgpu.wgmma` / `tcgen05_mma` on shared
    memory), so a Mosaic GPU form is a rewrite: block_sparse_mgpu, linear_mgpu,
    decayed_mgpu and delta_mgpu (gpu_form="mosaic"); otherwise Triton while it exists, then
    XLA.
    """
    try:
        from jax._src import deprecations
        from jax._src.pallas.triton import pallas_call_registration  # noqa: F401
        from jax.experimental.pallas import triton  # noqa: F401
    except ImportError:
        return None
    try:  # An accelerated deprecation turns the Triton lowering into an error.
        if deprecations.is_accelerated("jax-pallas-triton"):
            return None
    except (AttributeError, ValueError):
        pass
    return "triton"


def triton_params(**kwargs):
    """Triton's CompilerParams (None where this JAX has no Triton backend)."""
    try:
        from jax.experimental.pallas import triton
    except ImportError:
        return None
    return triton.CompilerParams(**kwargs)


def triton_launch(tuned: tuple[int, int] | None, default: tuple[int, int]):
    """Triton's CompilerParams for a (num_warps, num_stages) from the tuning table, or the
    kernel's default pair."""
    num_warps, num_stages = tuned or default
    return triton_params(num_warps=num_warps, num_stages=num_stages)


def triton_missing(target: Target) -> bool:
    """A compiled GPU target without Pallas's Triton backend: where a kernel's Mosaic GPU
    form declines, its XLA path runs (as `targets` chooses for every other call)."""
    return target.platform == "gpu" and not target.interpret and gpu_backend() is None


def describe_gpu(kernel: str = "attention_impl=pallas") -> str:
    """One line: what `attention_impl=pallas` runs on a GPU with this JAX."""
    version = f"JAX {jax.__version__}"
    if gpu_backend() == "triton":
        return (f"{kernel} on GPU: Triton backend ({version}; deprecated upstream; Mosaic "
                f"GPU kernels for block-sparse, linear and scalar-decayed attention and the "
                f"delta rule: attention_impl=pallas_mosaic)")
    return (f"{kernel} on GPU: no Triton backend in {version} and no Mosaic GPU form of "
            f"these kernels: running their XLA path instead")


_SAID: set[str] = set()


def say_once(line: str) -> None:
    """Prints `models.kernels: <line>` to stderr the first time only."""
    if line not in _SAID:
        _SAID.add(line)
        print(f"models.kernels: {line}", file=sys.stderr, flush=True)


def targets(platform: str | None, interpret: bool | None,
            mosaic_gpu: bool = False) -> dict[str, Target]:
    """The form of the kernel for each lowering platform. `mosaic_gpu`: the kernel has a
    Mosaic GPU form it will take, so a JAX without Triton keeps the GPU flavour."""
    if platform not in (None, "gpu", "tpu"):
        raise ValueError(f"platform must be 'gpu' or 'tpu', got {platform!r}")
    out = {}
    for lowering in LOWERING_PLATFORMS:
        interp = lowering == "cpu" if interpret is None else bool(interpret)
        flavour = platform or ("tpu" if lowering == "tpu" else "gpu")
        if flavour == "gpu" and not interp and gpu_backend() is None and not mosaic_gpu:
            out[lowering] = Target("xla", None, False)
        else:
            out[lowering] = Target("pallas", flavour, interp)
    return out


def dispatch(build: Callable[[Target], Callable], args: tuple, *, platform: str | None,
             interpret: bool | None, mosaic_gpu: bool = False):
    """`build(target)(*args)` for the platform the program is lowered for; on a GPU,
    says once (stderr) which backend the kernels run on.

    `build` is called once per distinct target, when traced (so its configuration errors
    surface for every platform the call could be lowered for)."""
    per_platform = targets(platform, interpret, mosaic_gpu)
    if jax.default_backend() == "gpu":
        say_once(describe_gpu())
    fns: dict[Target, Callable] = {}
    for target in per_platform.values():
        if target not in fns:
            fns[target] = build(target)
    if len(fns) == 1:
        return next(iter(fns.values()))(*args)
    return lax.platform_dependent(*args, **{p: fns[t] for p, t in per_platform.items()})


@contextlib.contextmanager
def abstract_gpu(device_kind: str = H100, num_cores: int | None = 132):
    """Lower for a GPU of this kind from a host without one (JAX >= 0.11 needs a device,
    or an abstract one, to pick the Triton target; an H100 is sm_90)."""
    device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=num_cores,
                                         platform="gpu")
    with jax.sharding.use_abstract_mesh(
            jax.sharding.AbstractMesh((), (), abstract_device=device)):
        yield
