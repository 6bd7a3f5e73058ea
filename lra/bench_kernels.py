r"""Kernel benchmark: the Pallas kernels against their XLA paths and dense attention.

  python -m lra.bench_kernels --lengths=1024,2048,4096,8192,16384   (make bench-kernels)
  python -m lra.bench_kernels --lengths=256 --batch_size=1 --num_heads=2 --interpret  (CPU)

Four sections (`--sections`): linear attention, decayed linear attention, block-sparse
softmax attention and the delta rule.

Linear attention: for each length L and mode (causal, full) on random `[B, H, L, D]`
inputs (positive features for linear attention), reports the median wall time of the
forward and of the forward+backward (`jax.vjp` with a random cotangent, under `jax.jit`),
the achieved
TFLOP/s of the Pallas kernels, and the speed ratios (other time / Pallas time, so > 1
means the kernel is faster) to `backend="xla"` (the same chunked algorithm under
`lax.scan`) and to dense softmax attention at the same shape, fused: the first of cuDNN
(GPU), tokamax (where installed), ours (`attention_impl=flash`), tokamax's xla_chunked and
XLA's materialised softmax that runs (every one that runs is timed, in the last column).
The dense reference is timed once per shape and mode in a run (its time does not depend on
the values): the block-sparse section reuses the linear section's full one, the delta
section its causal one.

FLOPs are those of the chunked algorithm (the masked C x C products counted in full):
per position 2C(K + V) + 4KV causal, 4KV non-causal, forward; forward+backward counted as
3x forward, the usual convention.

Decayed linear attention (retnet, mamba2: a scalar decay per head; gla: a diagonal gate):
for each L and decay kind (`--decays`), the Pallas kernels' forward and forward+backward
(gradients of q, k, v and log a) against `backend="xla"` (the same chunked algorithm under
`lax.scan`) and against `chunked_retention`, the models' XLA form (attention_impl=dense;
chunk 64 for scalar decays, 16 for gates, the builders' defaults), causal, same shape.

Block-sparse attention: for each L and pattern density (`--densities`: the fraction of
(tile x tile) blocks kept, a random block pattern, so every kept block is full; 1.0 is the
full pattern through the kernel), the same timings of the Pallas flash-attention kernel,
ratios to the XLA block-sparse backend (`backend="xla"`, same pattern and tile) and to
fused dense softmax attention over all L x L pairs (the reference above). FLOPs count the kept blocks only:
4 B H D (tile^2) per block forward (two matmuls); forward+backward is 3.5x forward (the
backward recomputes the scores and does five matmuls in all).

Mosaic GPU forms (`attention_impl=pallas_mosaic`: models/kernels/block_sparse_mgpu.py,
linear_mgpu.py, decayed_mgpu.py, delta_mgpu.py; 64 x 64 tiles, chunks of 64): on a GPU the
linear, decayed (scalar decays), block-sparse and delta-rule tables time the same calls through them in their
last columns, beside the Triton ones ("Pallas"); "-" where not timed (why, on stderr).

Delta rule (`models/kernels/delta_rule.py`; `--delta_rules`: deltanet, no decay, and
gated_deltanet, a scalar decay per head and position): for each L, the Pallas kernels'
forward and forward+backward (gradients of q, k, v, beta and, gated, log alpha) against
`backend="xla"` (the same chunked algorithm under `lax.scan`), against
`models.attention.delta.chunk_delta_rule` (the models' XLA form, attention_impl=dense, at
its default chunk, 64) and against the fused dense softmax reference above (causal, the
same B, H, L, D: issue 70's goal is the delta-rule kernels faster than cuDNN's from 4K).
Inputs as the layer feeds the rule: q and k L2-normalised, beta = sigmoid(normal) in
(0, 1), log alpha = -A dt <= 0 (gated_deltanet's initial range: A ~ U(0, 16) per head, dt
log-uniform in [1e-3, 1e-1]); q, k, v in --dtype (the layer itself passes float32
features: --dtype=float32 times that), beta and log alpha float32.
FLOPs are those of the chunked WY / UT algorithm as the kernel runs it, every C x C
product counted in full (matmuls only, 2mnk each; K = V = D here), per chunk of C:
forward 6 C^2 K (K K^T, W = T diag(beta e^b) K, Q K^T) + 4 C^2 V (U = T diag(beta) V,
(Q K^T o Gamma) V_new) + 6 C K V (W S^T, (Q e^b) S^T, the state update V_new^T K')
+ 4 C^3 log2(C) (the UT inverse T = (I + A)^-1: log2(C) doubling levels of two C x C x C
matmuls); the backward recomputes the chunk (K K^T, T, W, U, V_new, Q K^T) and adds
its transposes: 18 C^2 K + 10 C^2 V + 14 C K V + 4 C^3 (1 + log2 C) in all, so
forward+backward is 2.75x forward at C = K = V = 64 (not the 3x convention), and the
inverse is 60% of the forward's FLOPs there.

Every table ends with the HBM floor of a row (MB a pass must move at least: each input
read and each output written once; forward+backward adds the inputs, the output and the
cotangent read again and the gradients written): the GPU suite divides it by the device's
bandwidth and prints the Pallas times as a % of that floor.

On CPU the Pallas kernels would run in the interpreter, which times nothing useful: they
are skipped unless `--interpret`. `--tune` (a GPU only) measures the Triton kernels' tiles
and launch parameters and writes models/kernels/tuning.json instead
(lra/gpu/kernel_tuning.py). Markdown goes to stdout, progress to stderr.
"""
from __future__ import annotations

