"""The tuning table (models/kernels/tuning.py, issue 70 section 2): lookup (exact, nearest
said once), the table's parameters reaching a compiled Triton call (read back from the
CUDA lowering: num_warps, num_stages and the grid the tile gives), the interpreter and TPU
untouched, and `lra.bench_kernels --tune`'s driver writing the fastest candidate (its
timings stood in for by the lowering, as this host has no GPU)."""
import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from lra.gpu import kernel_tuning
from models import masks
from models.kernels import targets, tuning
from models.kernels.block_sparse_attention import block_sparse_attention
from models.kernels.linear_attention import linear_attention
from tests.kernels import lowering

H100 = targets.H100


def _entry(kernel, length, tile, warps, stages, device=H100, dtype="bfloat16", head_dim=64):
    return {"kernel": kernel, "device": device, "dtype": dtype, "head_dim": head_dim,
            "length": length, tuning.TILE_PARAM[kernel]: tile, "num_warps": warps,
            "num_stages": stages, "fwd_bwd_ms": 1.0, "candidates": 1, "source": "test"}


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = str(tmp_path / "tuning.json")
    monkeypatch.setattr(tuning, "TABLE", path)
    targets._SAID.clear()
    return path


def test_the_committed_table_reads_and_covers_every_kernel():
    entries = tuning.load()
    assert {e["kernel"] for e in entries} == set(tuning.KERNELS)
    for e in entries:
        assert set(tuning._params(e)) == {tuning.TILE_PARAM[e["kernel"]], "num_warps",
                                          "num_stages"}
        assert e["length"] == tuning.length_bucket(e["length"])


def test_lookup_exact_and_nearest_said_once(table, capfd):
    tuning.write([_entry("linear", 1024, 32, 8, 2), _entry("linear", 8192, 128, 4, 1),
                  _entry("linear", 1024, 64, 4, 3, device="NVIDIA H200")], table)
    with targets.abstract_gpu():
        assert tuning.lookup("linear", jnp.bfloat16, 64, 1000) == {
            "chunk": 32, "num_warps": 8, "num_stages": 2}  # bucket 1024, exact
        assert capfd.readouterr().err == ""
        # 6000 -> bucket 8192; head dim 128 -> the nearest one (64) on the same device.
        assert tuning.lookup("linear", jnp.bfloat16, 128, 6000)["chunk"] == 128
        tuning.lookup("linear", jnp.bfloat16, 128, 6000)
    err = capfd.readouterr().err
    assert err.count("tuning: no entry for linear on NVIDIA H100 80GB HBM3") == 1
    assert "head dim 128, length 8192" in err and "lra.bench_kernels --tune" in err
    with pytest.raises(ValueError, match="unknown kernel"):
        tuning.lookup("flash", jnp.bfloat16, 64, 64)


def test_write_replaces_an_entry_of_the_same_key(table):
    tuning.write([_entry("delta", 4096, 64, 4, 1)], table)
    entries = tuning.write([_entry("delta", 4096, 32, 8, 2), _entry("delta", 1024, 32, 4, 1)],
                           table)
    assert [(e["length"], e["chunk"]) for e in entries] == [(1024, 32), (4096, 32)]
    assert json.load(open(table))["entries"] == entries


def _launch(text):
    return ([int(x) for x in re.findall(r"num_warps = (\d+)", text)],
            [int(x) for x in re.findall(r"num_stages = (\d+)", text)],
            [int(x) for x in re.findall(r"grid_z = (\d+)", text)])


def test_table_reaches_the_compiled_triton_calls(table):
    """Block-sparse at L 256 with a tuned 128 tile, 8 warps, 3 stages: 2 query blocks in
    the grid; linear attention's 8 warps; an explicit tile wins over the table's."""
    tuning.write([_entry("block_sparse", 256, 128, 8, 3), _entry("linear", 256, 32, 8, 2)],
                 table)
    q = jax.ShapeDtypeStruct((1, 2, 256, 64), jnp.bfloat16)
    attn = lambda q, **kw: block_sparse_attention(q, q, q, masks.causal(), backend="pallas",
                                                  **kw)
    warps, stages, grid = _launch(lowering.for_cuda(attn, q))
    assert warps == [8] and stages == [3] and grid == [2]
    warps, _, grid = _launch(lowering.for_cuda(lambda q: attn(q, block_q=64, block_k=64), q))
    assert warps == [8] and grid == [4]
    text = lowering.for_cuda(lambda q: linear_attention(q, q, q, causal=True,
                                                        backend="pallas"), q)
    assert _launch(text)[:2] == ([8], [2])


def test_interpreted_and_tpu_forms_keep_their_defaults(table):
    tuning.write([_entry("linear", 64, 16, 8, 2)], table)
    target = targets.Target("pallas", "gpu", True)
    assert tuning.for_target("linear", target, jnp.bfloat16, 64, 64, None) == (None, None)
    target = targets.Target("pallas", "tpu", False)
    assert tuning.for_target("linear", target, jnp.bfloat16, 64, 64, 32) == (32, None)
    with targets.abstract_gpu():  # compiled Triton: the table's; the tile capped at L
        tuning.write([_entry("linear", 64, 128, 8, 2)], table)
        got = tuning.for_target("linear", targets.Target("pallas", "gpu", False),
                                jnp.bfloat16, 64, 40, None)
    assert got == (64, (8, 2))


def test_tune_writes_the_fastest_candidate(table, monkeypatch):
    """The driver with a stand-in clock that reads each candidate's lowering for CUDA:
    the forced parameters reach the compiled call, and the fastest (here: 8 warps,
    2 stages, tile 64) is written for this device kind."""
    monkeypatch.setitem(tuning.CANDIDATES, "block_sparse",
                        {"block": (64, 128), "num_warps": (4, 8), "num_stages": (1, 2)})

    def clock(fn, *args, repeats):
        warps, stages, grid = _launch(lowering.for_cuda(fn, *args))
        block = 128 // grid[0]  # L 128: one or two query blocks
        return 1.0 + (warps[0] != 8) + (stages[0] != 2) + (block != 64)

    with targets.abstract_gpu():
        entries = kernel_tuning.tune(["block_sparse"], ["128"], b=1, h=1, d=64,
                                     dtype=jnp.bfloat16, repeats=1, table=table,
                                     time_fn=clock)
    assert [(e["block"], e["num_warps"], e["num_stages"], e["candidates"]) for e in entries] \
        == [(64, 8, 2, 8)]
    assert entries[0]["device"] == H100 and tuning.load(table) == entries
    assert "| block_sparse | NVIDIA H100 80GB HBM3 | bfloat16 | 64 | 128 | 64 | 8 | 2 |" \
        in kernel_tuning.markdown(entries)


def test_tune_is_refused_off_a_gpu():
    done = subprocess.run([sys.executable, "-m", "lra.bench_kernels", "--tune",
                           "--lengths=64"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--tune times compiled GPU kernels" in done.stderr
