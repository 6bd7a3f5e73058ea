"""Shared fixtures: tiny generated datasets and tiny configs."""
import os

# jax's default "partitionable" threefry makes XLA:CPU compile every random draw (parameter
# init, dropout) 3-8x slower; the suite compiles thousands of them. The flag changes which
# random numbers a seed gives, not their distribution, and subprocesses inherit it.
os.environ.setdefault("JAX_THREEFRY_PARTITIONABLE", "false")

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