import functools
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from lra.gpu import kernel_tuning
from lra.runs import cli
from models import masks
from models.attention.delta import chunk_delta_rule, l2_normalise
from models.attention.retention import chunked_retention
from models.kernels import block_sparse_mgpu, decayed_mgpu, delta_mgpu, linear_mgpu, tuning
from models.kernels.block_sparse_attention import block_sparse_attention
from models.kernels.block_sparse_tiles import make_config as block_sparse_config
from models.kernels.decayed_attention import decayed_linear_attention
from models.kernels.delta_rule import delta_rule
from models.kernels.delta_rule import make_config as delta_config
from models.kernels.flash_attention import flash_attention
from models.kernels.linear_attention import linear_attention, make_config

FLAGS = flags.FLAGS
def _define_flags() -> None:
    # Defined only when run as a program, so importing this module never claims global
    # absl flag names.
    flags.DEFINE_list("lengths", ["1024", "2048", "4096", "8192", "16384"], "Sequence lengths.")
    flags.DEFINE_list("modes", ["causal", "full"], "causal and/or full (non-causal).")
    flags.DEFINE_integer("batch_size", 8, "Batch size.")
    flags.DEFINE_integer("num_heads", 16, "Heads.")
    flags.DEFINE_integer("head_dim", 64, "Feature and value dimension per head.")
    flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Input dtype.")
    flags.DEFINE_integer("chunk_size", None, "Chunk size (default: the backend's).")
    flags.DEFINE_integer("repeats", 20, "Timed calls per cell (the median is reported).")
    flags.DEFINE_bool("interpret", False, "Time the Pallas kernels in the interpreter on CPU.")
    flags.DEFINE_bool("dense", True, "Include dense softmax attention.")
    flags.DEFINE_list("sections", ["linear", "decayed", "block_sparse", "delta"],
                      "Which kernels to time.")
    flags.DEFINE_list("delta_rules", ["deltanet", "gated_deltanet"], "Delta rule: without "
                      "decay (deltanet) and/or with a scalar decay per head (gated_deltanet).")
    flags.DEFINE_list("decays", ["scalar", "gate"], "Decayed attention: a scalar decay per "
                      "head (retnet, mamba2) and/or a diagonal gate (gla).")
    flags.DEFINE_list("densities", ["1.0", "0.5", "0.1"],
                      "Block-sparse: fractions of blocks kept (random block patterns).")
    flags.DEFINE_integer("block_size", None, "Block-sparse tile (default: the kernel's).")
    flags.DEFINE_bool("tune", False, "Measure the Triton kernels' tile x num_warps x "
                      "num_stages candidates at each length on this GPU and write the "
                      "fastest into --tune_table (lra/gpu/kernel_tuning.py), instead of the "
                      "tables.")
    flags.DEFINE_string("tune_table", tuning.TABLE, "The tuning table --tune writes.")
    flags.DEFINE_float("dropout_rate", 0.0, "Block-sparse: attention dropout in the Pallas "
                       "kernel (hashed mask) and the XLA path (a Bernoulli mask); the dense "
                       "reference has none.")


