"""scripts/mad_init/compare.py (results/cpu/mad_init_vs_mad_lab.md), without torch: each of
its roles names parameters of our model (a renamed parameter would leave a role empty), and
its test tells one law from another (sd and mean, the uniform laws' bound, the per-tensor
scaling that compares a law across shapes)."""
from __future__ import annotations

import importlib.util
import math
import os
import re

import numpy as np


def _compare():
    spec = importlib.util.spec_from_file_location("mad_init_compare", os.path.join(
        os.path.dirname(__file__), "..", "..", "scripts", "mad_init", "compare.py"))
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    return compare


def test_every_role_names_parameters_of_our_model():
    compare = _compare()
    assert set(compare.ROLES) == {"gla", "hyena", "compression/gla", "compression/hyena"}
    for row, roles in compare.ROLES.items():
        params, tied = compare.ours(row, [0])
        assert not tied, row  # MAD's head is its own Linear
        for role in roles:
            if role.ours is not None:
                assert any(re.search(role.ours + "$", k) for k in params), (row, role.label)
            if role.law in ("torch", "xavier") and role.ours is not None:
                # the kernels of a uniform law are 2-D (fan_in and fan_out are read there)
                assert all(len(t[0]) == 2 for t in compare.select(
                    params, role.ours, theirs=False)), (row, role.label)


def test_agrees_tells_one_law_from_another():
    compare = _compare()
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 0.02, 8192), rng.normal(0, 0.02, 8192)
    s = compare.summarize
    assert compare.agrees(s(a), s(b))
    assert not compare.agrees(s(a), s(rng.normal(0, 0.125, 8192)))  # LRA's xavier
    assert not compare.agrees(s(a), s(rng.normal(0, 0.0156, 8192)))  # GLA's xavier 2^-2.5
    assert not compare.agrees(s(a), s(rng.normal(0.01, 0.02, 8192)))
    assert compare.agrees(s(np.zeros(64)), s(np.zeros(16)))
    assert not compare.agrees(s(np.zeros(64)), s(rng.uniform(-0.05, 0.05, 64)))
    # xavier-uniform with gain 2^-2.5 at 16 x 128 (sd 0.0208) against N(0, 0.02): the sd
    # alone cannot tell them apart, the bound does
    role = compare.Role("x", "", "", "xavier")
    bnd = compare.bound("xavier", (16, 128), True)
    uni = [((16, 128), *_moments(rng.uniform(-bnd, bnd, (16, 128)))) for _ in range(8)]
    nrm = [((128, 16), *_moments(rng.normal(0, 0.02, (128, 16)))) for _ in range(8)]
    uni_ours = [((128, 16), *_moments(rng.uniform(-bnd, bnd, (128, 16)))) for _ in range(8)]
    pu, pn = compare.pool(uni, role, True), compare.pool(nrm, role, False)
    assert pu.ratio <= 1 < pn.ratio and abs(pu.sd - pn.sd) < 0.05 * pu.sd
    assert not compare.agrees(pu, pn)
    assert compare.agrees(pu, compare.pool(uni_ours, role, False))


def test_the_law_is_compared_across_fan_in():
    """torch's U(+-1/sqrt(fan_in)) at mad-lab's w3 (torch layout 128 x 352) and our fc2
    (ours: 512 x 128): the raw values differ, sd x sqrt(fan_in) agrees."""
    compare = _compare()
    rng = np.random.default_rng(1)
    w3 = [((128, 352), *_moments(rng.uniform(-1, 1, (128, 352)) / math.sqrt(352)))
          for _ in range(4)]
    fc2 = [((512, 128), *_moments(rng.uniform(-1, 1, (512, 128)) / math.sqrt(512)))
           for _ in range(4)]
    raw = compare.Role("w3 / fc2", "", "", "torch")
    law = raw._replace(scale="fan_in")
    assert not compare.agrees(compare.pool(w3, raw, True), compare.pool(fc2, raw, False))
    a, b = compare.pool(w3, law, True), compare.pool(fc2, law, False)
    assert compare.agrees(a, b) and abs(a.sd - 1 / math.sqrt(3)) < 0.01
    assert a.ratio <= 1 and b.ratio <= 1
    # read in the wrong layout, our fc2 would be bounded by 1/sqrt(128): caught
    assert not compare.agrees(a, compare.pool(fc2, law, True))


def _moments(x: np.ndarray) -> tuple:
    x = np.asarray(x, np.float64)
    return x.size, x.sum(), (x * x).sum(), np.abs(x).max()


def test_the_parts_probe_swaps_one_part_and_keeps_the_rest():
    """scripts/mad_init/probe_parts.py: `mad` with the embedding (or the Linear kernels) of
    `own` takes that part bitwise from the own build and keeps every other parameter."""
    import lra.tasks
    from flax import nnx

    from lra.training import model as model_lib

    spec = importlib.util.spec_from_file_location("mad_probe_parts", os.path.join(
        os.path.dirname(__file__), "..", "..", "scripts", "mad_init", "probe_parts.py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)

    def build(init):
        config = probe.config_for("in_context_recall", "based", 0, init)
        return model_lib.build_model(config, lra.tasks.get(config.task).with_options(
            **config.task_options.to_dict()))

    def params(model):
        return {tuple(p): np.asarray(v)
                for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}

    own, mad = params(build("own")), params(build("mad"))
    for part, n in (("embedding", 1), ("kernels", 13)):
        swapped = build("mad")
        assert probe.swap(swapped, build("own"), part) == n
        got = params(swapped)
        moved = {p for p in got if not np.array_equal(got[p], mad[p])}
        assert moved and all(np.array_equal(got[p], own[p]) for p in moved)
        leaf = "embedding" if part == "embedding" else "kernel"
        assert all(p[-1] == leaf for p in moved), moved
