"""The built wheel: it carries the CUDA sources, and an installed copy's loader finds and reads them.

The wheel is built from a copy of the files a build reads (pyproject.toml, setup.py, README.md,
gear_flow/, kernels/), so a stale ``build/`` in the checkout cannot leak into it, without build
isolation (no network: the environment's setuptools, which torch pins to >= 77).  The installed
copy is the unzipped wheel (what pip puts in site-packages), imported in a fresh interpreter whose
working directory is elsewhere and which has no ``GEAR_FLOW_KERNEL_DIR``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gear_flow.gpu import loader

ROOT = Path(__file__).resolve().parents[1]
#: what a wheel build reads from the repository
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "gear_flow", "kernels")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools.command.bdist_wheel", reason="setuptools >= 70.1 builds wheels itself")
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300, cwd=src,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("gear_flow-*.whl")
    return whl


def test_wheel_carries_every_kernel_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for src in loader.SOURCES.values():
        member = f"gear_flow/_kernels/{src.file}"
        assert member in names, f"{member} missing from {wheel.name}: {sorted(n for n in names if '_kernels' in n)}"
        assert zipfile.ZipFile(wheel).read(member) == (ROOT / "kernels" / src.file).read_bytes()
    # every .cu of the repository, not only those the loader knows today; and the config defaults
    assert {f"gear_flow/_kernels/{p.name}" for p in (ROOT / "kernels").glob("*.cu")} <= names
    assert {"gear_flow/gear-flow.yaml", "gear_flow/py.typed"} <= names


PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import gear_flow
from gear_flow.gpu import loader
out = {"package": gear_flow.__file__, "kernel_dir": str(loader.kernel_dir()),
       "sources": {name: loader.source(name) for name in loader.SOURCES}}
print(json.dumps(out))
"""


def test_installed_wheel_loader_reads_the_packaged_sources(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("GEAR_FLOW_KERNEL_DIR", "PYTHONPATH")}
    r = subprocess.run([sys.executable, "-c", PROBE, str(site)], cwd=elsewhere, env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert Path(got["package"]).resolve() == (site / "gear_flow" / "__init__.py").resolve()
    assert Path(got["kernel_dir"]).resolve() == (site / "gear_flow" / "_kernels").resolve()
    for name, src in loader.SOURCES.items():
        text = (ROOT / "kernels" / src.file).read_text()
        assert got["sources"][name] == f'#line 1 "{src.file}"\n{text}', name
