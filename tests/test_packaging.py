"""pyproject.toml (`pip install -e .`): every package folder of lra/, models/ and configs/ is
in the distribution, and its dependencies are requirements.txt's (read from it at build
time), so that the two cannot drift apart."""
import os
import tomllib

import setuptools

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_every_package_folder_is_distributed():
    project = _pyproject()
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(setuptools.find_packages(REPO, include=include))
    folders = {os.path.relpath(d, REPO).replace(os.sep, ".")
               for top in ("lra", "models", "configs")
               for d, _, files in os.walk(os.path.join(REPO, top)) if "__init__.py" in files}
    assert folders and found == folders, (found ^ folders)
    assert not any(p.startswith(("tests", "scripts")) for p in found)


def test_dependencies_are_requirements_txt():
    project = _pyproject()
    assert "dependencies" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"] == {
        "file": ["requirements.txt"]}
    assert project["project"]["requires-python"] == ">=3.11"
