"""What the chunked Mosaic GPU kernels share (linear_mgpu.py, decayed_mgpu.py): one
warpgroup per (batch, head) row walks its chunks by `plgpu.emit_pipeline`, matmuls are
`wgmma`s on 128-byte-swizzled shared memory, outputs leave by TMA chunk by chunk."""
from __future__ import annotations

import contextlib

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

_F32 = jnp.float32
GPU_FORMS = ("triton", "mosaic")  # a kernel's `gpu_form`: which GPU kernels it runs

_INTERPRET = [False]


@contextlib.contextmanager
def interpreted():
    """Within it, a CPU run of `gpu_form="mosaic"` takes this kernel in the Mosaic GPU
    interpreter; outside it takes the Triton form in the Pallas interpreter. The GPU
    interpreter's ordered callbacks cannot sit beside a compiled form in
    `lax.platform_dependent`, so a program traced inside it lowers for the CPU only."""
    _INTERPRET.append(True)
    try:
        yield
    finally:
        _INTERPRET.pop()


def interpreting() -> bool:
    return _INTERPRET[-1]


def available() -> bool:
    """Whether this JAX has the Mosaic GPU API the kernel is written against (0.12's:
    `plgpu.kernel` grids, `emit_pipeline` carries, the GPU interpreter)."""
    try:
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except ImportError:
        return False
    return all(hasattr(plgpu, n) for n in ("kernel", "emit_pipeline", "wgmma", "ACC",
                                          "InterpretGPUParams", "SwizzleTransform"))


# The GPUs these kernels are written for: Hopper (wgmma and TMA, sm_90a). Blackwell's
# matmuls are tcgen05 (no wgmma), Ampere has neither.
HOPPER = ("H100", "H200", "H800", "H20", "GH200")


def not_hopper() -> str | None:
    """Why the GPU the program is for cannot run these kernels (None: a Hopper, or no GPU
    known: the interpreter, or a lowering without a named device)."""
    from models.kernels import tuning  # tuning imports targets only: no circle
    kind = tuning.device_kind()
    if kind is None or any(h in kind for h in HOPPER):
        return None
    return (f"the Mosaic GPU kernels are written for Hopper (wgmma, TMA: sm_90a), not "
            f"{kind}")


def unavailable() -> str | None:
    """Why no Mosaic GPU kernel can run here (this JAX, the GPU named), or None."""
    if not available():
        import jax
        return f"JAX {jax.__version__} lacks the Mosaic GPU API these kernels use"
    return not_hopper()


def check_gpu_form(gpu_form: str) -> None:
    if gpu_form not in GPU_FORMS:
        raise ValueError(f"gpu_form must be one of {', '.join(GPU_FORMS)}, got {gpu_form!r}")



class Toolkit:
    """The helpers of one kernel: `plgpu` is passed in (imported where the API exists)."""

    def __init__(self, plgpu, chunk: int, num_chunks: int, interpret: bool):
        self.plgpu, self.c, self.n = plgpu, chunk, num_chunks
        self.swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
        self.wgmma = plgpu.Layout.WGMMA
        self.rows, self.cols = self.wgmma.reduce(1), self.wgmma.reduce(0)
        self.params = plgpu.InterpretGPUParams(detect_races=True) if interpret else False

    def mma(self, a_s, b_s, shape):
        """a @ b of two shared-memory tiles (transposed views allowed), f32, in registers."""
        plgpu = self.plgpu

        def run(acc_ref):
            plgpu.wgmma(acc_ref, a_s, b_s)
            return acc_ref[...]
        return pl.run_scoped(run, plgpu.ACC(shape, _F32))

    def load(self, ref, layout=None):
        return self.plgpu.load(ref, layout=self.wgmma if layout is None else layout)

    def to_smem(self, ref, x):
        """x into a shared-memory tile in the tile's dtype, fenced for the next wgmma (and
        for the TMA that refills a slot this step read)."""
        ref[...] = x.astype(ref.dtype)
        self.plgpu.commit_smem()

    def fence(self):
        """Orders this step's register reads of its input slots before their refill."""
        self.plgpu.commit_smem()

    def store(self, x, o_s, o_row, i):
        """Chunk i of a row out by TMA, once the previous chunk has left o_s (the GPU
        interpreter has no predicated stores, so not emit_pipeline's out_specs)."""
        plgpu = self.plgpu
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        o_s[...] = x.astype(o_s.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_s, o_row.at[pl.ds(i * self.c, self.c)])

    def spec(self, width: int | None, reverse: bool = False, swizzle: bool = True):
        """A chunk of a row (width None: a vector of the chunk's positions)."""
        n = self.n
        index = (lambda i: (n - 1 - i, 0)) if reverse else (lambda i: (i, 0))
        if width is None:
            return self.plgpu.BlockSpec((self.c,), lambda i: index(i)[:1])
        return self.plgpu.BlockSpec((self.c, width), index,
                                    **({"transforms": self.swizzled} if swizzle else {}))

    def zeros(self, shape, layout=None):
        return self.plgpu.layout_cast(jnp.zeros(shape, _F32),
                                      self.wgmma if layout is None else layout)

    def iotas(self):
        c, wgmma = self.c, self.wgmma
        return (self.plgpu.broadcasted_iota(jnp.int32, (c, c), 0, layout=wgmma),
                self.plgpu.broadcasted_iota(jnp.int32, (c, c), 1, layout=wgmma))

    def smem(self, shape, dtype, swizzle: bool = True):
        return self.plgpu.SMEM(shape, dtype, **({"transforms": self.swizzled} if swizzle
                                                else {}))

    @staticmethod
    def bcast(x, shape, dim: int):
        """A vector along `dim` of a 2-D shape."""
        return lax.broadcast_in_dim(x, shape, [dim])


def takes(kernel: str, interpret: bool, why_not) -> bool:
    """Whether a call asked for `gpu_form="mosaic"` runs its Mosaic GPU kernels: on a GPU
    where `why_not()` (the kernel's `supports`) is None; on CPU only inside
    `interpreted()` (the Mosaic GPU interpreter's ordered callbacks keep
    a program from also lowering for a GPU). Says once, on stderr, which form runs."""
    from models.kernels import targets

    if interpret and not interpreting():
        targets.say_once(f"{kernel}: gpu_form='mosaic' runs the Triton form in the "
                         "interpreter here (the Mosaic GPU interpreter: "
                         "mgpu_common.interpreted())")
        return False
    why = why_not()
    if why is not None:
        targets.say_once(f"{kernel}: Triton form, not Mosaic GPU ({why})")
        return False
    targets.say_once(f"{kernel}: Mosaic GPU kernels "
                     f"({'interpreted' if interpret else 'compiled'})")
    return True
