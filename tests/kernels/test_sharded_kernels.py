"""Pallas kernels under a device mesh: XLA cannot partition a Pallas call, so the kernels
shard_map themselves by the enclosing logical rules (4 CPU devices, in a subprocess)."""
import os
import subprocess
import sys

_SHARDED_SCRIPT = r"""
import functools, importlib, sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
sys.path.insert(0, sys.argv[1])
from models import masks
bsa = importlib.import_module("models.kernels.block_sparse_attention")
lin = importlib.import_module("models.kernels.linear_attention")
dr = importlib.import_module("models.kernels.delta_rule")
from models.attention.delta import l2_normalise
assert jax.device_count() == 4
rng = np.random.default_rng(0)
q, k, v, g = (jnp.asarray(rng.standard_normal((4, 4, 40, 8)), jnp.float32) for _ in range(4))
padding = jnp.arange(40)[None] < jnp.array([[40], [9], [33], [40]])
def check(attention, args, heads_split):
    # args: the inputs, then the outputs' cotangent.
    def run(*args):
        *inputs, g = args
        out, vjp = jax.vjp(attention, *inputs)
        return out, vjp(g)
    expected = jax.jit(run)(*args)
    # Auto axes as the training loop's mesh; Explicit ones must work too.
    for axis_type in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
        mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(axis_type,) * 2)
        with jax.set_mesh(mesh), nnx.logical_axis_rules((("batch", "data"),
                                                         ("act_heads", "model"))):
            x = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(
                mesh, P("data", "model"))), list(args))
            jaxpr = str(jax.make_jaxpr(run)(*x))
            got = jax.jit(run)(*x)
        assert "shard_map" in jaxpr
        # Per-head patterns are split by batch only; shared ones by batch and heads.
        specs = jaxpr.split("in_specs=")[1].split("\n")[0]
        assert ("model" in specs) == heads_split, specs
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
for pattern in (masks.local(5) | masks.global_tokens([0]),
                masks.per_head([masks.local(2), masks.strided(5)], 4)):
    check(functools.partial(bsa.block_sparse_attention, pattern=pattern, padding_mask=padding,
                            backend="pallas", block_q=16, block_k=16, dropout_rate=0.3,
                            dropout_seed=jnp.int32(11)),
          (q, k, v, g), heads_split=pattern.num_heads is None)
check(functools.partial(lin.linear_attention, causal=True, chunk_size=16),
      (jax.nn.elu(q) + 1, jax.nn.elu(k) + 1, v, g), heads_split=True)
# The delta rule (two outputs: o and the final state S_L), gated.
beta, log_alpha = (jnp.asarray(rng.standard_normal((4, 4, 40)), jnp.float32) for _ in range(2))
s_cot = jnp.asarray(rng.standard_normal((4, 4, 8, 8)), jnp.float32)
check(functools.partial(dr.delta_rule, chunk_size=16),
      (l2_normalise(q), l2_normalise(k), v, jax.nn.sigmoid(beta),
       jax.nn.log_sigmoid(3 * log_alpha), (g, s_cot)), heads_split=True)
print("OK")
"""


def test_kernels_run_per_shard_and_match_one_device(tmp_path):
    """Under a (data 2, model 2) mesh with the training loop's activation rules, the
    block-sparse (with dropout: global batch/head hash indices), linear-attention and
    delta-rule (gated; both outputs) kernels run per shard via shard_map and give the
    one-device values and gradients, on Auto and Explicit mesh axes."""
    script = tmp_path / "sharded.py"
    script.write_text(_SHARDED_SCRIPT)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # 4 host (CPU) devices: the forced count applies to the CPU backend only, so on a GPU
    # machine the subprocess must not pick the GPU (one device).
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("XLA_FLAGS", "")
               + " --xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, str(script), repo], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
