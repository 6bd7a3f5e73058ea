"""scripts/zoology_init_probe.py (results/cpu/mqar_zoology_init_probe.md): Zoology's draw
for every nnx.Linear and nnx.Embed of the MQAR model, nothing else touched; its arguments."""
import importlib.util
import os

import numpy as np
import pytest
from flax import nnx

import lra.tasks
from lra.training import model as model_lib


def _probe():
    spec = importlib.util.spec_from_file_location(
        "zoology_init_probe", os.path.join(os.path.dirname(__file__), "..", "scripts",
                                           "zoology_init_probe.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_zoology_init_redraws_linears_and_embeddings_only():
    probe = _probe()
    config = probe.config_for("gated_deltanet", 0)
    assert (config.init_scheme, config.tie_head) == ("own", False)
    model = model_lib.build_model(config, lra.tasks.get("mqar"))
    before = {path: np.asarray(v) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    probe.zoology_init(model, seed=3)
    after = {path: np.asarray(v) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    redrawn = set()
    for path, module in nnx.iter_graph(model):
        if isinstance(module, nnx.Linear):
            kernel = np.asarray(module.kernel.value)
            # N(0, 0.02) within 5 standard errors of its mean and standard deviation
            error = 5 * 0.02 / np.sqrt(kernel.size)
            assert abs(kernel.mean()) < error and abs(kernel.std() - 0.02) < error, path
            redrawn.add(tuple(path) + ("kernel",))
            if module.bias is not None:
                assert not np.asarray(module.bias.value).any(), path
                redrawn.add(tuple(path) + ("bias",))
        elif isinstance(module, nnx.Embed):
            table = np.asarray(module.embedding.value)
            error = 5 * 0.02 / np.sqrt(table.size)
            assert abs(table.mean()) < error and abs(table.std() - 0.02) < error, path
            redrawn.add(tuple(path) + ("embedding",))
    assert redrawn and len(redrawn) < len(after)
    # The rest (the decay's A_log and dt_bias, the short convolution, the norms) is kept.
    kept = [p for p in after if tuple(p) not in redrawn]
    assert kept and all(np.array_equal(before[p], after[p]) for p in kept)
    # Our own draw (xavier at width 64) was several times wider than Zoology's.
    q = next(p for p in redrawn if p[-1] == "kernel")
    assert np.asarray(before[q]).std() > 2 * np.asarray(after[q]).std()


def test_probe_arguments():
    parse = _probe().parse
    assert parse(["p", "w", "1", "gla"]) == ("w", 1, "gla", False, None)
    assert parse(["p", "w", "0", "gla", "own", "lr=0.01"]) == ("w", 0, "gla", True, 0.01)
    for argv in (["p", "w", "1"], ["p", "w", "x", "gla"], ["p", "w", "1", "gla", "lr=a"],
                 ["p", "w", "1", "gla", "fast"]):
        with pytest.raises(SystemExit, match="usage: zoology_init_probe.py"):
            parse(argv)