def _time(fn, *args, repeats: int) -> float | None:
    """Median seconds per call after a warm-up; None when it does not fit or fails."""
    try:
        jax.block_until_ready(fn(*args))
    except Exception as e:  # noqa: BLE001 - out of memory, unsupported shape: report n/a
        print(f"  skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
        return None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _fwd_and_fwd_bwd(attn):
    """Jitted forward `attn(*inputs)` and forward+backward `(*inputs, g)` -> the gradients
    of every input (q, k, v and any further ones: log a, beta) for the cotangent g."""
    fwd = jax.jit(attn)

    @jax.jit
    def fwd_bwd(*inputs_and_g):
        *inputs, g = inputs_and_g
        _, vjp = jax.vjp(attn, *inputs)
        return vjp(g)

    return fwd, fwd_bwd


def _dense(causal: bool):
    """Softmax attention over all L x L pairs, fused where the platform has it, in the
    order the reference is taken: cuDNN (GPU), tokamax's own choice (where installed: its
    Mosaic GPU / Triton / TPU kernels), ours (`attention_impl=flash`: cuDNN in bf16 on a
    GPU, splash on a TPU, the O(L)-memory chunked form on CPU), tokamax's xla_chunked, and
    XLA with the logits materialised."""
    def jax_nn(q, k, v, implementation):
        out = jax.nn.dot_product_attention(*(x.swapaxes(1, 2) for x in (q, k, v)),
                                           is_causal=causal, implementation=implementation)
        return out.swapaxes(1, 2)

    def ours(q, k, v):
        return flash_attention(q, k, v, masks.causal() if causal else None)

    impls = [("cudnn", functools.partial(jax_nn, implementation="cudnn"))] \
        if jax.default_backend() == "gpu" else []
    try:
        import tokamax
    except ImportError:
        tokamax = None
    if tokamax is not None:
        def tk(q, k, v, implementation):
            out = tokamax.dot_product_attention(*(x.swapaxes(1, 2) for x in (q, k, v)),
                                                is_causal=causal,
                                                implementation=implementation)
            return out.swapaxes(1, 2)
        if jax.default_backend() != "cpu":
            impls.append(("tokamax", functools.partial(tk, implementation=None)))
    impls.append(("flash", ours))
    if tokamax is not None:
        impls.append(("tokamax xla_chunked", functools.partial(tk, implementation="xla_chunked")))
    impls.append(("xla", functools.partial(jax_nn, implementation="xla")))
    return impls


# (causal, q's shape, v's shape, dtype) -> _time_dense's result: the dense reference is
# timed once per shape and mode in a run (its time does not depend on the values).
_DENSE_TIMES: dict = {}


def _time_dense(causal: bool, q, k, v, g):
    """((fwd s, fwd+bwd s) of the first dense implementation that runs, its name, every
    implementation's "name fwd / fwd+bwd ms"): every one of `_dense` is timed, once per
    shape and mode (`_DENSE_TIMES`)."""
    key = (causal, q.shape, v.shape, jnp.dtype(q.dtype).name)
    if key not in _DENSE_TIMES:
        _DENSE_TIMES[key] = _time_dense_once(causal, q, k, v, g)
    return _DENSE_TIMES[key]


def _time_dense_once(causal: bool, q, k, v, g):
    best, best_impl, every = (None, None), "none", []
    for impl, attn in (_dense(causal) if FLAGS.dense else []):
        fwd, fwd_bwd = _fwd_and_fwd_bwd(attn)
        fb = _time(fwd_bwd, q, k, v, g, repeats=FLAGS.repeats)
        if fb is None:
            every.append(f"{impl} n/a")
            continue
        f = _time(fwd, q, k, v, repeats=FLAGS.repeats)
        every.append(f"{impl} {_fmt(None if f is None else f * 1e3, '.2f')} / {fb * 1e3:.2f}")
        if best_impl == "none":
            best, best_impl = (f, fb), impl
    return best, best_impl, "; ".join(every) or "n/a"


def linear_flops(batch: int, heads: int, length: int, dim: int, chunk: int,
                 causal: bool) -> float:
    per_position = 2 * chunk * 2 * dim + 4 * dim * dim if causal else 4 * dim * dim
    return float(batch * heads * length * per_position)


def delta_flops(batch: int, heads: int, length: int, k_dim: int, v_dim: int, chunk: int,
                backward: bool = False) -> float:
    """The chunked WY delta rule's matmul FLOPs (module docstring): the forward, or with
    `backward` the forward and the backward pass (which recomputes the chunk)."""
    c, kd, vd = chunk, k_dim, v_dim
    inverse = 4 * c ** 3 * (c.bit_length() - 1)  # log2(C) levels of two C^3 matmuls
    per_chunk = 6 * c * c * kd + 4 * c * c * vd + 6 * c * kd * vd + inverse
    if backward:
        per_chunk += 18 * c * c * kd + 10 * c * c * vd + 14 * c * kd * vd + 4 * c ** 3 + inverse
    return float(batch * heads * -(-length // c) * per_chunk)


# The HBM floor: the bytes a pass must move at least (every input read once, every output
# written once; forward+backward: the forward, then its inputs, its output and the
# cotangent read and one gradient per input written). lra.gpu_suite divides it by the
# device's bandwidth (% of the bandwidth floor beside the TFLOP/s).
FLOOR_COLUMN = "HBM floor MB fwd / fwd+bwd"


def hbm_floor_mb(inputs, out_bytes: int) -> str:
    read = sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in inputs)
    fwd = read + out_bytes
    fwd_bwd = fwd + read + 2 * out_bytes + read  # inputs, output, cotangent; gradients
    return f"{fwd / 1e6:.1f} / {fwd_bwd / 1e6:.1f}"


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _ratio(other: float | None, mine: float | None) -> str:
    return "n/a" if other is None or mine is None else f"{other / mine:.2f}x"


def main(argv):
    del argv
    dtype = jnp.dtype(FLAGS.dtype)
    b, h, d = FLAGS.batch_size, FLAGS.num_heads, FLAGS.head_dim
    run_pallas = jax.default_backend() != "cpu" or FLAGS.interpret
    if FLAGS.tune:
        if jax.default_backend() != "gpu":
            cli.refuse(f"--tune times compiled GPU kernels; this host's backend is "
                       f"{jax.default_backend()} (the interpreter's times say nothing)")
        entries = kernel_tuning.tune(FLAGS.sections, FLAGS.lengths, b=b, h=h, d=d,
                                     dtype=dtype, repeats=FLAGS.repeats,
                                     table=FLAGS.tune_table, time_fn=_time)
        print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}; written to "
              f"{FLAGS.tune_table}\n\n{kernel_tuning.markdown(entries)}")
        return
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}, B={b} H={h} "
          f"D={d} {FLAGS.dtype}; ratios = other time / Pallas time\n")
    if "linear" in FLAGS.sections:
        _linear_section(dtype, b, h, d, run_pallas)
    if "decayed" in FLAGS.sections:
        _decayed_section(dtype, b, h, d, run_pallas)
    if "block_sparse" in FLAGS.sections:
        _block_sparse_section(dtype, b, h, d, run_pallas)
    if "delta" in FLAGS.sections:
        _delta_section(dtype, b, h, d, run_pallas)


