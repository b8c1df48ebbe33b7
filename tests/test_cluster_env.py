"""environment.yml (conda, GPU clusters) and pyproject.toml state the same dependencies and pins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]

#: pyproject groups the conda environment must carry ("" is the core dependencies)
GROUPS = ("", "gpu-cu13", "cudf", "ucx", "pipelines", "test", "cluster")
#: pip name -> conda name where they differ (CUDA-suffixed wheels, torch)
CONDA_NAME = {
    "cupy-cuda13x": "cupy",
    "rmm-cu13": "rmm",
    "distributed-ucxx-cu13": "distributed-ucxx",
    "cudf-cu13": "cudf",
    "dask-cudf-cu13": "dask-cudf",
    "torch": "pytorch-gpu",
}


def _toml():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pip_requirements() -> dict[str, Requirement]:
    project = _toml()["project"]
    out = {}
    for group in GROUPS:
        reqs = project["dependencies"] if group == "" else project["optional-dependencies"][group]
        for r in map(Requirement, reqs):
            name = CONDA_NAME.get(r.name.lower(), r.name.lower())
            assert name not in out or out[name].specifier == r.specifier, f"{r} disagrees with {out[name]}"
            out[name] = r
    return out


_CONDA = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+)\s*(?P<spec>.*)$")


def conda_spec(spec: str) -> SpecifierSet:
    """A conda version constraint as a pip SpecifierSet: ``=26.10`` is ``==26.10.*``, ``==X`` is exact."""
    spec = spec.replace(" ", "")
    if not spec:
        return SpecifierSet()
    parts = []
    for part in spec.split(","):
        if re.match(r"^=[^=]", part):
            parts.append(f"=={part[1:]}.*")
        elif re.match(r"^[0-9]", part):
            parts.append(f"=={part}" if "*" in part else f"=={part}.*")
        else:
            parts.append(part)
    return SpecifierSet(",".join(parts))


def conda_dependencies() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    out = {}
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            continue
        m = _CONDA.match(dep.strip())
        out[m["name"].lower()] = m["spec"]
    return out


def test_every_pyproject_requirement_is_in_the_conda_environment_with_the_same_pin():
    conda = conda_dependencies()
    problems = []
    for name, req in sorted(pip_requirements().items()):
        if name not in conda:
            problems.append(f"{req} (pyproject) is missing from environment.yml (as {name!r})")
            continue
        got = conda_spec(conda[name])
        if got != req.specifier:
            problems.append(f"{name}: pyproject says {str(req.specifier) or 'any'}, environment.yml "
                            f"{conda[name] or 'any'} (= {str(got) or 'any'})")  # fmt: skip
    assert not problems, "\n".join(problems)


def test_the_conda_environment_has_nothing_unaccounted_for():
    known = set(pip_requirements()) | {"python", "cuda-version", "pip"}
    extra = sorted(set(conda_dependencies()) - known)
    assert not extra, f"environment.yml lists {extra}, which pyproject.toml does not: add them there too"


def test_cuda_python_and_the_rapids_release_agree():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"][0] == "rapidsai", "RAPIDS packages come from the rapidsai channel first"
    conda = conda_dependencies()
    cuda_major = conda_spec(conda["cuda-version"])
    assert Version("13.0") in cuda_major, "the gpu-cu13 extra needs CUDA 13"
    requires = SpecifierSet(_toml()["project"]["requires-python"])
    py = conda["python"].lstrip("=")
    assert Version(py) in requires, f"python={py} does not satisfy requires-python {requires}"
    assert any(d == {"pip": ["-e ."]} for d in env["dependencies"] if isinstance(d, dict)), "gear_flow itself"
    # one RAPIDS release for every RAPIDS package, in both files
    pip = pip_requirements()
    rapids = {n: str(pip[n].specifier) for n in ("dask-cuda", "rmm", "cudf", "dask-cudf")}
    assert len(set(rapids.values())) == 1, rapids
    # dask-cuda's extra must name the same CUDA as the wheels' suffixes
    extras = _toml()["project"]["optional-dependencies"]["gpu-cu13"]
    assert all("cu13" in r or "cuda13" in r for r in extras), extras


def test_conda_spec_translation():
    assert conda_spec("=26.10") == SpecifierSet("==26.10.*")
    assert conda_spec("==2026.7.1") == SpecifierSet("==2026.7.1")
    assert conda_spec(">=14,<15") == SpecifierSet(">=14,<15")
    assert conda_spec("") == SpecifierSet()
    assert Version("26.10.2") in conda_spec("=26.10") and Version("26.11") not in conda_spec("=26.10")
