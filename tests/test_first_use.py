"""Each public entry point with the types a newcomer passes first: a list for an array, a dict for a mapping,
a NumPy scalar for a size or a priority, a str or a Path for a path, torch tensors for keys.  Each works, or
is refused in one line that says what to pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gear_flow as gf


@pytest.fixture
def table():
    spec = gf.TableSpec((gf.ColumnSpec("x", (3,)), gf.ColumnSpec("r", ())), capacity=100)
    t = gf.LocalTable(spec, sampler=gf.Prioritized(), seed=0)
    t.insert({"x": np.zeros((5, 3)), "r": np.arange(5.0)})
    return t


def test_specs_from_lists_strings_and_numpy_integers():
    c = gf.ColumnSpec("x", [3], "float32")
    assert c.shape == (3,) and c.dtype == np.float32 and gf.ColumnSpec("x", 3).shape == (3,)
    spec = gf.TableSpec([c], capacity=np.int64(10))
    assert spec.capacity == 10 and isinstance(spec.columns, tuple)
    with pytest.raises(gf.SpecError, match=r"^capacity \(10.5\) must be a positive integer$"):
        gf.TableSpec([c], capacity=10.5)


def test_insert_from_lists_tuples_torch_and_numpy_scalar_priorities(table):
    table.insert({"x": [[1, 2, 3], [4, 5, 6]], "r": [1.0, 2.0]})  # nested lists
    table.insert(({"x": np.ones((2, 3)), "r": np.ones(2)},), priorities=np.float32(2.0))  # a tuple; a NumPy scalar
    table.insert([{"x": torch.zeros(2, 3), "r": torch.zeros(2)}], priorities=[1.0, 3])  # torch; a list of numbers
    table.insert_batch({"x": [[[1, 2, 3]]], "r": [[1.0]]})  # [B, T] as lists
    assert table.size == 5 + 2 + 2 + 2 + 1


def test_sample_and_update_with_numpy_integers_lists_and_tensors(table):
    b = table.sample(np.int64(4), np.int64(1), columns=["x"])
    assert b["x"].shape == (4, 1, 3)
    assert table.update_priorities(b.keys, np.float64(2.0)).applied == 4  # torch keys, a NumPy scalar
    assert table.update_priorities(b.keys.numpy().tolist(), (1.0,) * 4).applied == 4  # lists and tuples
    with pytest.raises(gf.SpecError, match=r"^batch_size \(4.0\) must be a positive integer$"):
        table.sample(4.0)
    assert table.delete(int(b.keys[0])).applied == 1 and table.delete([]).applied == 0  # one key, no keys


def test_checkpoints_take_str_or_path(table, tmp_path):
    table.checkpoint(str(tmp_path / "a"))
    table.checkpoint(tmp_path / "b")
    assert gf.LocalTable.restore(tmp_path / "b").size == gf.LocalTable.restore(str(tmp_path / "a")).size == 5


def test_writers_and_streams_with_numpy_sizes(table):
    with gf.Stream(table, np.int64(2), 1, num_batches=1) as s:
        assert len(next(iter(s))) == 2
    w = gf.VectorWriter(table, 2)
    w.append({"x": [[0, 0, 0], [1, 1, 1]], "r": [0, 1]}, done=[True, False])
    assert table.size == 6