def _linear_section(dtype, b: int, h: int, d: int, run_pallas: bool) -> None:
    print("### Linear attention\n")
    print("| L | mode | Pallas fwd ms | Pallas fwd+bwd ms | TFLOP/s fwd | TFLOP/s fwd+bwd "
          "| XLA fwd ms | XLA fwd+bwd ms | vs XLA fwd | vs XLA fwd+bwd | dense fwd+bwd ms "
          "| vs dense fwd | vs dense fwd+bwd | XLA vs dense fwd+bwd "
          f"| every dense impl: fwd / fwd+bwd ms | {MOSAIC_COLUMNS} | {FLOOR_COLUMN} |")
    print("|" + "---|" * 19)
    no_mosaic = _no_mosaic_chunked(linear_mgpu.supports(dtype, d, d, linear_mgpu.CHUNK))
    rng = np.random.default_rng(0)
    for length in map(int, FLAGS.lengths):
        shape = (b, h, length, d)
        q, k = (jax.nn.elu(jnp.asarray(rng.standard_normal(shape, np.float32))).astype(dtype)
                + 1 for _ in range(2))
        v, g = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype) for _ in range(2))
        for mode in FLAGS.modes:
            causal = mode == "causal"
            print(f"L={length} {mode}", file=sys.stderr)
            times = {}
            for name, backend in (("pallas", "pallas"), ("xla", "xla"), ("mosaic", "pallas")):
                if ((backend == "pallas" and not run_pallas)
                        or (name == "mosaic" and no_mosaic)):
                    times[name] = (None, None)
                    continue
                attn = functools.partial(linear_attention, causal=causal, backend=backend,
                                         chunk_size=FLAGS.chunk_size,
                                         gpu_form="mosaic" if name == "mosaic" else "triton")
                fwd, fwd_bwd = _fwd_and_fwd_bwd(attn)
                times[name] = (_time(fwd, q, k, v, repeats=FLAGS.repeats),
                               _time(fwd_bwd, q, k, v, g, repeats=FLAGS.repeats))
            times["dense"], dense_impl, every_dense = _time_dense(causal, q, k, v, g)
            chunk = make_config(q, causal=causal, chunk_size=FLAGS.chunk_size).chunk
            flops = linear_flops(b, h, length, d, chunk, causal)
            pf, pfb = times["pallas"]
            tf_f = None if pf is None else flops / pf / 1e12
            tf_fb = None if pfb is None else 3 * flops / pfb / 1e12
            ms = lambda t: _fmt(None if t is None else t * 1e3, ".2f")  # noqa: E731
            print(f"| {length} | {mode} | {ms(pf)} | {ms(pfb)} | {_fmt(tf_f, '.1f')} | "
                  f"{_fmt(tf_fb, '.1f')} | {ms(times['xla'][0])} | {ms(times['xla'][1])} | "
                  f"{_ratio(times['xla'][0], pf)} | {_ratio(times['xla'][1], pfb)} | "
                  f"{ms(times['dense'][1])} ({dense_impl}) | {_ratio(times['dense'][0], pf)} | "
                  f"{_ratio(times['dense'][1], pfb)} | "
                  f"{_ratio(times['dense'][1], times['xla'][1])} | {every_dense} | "
                  f"{_mosaic_cells(times['mosaic'], pfb)} | {hbm_floor_mb((q, k, v), v.nbytes)} |",
                  flush=True)

    print()


