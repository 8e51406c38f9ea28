"""pyproject.toml and environment.yml must declare the same dependencies."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
# conda-forge names that differ from PyPI's.
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_DEPENDENCIES = {"python", "pip"}


def _split(requirement: str) -> tuple[str, str]:
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*?)\s*$", requirement)
    assert match, requirement
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    return CONDA_TO_PYPI.get(name, name), match.group(2).replace(" ", "")


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return dict(_split(r) for r in reqs)


def environment_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    reqs = []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            reqs += [r for r in dep["pip"] if not r.startswith("-e")]
        else:
            reqs.append(dep)
    parsed = dict(_split(r) for r in reqs)
    return {k: v for k, v in parsed.items() if k not in NOT_DEPENDENCIES}


def test_pyproject_and_environment_declare_the_same_packages_and_versions():
    ours, conda = pyproject_requirements(), environment_requirements()
    assert set(ours) == set(conda), {
        "only in pyproject.toml": sorted(set(ours) - set(conda)),
        "only in environment.yml": sorted(set(conda) - set(ours)),
    }
    assert {k: ours[k] for k in ours} == {k: conda[k] for k in ours}


def test_environment_installs_the_package_itself():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip_section


def test_the_comparison_can_fail():
    assert _split("pytorch>=2.4") == ("torch", ">=2.4")
    assert _split("jupyter_book <2") == ("jupyter-book", "<2")
