"""Shared fixtures: tiny generated datasets and tiny configs."""
import os

# jax's default "partitionable" threefry makes XLA:CPU compile every random draw (parameter
# init, dropout) 3-8x slower; the suite compiles thousands of them. The flag changes which
# random numbers a seed gives, not their distribution, and subprocesses inherit it.
os.environ.setdefault("JAX_THREEFRY_PARTITIONABLE", "false")

# The suite compiles thousands of small programs and runs each a few times: XLA:CPU's
# backend optimisation (LLVM at -O2, its expensive passes) is most of each compile and buys
# nothing at test sizes. Measured on 2 cores: tests/models/test_conformance.py took 439 s
# of worker time with it, 274 s without. Results differ from -O2's only in rounding (one
# tolerance had to follow its inputs' scale: tests/models/test_recurrent_decoding.py);
# programs compared bitwise are compiled with the same flags. Subprocesses inherit it; runs
# outside the tests are not affected.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} "
                               "--xla_backend_optimization_level=0 "
                               "--xla_llvm_disable_expensive_passes=true").strip()

# XLA:CPU's newer fusion emitters (MLIR) compile a fused loop more slowly than the older
# elemental emitter, and the suite is compile-bound: measured on 2 cores under JAX 0.10.2,
# tests/models/test_conformance.py took 210 s of CPU with them and 121 s without (a
# decoding subset 28 -> 20 s). JAX 0.12's XLA no longer has the switch and refuses an
# unknown flag, so it is set only for the jaxlib it was measured on (0.10.x).
def _jaxlib_before(major: int, minor: int) -> bool:
    from importlib import metadata

    try:
        version = metadata.version("jaxlib").split(".")
        return (int(version[0]), int(version[1])) < (major, minor)
    except (metadata.PackageNotFoundError, ValueError, IndexError):
        return False


if ("xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", "")
        and _jaxlib_before(0, 11)):
    os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} "
                               "--xla_cpu_use_fusion_emitters=false").strip()

# One XLA compilation cache for the whole run: the pytest-xdist workers and the processes
# that the multi-process and launch tests start inherit the variable, and many tests compile
# the same programs (the runlocal train and eval steps above all). Measured on 2 cores:
# tests/test_train.py + tests/test_reliability.py took 360 s without it, 239 s with it
# (CPU time 247 s -> 119 s). A fresh folder per run (never another run's programs),
# removed when the run ends; every program is cached, however quick to compile.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _cache = tempfile.mkdtemp(prefix="lra-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402

TINY_LISTOPS = dict(num_train_samples=256, num_valid_samples=64, num_test_samples=64,
                    min_length=5, max_length=40, max_depth=3, max_args=4, seed=0)


@pytest.fixture(scope="session")
def listops_dir(tmp_path_factory):
    """A tiny generated ListOps set (lengths 5-40)."""
    from lra.tasks import listops

    path = tmp_path_factory.mktemp("listops")
    listops.generate(str(path), verbose=False, **TINY_LISTOPS)
    return str(path)


@pytest.fixture
def tiny_listops_config():
    """A factory: the `runlocal` ListOps config on `data_dir`, with overrides."""
    from configs import listops

    def make(data_dir: str, **overrides):
        # The model goes through get_config so that it brings its own presets.
        model = overrides.pop("model", "transformer")
        config = listops.get_config(f"model={model},runlocal")
        config.data_dir = data_dir
        config.max_length = 48
        for key, value in overrides.items():
            config[key] = value
        return config

    return make


# Files whose tests start processes or train for seconds each: collected first, so that
# pytest-xdist hands them out while the quick tests fill the gaps, instead of two of them
# running alone at the end of the suite. The multi-process tests (each 2 processes on the
# machine's 2 cores) alternate with single-process ones, so that the two workers rarely run
# two of them at once (4 busy processes, heartbeats late).
_MULTI_PROCESS = "test_multihost.py"
_LONG = ("test_train.py", "test_pretrain.py", "test_sweep_pretrain.py", "test_benchmark.py",
         "test_reliability.py", "test_checkpoint_recovery.py", "test_tasks_train.py",
         "test_notebooks.py", "test_generate.py", "test_gpu_suite.py", "test_hybrid.py")


def pytest_collection_modifyitems(items):
    multi = [i for i in items if i.path.name == _MULTI_PROCESS]
    long = [i for i in items if i.path.name in _LONG]
    rest = [i for i in items if i.path.name != _MULTI_PROCESS and i.path.name not in _LONG]
    mixed = []
    for k in range(max(len(multi), (len(long) + 1) // 2)):
        mixed += multi[k:k + 1] + long[2 * k:2 * k + 2]  # one multi-process, two others
    assert len(mixed) == len(multi) + len(long)
    items[:] = mixed + rest