def _decayed_section(dtype, b: int, h: int, d: int, run_pallas: bool) -> None:
    print("### Decayed linear attention\n")
    print("causal; XLA = the same chunked algorithm under lax.scan; chunked_retention = the "
          "models' XLA form (attention_impl=dense)\n")
    print("| L | decay | Pallas fwd ms | Pallas fwd+bwd ms | XLA fwd ms | XLA fwd+bwd ms "
          "| vs XLA fwd | vs XLA fwd+bwd | chunked_retention fwd ms "
          "| chunked_retention fwd+bwd ms | vs chunked_retention fwd "
          f"| vs chunked_retention fwd+bwd | {MOSAIC_COLUMNS} | {FLOOR_COLUMN} |")
    print("|" + "---|" * 16)
    rng = np.random.default_rng(0)
    for length in map(int, FLAGS.lengths):
        shape = (b, h, length, d)
        q, k, v, g = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
                      for _ in range(4))
        for decay in FLAGS.decays:
            # gla's gate at init (logsigmoid(logits) / 16) or retnet-like decays per head.
            logits = rng.standard_normal((b, h, length, d if decay == "gate" else 1))
            log_a = jnp.asarray(jax.nn.log_sigmoid(logits + 4.0) / 16.0, jnp.float32)
            print(f"L={length} {decay}", file=sys.stderr)
            no_mosaic = _no_mosaic_chunked(decayed_mgpu.supports(dtype, d, d, decay == "gate"))
            times = {}
            for name, backend in (("pallas", "pallas"), ("xla", "xla"), ("mosaic", "pallas")):
                if ((backend == "pallas" and not run_pallas)
                        or (name == "mosaic" and no_mosaic)):
                    times[name] = (None, None)
                    continue
                attn = functools.partial(decayed_linear_attention, backend=backend,
                                         chunk_size=FLAGS.chunk_size,
                                         gpu_form="mosaic" if name == "mosaic" else "triton")
                fwd, fwd_bwd = _fwd_and_fwd_bwd(attn)
                times[name] = (_time(fwd, q, k, v, log_a, repeats=FLAGS.repeats),
                               _time(fwd_bwd, q, k, v, log_a, g, repeats=FLAGS.repeats))
            chunk = 16 if decay == "gate" else 64
            fwd, fwd_bwd = _fwd_and_fwd_bwd(
                lambda *a, chunk=chunk: chunked_retention(*a, chunk_size=chunk)[0])
            times["model"] = (_time(fwd, q, k, v, log_a, repeats=FLAGS.repeats),
                              _time(fwd_bwd, q, k, v, log_a, g, repeats=FLAGS.repeats))
            ms = lambda t: _fmt(None if t is None else t * 1e3, ".2f")  # noqa: E731
            (pf, pfb), (xf, xfb), (mf, mfb) = times["pallas"], times["xla"], times["model"]
            print(f"| {length} | {decay} | {ms(pf)} | {ms(pfb)} | {ms(xf)} | {ms(xfb)} | "
                  f"{_ratio(xf, pf)} | {_ratio(xfb, pfb)} | {ms(mf)} | {ms(mfb)} | "
                  f"{_ratio(mf, pf)} | {_ratio(mfb, pfb)} | "
                  f"{_mosaic_cells(times['mosaic'], pfb)} | "
                  f"{hbm_floor_mb((q, k, v, log_a), v.nbytes)} |", flush=True)
    print()


