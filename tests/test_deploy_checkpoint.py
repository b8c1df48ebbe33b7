"""Checkpoints are private: files 0600 and directories 0700 whatever the umask, configurable
through ``gear-flow.checkpoint.file-mode`` / ``dir-mode``; a bad setting is a clear error."""

from __future__ import annotations

import os
import stat

import dask.config
import numpy as np
import pytest

from gear_flow import ColumnSpec, LocalTable, TableSpec
from gear_flow.errors import CheckpointError


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def table():
    t = LocalTable(TableSpec((ColumnSpec("obs", (3,), np.float32), ColumnSpec("done", (), bool)), 64, num_shards=2))
    t.insert([{"obs": np.ones((10, 3), np.float32), "done": np.arange(10) == 9}] * 2)
    return t


@pytest.fixture
def open_umask():
    old = os.umask(0)  # the most permissive umask: modes must not depend on it
    yield
    os.umask(old)


def test_checkpoint_files_and_directories_are_private_by_default(table, tmp_path, open_umask):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    path = shared / "new" / "parent" / "ck"
    table.checkpoint(path)
    files = sorted(path.iterdir())
    assert {f.name for f in files} == {"manifest.json", "shard-0.npz", "shard-1.npz"}
    assert {f.name: oct(_mode(f)) for f in files} == {f.name: "0o600" for f in files}
    for d in (path, path.parent, path.parent.parent):  # the parents it had to create, too
        assert _mode(d) == 0o700, (d, oct(_mode(d)))
    assert _mode(shared) == 0o755  # an existing parent is left as it was
    # writing over an existing checkpoint keeps it private, and it still restores
    table.checkpoint(path)
    assert _mode(path) == 0o700 and _mode(path / "shard-0.npz") == 0o600
    assert LocalTable.restore(path).size == table.size


def test_checkpoint_modes_are_configurable(table, tmp_path, open_umask):
    with dask.config.set({"gear-flow.checkpoint.file-mode": "0640", "gear-flow.checkpoint.dir-mode": "0750"}):
        table.checkpoint(tmp_path / "ck")
    assert _mode(tmp_path / "ck") == 0o750 and _mode(tmp_path / "ck" / "manifest.json") == 0o640


@pytest.mark.parametrize(
    "key, value", [("file-mode", "0400"), ("file-mode", "rw"), ("dir-mode", "0600"), ("dir-mode", "01777")]
)
def test_bad_checkpoint_modes_are_refused_before_writing(table, tmp_path, key, value):
    with dask.config.set({f"gear-flow.checkpoint.{key}": value}), pytest.raises(CheckpointError) as e:
        table.checkpoint(tmp_path / "ck")
    assert f"gear-flow.checkpoint.{key} ({value!r})" in str(e.value) and "octal" in str(e.value)
    assert not (tmp_path / "ck").exists()
