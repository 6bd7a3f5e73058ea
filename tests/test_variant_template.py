"""docs/variant_template.py, the "Adding a variant" example (docs/variants.md): loaded from
its file as a user's own module is, it registers, passes the conformance, decoding and
receptive-field checks every registered variant passes, and trains through
`python -m lra.launch --import=<module>` from the user's folder without the package being
edited (the one subprocess run here, ~20 s). Unregistered afterwards, so the other tests
see the package's variants only.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from models import registry

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "docs" / "variant_template.py"


@pytest.fixture(scope="module")
def template():
    spec = importlib.util.spec_from_file_location("variant_template_under_test", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers module.NAME
    try:
        yield module
    finally:
        registry._unregister(module.NAME)


def _checks(test_module):
    """The module's test functions taking a variant `name`, with their other parameters'
    values (from their parametrize marks)."""
    for fname, fn in inspect.getmembers(test_module, inspect.isfunction):
        if not fname.startswith("test_") or "name" not in inspect.signature(fn).parameters:
            continue
        marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
        grids = [{}]
        for mark in marks:
            keys = [a.strip() for a in mark.args[0].split(",")]
            rows = []  # every tier's values (tests/tiers.py marks some exhaustive)
            for v in mark.args[1]:
                v = v.values if hasattr(v, "values") else (v if len(keys) > 1 else (v,))
                row = {k: x for k, x in zip(keys, v) if k != "name"}
                if row not in rows:
                    rows.append(row)
            grids = [{**g, **row} for g in grids for row in rows]
        yield fname, fn, grids


@pytest.mark.parametrize("suite", ["conformance", "decoding", "fidelity"])
def test_the_template_passes_what_every_variant_passes(template, suite):
    import jax

    test_module = importlib.import_module(f"tests.models.test_{suite}")
    ran = 0
    with jax.default_matmul_precision("highest"):
        for fname, fn, grids in _checks(test_module):
            if fname in ("test_residual_is_a_gated_update",):
                continue  # only for variants that take a residual
            if suite == "decoding" and fname != "test_decoding_equals_the_parallel_causal_forward":
                continue  # the others are about given variants
            if suite == "fidelity" and fname != "test_positions_reach_what_the_variant_declares":
                continue
            for kwargs in grids:
                try:
                    fn(name=template.NAME, **kwargs)
                    ran += 1
                except pytest.skip.Exception:
                    pass
    assert ran >= {"conformance": 8, "decoding": 1, "fidelity": 2}[suite]


def test_a_variant_outside_the_package_trains_with_import(tmp_path):
    """The user's folder holds their module and nothing of the package's; `--import` reads
    it before the config (whose presets name the model) is built."""
    shutil.copy(TEMPLATE, tmp_path / "my_variants.py")
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("LRA_IMPORTS", None)
    workdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "lra.launch", "--import=my_variants",
           "--config=configs/mqar.py:model=relu_linear,runlocal",
           f"--workdir={workdir}", "--config.num_train_steps=2"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    assert results["config"]["model"] == "relu_linear"
    assert "my_variants" in (workdir / "log.txt").read_text()  # the command, to rerun it

    # Without the import the name is unknown, and the refusal says how to add one.
    proc = subprocess.run(cmd[:3] + cmd[4:], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert "unknown model 'relu_linear'" in proc.stderr and "--import" in proc.stderr
    # A module named in LRA_IMPORTS that is not there: one line, not the traceback the
    # config's parse wrapped it in.
    proc = subprocess.run(cmd[:3] + cmd[4:], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "LRA_IMPORTS": "no_such_user_module"}, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: LRA_IMPORTS names 'no_such_user_module': no such "
                                  "module"), proc.stderr


def test_import_flag_and_the_sweep_forwarding(tmp_path, monkeypatch):
    """--import in every spelling; import_variants imports from the current folder,
    exports the module (LRA_IMPORTS) and the folder (PYTHONPATH); a sweep's run command
    carries the flag; a module that is not there is refused in one line."""
    from lra.runs import cli, plan

    argv = ["launch.py", "--import=a,b", "-import", "c", "--config=x", "--", "--import=d"]
    assert cli.import_flag(argv) == ["a", "b", "c"]
    (tmp_path / "user_variants_probe.py").write_text(
        TEMPLATE.read_text().replace('NAME = "relu_linear"', 'NAME = "relu_linear_probe"'))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    # setenv first, so that the teardown restores LRA_IMPORTS as it was (absent): a bare
    # delenv of an absent variable records nothing, and import_variants' export leaked
    # into every later test of the worker (the registry imports what it names).
    monkeypatch.setenv(cli.IMPORTS_ENV, "")
    monkeypatch.delenv(cli.IMPORTS_ENV)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    try:
        cli.import_variants(["user_variants_probe"])
        assert "relu_linear_probe" in registry.available()
        assert os.environ[cli.IMPORTS_ENV] == "user_variants_probe"
        assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)
        cmd = plan.command("mqar", "relu_linear_probe", 0, "runlocal", "w", [])
        assert cmd[-1] == "--import=user_variants_probe"
    finally:
        registry._unregister("relu_linear_probe")
        sys.modules.pop("user_variants_probe", None)
    with pytest.raises(SystemExit) as e:
        cli.import_variants(["no_such_module_here"])
    assert e.value.code == 2