def _dropout_args(backend: str, rate: float) -> dict:
    if not rate:
        return {}
    if backend == "pallas":
        return {"dropout_rate": rate, "dropout_seed": jnp.int32(0)}
    key = jax.random.key(0)
    return {"dropout_fn": lambda w: jnp.where(jax.random.bernoulli(key, 1 - rate, w.shape),
                                              w / (1 - rate), 0.0)}


def _block_sparse_section(dtype, b: int, h: int, d: int, run_pallas: bool) -> None:
    print("### Block-sparse softmax attention\n")
    print(f"tile {FLAGS.block_size or 'default'}; density = kept blocks / all blocks; "
          f"attention dropout {FLAGS.dropout_rate} (Pallas, XLA)\n")
    print("| L | density | Pallas fwd ms | Pallas fwd+bwd ms | TFLOP/s fwd | TFLOP/s fwd+bwd "
          "| XLA fwd ms | XLA fwd+bwd ms | vs XLA fwd | vs XLA fwd+bwd | dense fwd+bwd ms "
          "| vs dense fwd | vs dense fwd+bwd | XLA vs dense fwd+bwd "
          "| every dense impl: fwd / fwd+bwd ms | Mosaic GPU fwd ms | Mosaic GPU fwd+bwd ms "
          f"| Mosaic GPU TFLOP/s fwd+bwd | Mosaic vs Pallas fwd+bwd | {FLOOR_COLUMN} |")
    print("|" + "---|" * 20)
    rng = np.random.default_rng(0)
    for length in map(int, FLAGS.lengths):
        shape = (b, h, length, d)
        q, k, v, g = (jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
                      for _ in range(4))
        cfg = block_sparse_config(q, k, masks.all_(), block_q=FLAGS.block_size,
                              block_k=FLAGS.block_size)
        tile = cfg.block_q
        mosaic_tile = block_sparse_mgpu.BLOCK
        no_mosaic = _no_mosaic(cfg._replace(block_q=mosaic_tile, block_k=mosaic_tile), q)
        if no_mosaic and length == int(FLAGS.lengths[0]):
            print(f"no Mosaic GPU form timed: {no_mosaic}", file=sys.stderr)
        times_dense, dense_impl, every_dense = _time_dense(False, q, k, v, g)
        for density in map(float, FLAGS.densities):
            pattern = (masks.all_() if density >= 1.0
                       else masks.random(density, seed=0, block=tile))
            kept = pattern.blocks(length, length, tile, tile).num_nonempty
            print(f"L={length} density={density}", file=sys.stderr)
            times = {}
            for name, backend in (("pallas", "pallas"), ("xla", "xla"), ("mosaic", "pallas")):
                if ((backend == "pallas" and not run_pallas)
                        or (name == "mosaic" and no_mosaic)):
                    times[name] = (None, None)
                    continue
                # The Mosaic form's tile is 64 (pattern.blocks of the same pattern, so the
                # kept fraction is the same at tile 64 for the random pattern's tile).
                attn = functools.partial(block_sparse_attention, pattern=pattern,
                                         backend=backend, block_q=tile, block_k=tile,
                                         gpu_form="mosaic" if name == "mosaic" else "triton",
                                         **_dropout_args(backend, FLAGS.dropout_rate))
                fwd, fwd_bwd = _fwd_and_fwd_bwd(attn)
                times[name] = (_time(fwd, q, k, v, repeats=FLAGS.repeats),
                               _time(fwd_bwd, q, k, v, g, repeats=FLAGS.repeats))
            flops = 4.0 * b * h * d * tile * tile * kept
            pf, pfb = times["pallas"]
            tf_f = None if pf is None else flops / pf / 1e12
            tf_fb = None if pfb is None else 3.5 * flops / pfb / 1e12
            mf, mfb = times["mosaic"]
            tf_mfb = None if mfb is None else 3.5 * flops / mfb / 1e12
            ms = lambda t: _fmt(None if t is None else t * 1e3, ".2f")  # noqa: E731
            measured = kept / (-(-length // tile)) ** 2
            print(f"| {length} | {measured:.2f} | {ms(pf)} | {ms(pfb)} | {_fmt(tf_f, '.1f')} | "
                  f"{_fmt(tf_fb, '.1f')} | {ms(times['xla'][0])} | {ms(times['xla'][1])} | "
                  f"{_ratio(times['xla'][0], pf)} | {_ratio(times['xla'][1], pfb)} | "
                  f"{ms(times_dense[1])} ({dense_impl}) | {_ratio(times_dense[0], pf)} | "
                  f"{_ratio(times_dense[1], pfb)} | {_ratio(times_dense[1], times['xla'][1])} "
                  f"| {every_dense} | {ms(mf)} | {ms(mfb)} | {_fmt(tf_mfb, '.1f')} "
                  f"| {_ratio(pfb, mfb)} | {hbm_floor_mb((q, k, v), v.nbytes)} |", flush=True)
    print()


# The Mosaic GPU forms' columns (attention_impl=pallas_mosaic; '-' where not timed).
MOSAIC_COLUMNS = "Mosaic GPU fwd ms | Mosaic GPU fwd+bwd ms | Mosaic vs Pallas fwd+bwd"


def _mosaic_cells(times, pallas_fwd_bwd) -> str:
    mf, mfb = times
    ms = lambda t: _fmt(None if t is None else t * 1e3, ".2f")  # noqa: E731
    return f"{ms(mf)} | {ms(mfb)} | {_ratio(pallas_fwd_bwd, mfb)}"


def _no_mosaic_chunked(why: str | None) -> str | None:
    """Why a chunked kernel's Mosaic GPU form is not timed here (None: it is), said once."""
    if jax.default_backend() != "gpu":
        return "not on a GPU"
    if why:
        print(f"no Mosaic GPU form timed: {why}", file=sys.stderr)
    return why


def _no_mosaic(cfg, q) -> str | None:
    """Why the block-sparse Mosaic GPU form is not timed here (None: it is)."""
    if jax.default_backend() != "gpu":
        return "not on a GPU (its interpreter times nothing useful)"
    return block_sparse_mgpu.supports(cfg, q.dtype, q.shape[-1], q.shape[-1])


def _delta_inputs(rng, dtype, b: int, h: int, length: int, d: int):
    """q, k (L2-normalised), v, the cotangent g (in `dtype`), beta in (0, 1) and log alpha
    <= 0 (float32) as the layer feeds them (module docstring)."""
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32))  # noqa: E731
    q, k = (l2_normalise(normal(b, h, length, d)).astype(dtype) for _ in range(2))
    v, g = (normal(b, h, length, d).astype(dtype) for _ in range(2))
    beta = jax.nn.sigmoid(normal(b, h, length))
    a = jnp.asarray(rng.uniform(0.0, 16.0, (1, h, 1)), jnp.float32)
    dt = jnp.exp(jnp.asarray(rng.uniform(np.log(1e-3), np.log(1e-1), (b, h, length)),
                             jnp.float32))
    return q, k, v, g, beta, -a * dt


