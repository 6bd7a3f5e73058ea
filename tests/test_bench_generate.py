"""lra.bench_generate: the generation-speed table runs end to end at tiny sizes (timings
are measured, never asserted)."""
from __future__ import annotations

import math

import pytest

from lra import bench_generate


def test_table_has_every_row_and_the_cache_sizes():
    sizes = {"emb_dim": 16, "num_layers": 1, "num_heads": 2}
    rows = bench_generate.run(["transformer", "linear"], [24, 40], steps=4, batch=1,
                              repeats=1, sizes=sizes)
    assert [r["model"] for r in rows] == [bench_generate.NO_CACHE, "transformer", "linear"]
    assert all(len(r["seconds"]) == 2 and min(r["seconds"]) > 0 for r in rows)
    kv, state = rows[1]["bytes"], rows[2]["bytes"]
    assert kv[1] > kv[0]  # a kv cache grows with max_length
    assert state[0] == state[1]  # linear attention's state does not
    text = bench_generate.table(rows, [24, 40])
    assert text.count("\n") == 2 + len(rows) - 1 and "recurrent_state" in text


def test_growth_exponent():
    assert bench_generate.growth([1.0, 4.0], [256, 1024]) == pytest.approx(1.0)
    assert bench_generate.growth([2.0, 2.0], [256, 8192]) == 0.0
    assert math.isnan(bench_generate.growth([1.0], [256]))


def test_steps_must_fit_the_lengths():
    with pytest.raises(ValueError, match="steps"):
        bench_generate.run(["linear"], [8], steps=8, batch=1, repeats=1, sizes={})
