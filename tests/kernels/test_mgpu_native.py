"""On a GPU only (skipped elsewhere): the Mosaic GPU kernels compiled (gpu_form="mosaic":
block-sparse, linear and decayed attention, the delta rule) against the Triton kernels,
output and gradients, bf16. The GPU suite's kernel-test stage selects these (their names avoid its
"not mosaic" filter, which leaves out the TPU flavour); on this CPU their numerics are
checked in the Mosaic GPU interpreter (test_*_mgpu.py)."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import masks
from models.kernels import mgpu_common
from models.kernels.block_sparse_attention import block_sparse_attention

la = importlib.import_module("models.kernels.linear_attention")
da = importlib.import_module("models.kernels.decayed_attention")
dr = importlib.import_module("models.kernels.delta_rule")

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "gpu" or not mgpu_common.available(),
    reason="compiled Mosaic GPU kernels need a GPU and JAX's Mosaic GPU API (0.12)")


def _calls():
    mask = jnp.arange(512)[None] < jnp.array([[512], [300]])
    return {
        "block_sparse_causal": lambda form, q, k, v: block_sparse_attention(
            q, k, v, masks.causal() | masks.local(100), padding_mask=mask,
            backend="pallas", gpu_form=form),
        "linear_causal": lambda form, q, k, v: la.linear_attention(
            jax.nn.elu(q) + 1, jax.nn.elu(k) + 1, v, causal=True, gpu_form=form),
        "decayed_scalar": lambda form, q, k, v: da.decayed_linear_attention(
            q, k, v, jnp.full(q.shape[:3] + (1,), -0.05), gpu_form=form),
        # gla's shape: a gate per key feature, from ~1 to ~e^-3 a position.
        "decayed_gate": lambda form, q, k, v: da.decayed_linear_attention(
            q, k, v, jax.nn.log_sigmoid(q.astype(jnp.float32) + 2.0), gpu_form=form),
        # gated_deltanet's shape: unit keys, beta in (0, 1), a decay per position.
        "delta_rule_gated": lambda form, q, k, v: dr.delta_rule(
            q, _unit(k), v, jnp.full(q.shape[:3], 0.5), jnp.full(q.shape[:3], -0.05),
            gpu_form=form)[0],
    }


def _unit(x):
    x = x.astype(jnp.float32)
    return (x / jnp.linalg.norm(x, axis=-1, keepdims=True)).astype(jnp.bfloat16)


@pytest.mark.parametrize("name", list(_calls()))
def test_compiled_on_a_gpu_equals_triton(name):
    ks = jax.random.split(jax.random.key(0), 4)
    q, k, v, g = (jax.random.normal(x, (2, 4, 512, 64)).astype(jnp.bfloat16) for x in ks)
    call = _calls()[name]

    def run(form):
        out, vjp = jax.vjp(lambda *xs: call(form, *xs), q, k, v)
        return (out, *vjp(g))

    for a, b in zip(jax.jit(lambda: run("triton"))(), jax.jit(lambda: run("mosaic"))()):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.max(np.abs(a - b)) <= 2e-2 * np.max(np.abs(a))
