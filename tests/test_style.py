"""The house style holds: ``ruff check`` and ``ruff format --check`` pass over the repository (pyproject.toml's
settings), the Python in the Markdown docs included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the console script beside this interpreter: the one the test extra installed
RUFF = Path(sys.executable).with_name("ruff")


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUFF), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [("check", "."), ("format", "--check", ".")], ids=["check", "format"])
def test_the_repository_keeps_the_house_style(args):
    run = _ruff(*args)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_a_file_out_of_style_is_flagged(tmp_path):
    # the checks themselves can fail, with the repository's settings: an unused import, and a comment
    # squeezed against its code
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "bad.py").write_text("import os\nx = 1# why\n")
    check, fmt = _ruff("check", "bad.py", cwd=tmp_path), _ruff("format", "--check", "bad.py", cwd=tmp_path)
    assert check.returncode != 0 and "F401" in check.stdout
    assert fmt.returncode != 0 and "bad.py" in fmt.stdout
