"""The package's import layers hold: ``lint-imports`` keeps every contract in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    # the console script beside this interpreter: the one the test extra installed
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_a_broken_contract_fails(tmp_path):
    # the check itself can fail: a contract the package breaks today is reported as broken
    config = tmp_path / "contracts.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "gear_flow"\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "no distributed in the package"\ntype = "forbidden"\n'
        'source_modules = ["gear_flow.stream"]\nforbidden_modules = ["gear_flow.distributed"]\n'
    )
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run(
        [str(lint), "--config", str(config), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode != 0
    assert "1 broken" in run.stdout
