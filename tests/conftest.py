"""Shared fixtures: tiny generated datasets and tiny configs."""
import pytest

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
        config = listops.get_config("runlocal")
        config.data_dir = data_dir
        config.max_length = 48
        for key, value in overrides.items():
            config[key] = value
        return config

    return make