def _delta_section(dtype, b: int, h: int, d: int, run_pallas: bool) -> None:
    print("### Delta rule\n")
    print("causal; XLA = the same chunked algorithm under lax.scan; chunk_delta_rule = the "
          "models' XLA form (attention_impl=dense, chunk 64); dense = fused softmax "
          "attention at the same shape (timed once a run: the linear section's causal "
          "reference where it ran); FLOPs: the chunked "
          "WY algorithm's, the UT inverse included (forward+backward counted as run)\n")
    print("| L | rule | Pallas fwd ms | Pallas fwd+bwd ms | TFLOP/s fwd | TFLOP/s fwd+bwd "
          "| XLA fwd ms | XLA fwd+bwd ms | vs XLA fwd | vs XLA fwd+bwd "
          "| chunk_delta_rule fwd ms | chunk_delta_rule fwd+bwd ms | vs chunk_delta_rule fwd "
          "| vs chunk_delta_rule fwd+bwd | dense fwd+bwd ms | vs dense fwd | vs dense fwd+bwd "
          f"| every dense impl: fwd / fwd+bwd ms | {MOSAIC_COLUMNS} | {FLOOR_COLUMN} |")
    print("|" + "---|" * 22)
    no_mosaic = _no_mosaic_chunked(delta_mgpu.supports(dtype, d, d))
    rng = np.random.default_rng(0)
    for length in map(int, FLAGS.lengths):
        q, k, v, g, beta, log_a = _delta_inputs(rng, dtype, b, h, length, d)
        for rule in FLAGS.delta_rules:
            gated = rule == "gated_deltanet"
            args = (q, k, v, beta) + ((log_a,) if gated else ())
            print(f"L={length} {rule}", file=sys.stderr)
            times = {}
            forms = (("pallas", functools.partial(delta_rule, backend="pallas",
                                                  chunk_size=FLAGS.chunk_size)),
                     ("xla", functools.partial(delta_rule, backend="xla",
                                               chunk_size=FLAGS.chunk_size)),
                     ("model", chunk_delta_rule),
                     ("mosaic", functools.partial(delta_rule, backend="pallas",
                                                  chunk_size=FLAGS.chunk_size,
                                                  gpu_form="mosaic")))
            for name, rule_fn in forms:
                if (name in ("pallas", "mosaic") and not run_pallas
                        or name == "mosaic" and no_mosaic):
                    times[name] = (None, None)
                    continue
                # o in v's dtype (chunk_delta_rule's is float32): the cotangent's.
                fwd, fwd_bwd = _fwd_and_fwd_bwd(
                    lambda *a, f=rule_fn: f(*a)[0].astype(a[2].dtype))
                times[name] = (_time(fwd, *args, repeats=FLAGS.repeats),
                               _time(fwd_bwd, *args, g, repeats=FLAGS.repeats))
            times["dense"], dense_impl, every_dense = _time_dense(True, q, k, v, g)
            chunk = delta_config(q, k, v, beta, None, chunk_size=FLAGS.chunk_size).chunk
            (pf, pfb), (xf, xfb), (mf, mfb) = times["pallas"], times["xla"], times["model"]
            tf_f = None if pf is None else delta_flops(b, h, length, d, d, chunk) / pf / 1e12
            tf_fb = None if pfb is None else delta_flops(b, h, length, d, d, chunk,
                                                         backward=True) / pfb / 1e12
            ms = lambda t: _fmt(None if t is None else t * 1e3, ".2f")  # noqa: E731
            print(f"| {length} | {rule} | {ms(pf)} | {ms(pfb)} | {_fmt(tf_f, '.1f')} | "
                  f"{_fmt(tf_fb, '.1f')} | {ms(xf)} | {ms(xfb)} | {_ratio(xf, pf)} | "
                  f"{_ratio(xfb, pfb)} | {ms(mf)} | {ms(mfb)} | {_ratio(mf, pf)} | "
                  f"{_ratio(mfb, pfb)} | {ms(times['dense'][1])} ({dense_impl}) | "
                  f"{_ratio(times['dense'][0], pf)} | {_ratio(times['dense'][1], pfb)} | "
                  f"{every_dense} | {_mosaic_cells(times['mosaic'], pfb)} | "
                  f"{hbm_floor_mb(args, v.nbytes)} |", flush=True)
    print()


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=cli.parse_flags_or_refuse)
