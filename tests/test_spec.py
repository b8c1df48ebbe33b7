"""ColumnSpec / TableSpec: validation at construction, immutability, dict round trip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from gear_flow import ColumnSpec, GearFlowError, SpecError, TableSpec
from gear_flow.spec import RESERVED


@pytest.mark.parametrize("name", ["", "1obs", "obs-x", "a b", "class", "lambda", None, 3, "obs.x"])
def test_bad_column_names(name):
    with pytest.raises(SpecError, match="identifier"):
        ColumnSpec(name, (), np.float32)


@pytest.mark.parametrize("name", sorted(RESERVED))
def test_reserved_column_names(name):
    with pytest.raises(SpecError, match="reserved") as e:
        ColumnSpec(name, (), np.float32)
    assert name in str(e.value)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (-1,), (2, -5), ("a",), (1.5j,), object()])
def test_bad_shapes(shape):
    with pytest.raises(SpecError, match="shape"):
        ColumnSpec("x", shape, np.float32)


@pytest.mark.parametrize("shape", [2.5, (2.5, 4), (4.0,), ("3",), "34", (True,), (np.True_, 2)])
def test_shapes_that_int_would_round_or_read_are_refused(shape):
    """int() made a shape of 2.5 a 2, ("3",) a 3, "34" a (3, 4) and True a 1, silently."""
    with pytest.raises(SpecError, match=r"must be a tuple of ints$"):
        ColumnSpec("x", shape, np.float32)


@pytest.mark.parametrize(
    "shape, expected",
    [((), ()), (4, (4,)), ([2, 3], (2, 3)), ((np.int64(5),), (5,)), ((1, 1, 1), (1, 1, 1))],
)
def test_shapes_normalised(shape, expected):
    c = ColumnSpec("x", shape, np.float32)
    assert c.shape == expected
    assert all(type(s) is int for s in c.shape)


@pytest.mark.parametrize(
    "dtype", ["U5", "S3", object, "M8[s]", "m8[s]", "V8", "not-a-dtype", [("a", "f4")], np.longdouble, np.clongdouble]
)
def test_bad_dtypes(dtype):
    with pytest.raises(SpecError, match="dtype"):
        ColumnSpec("x", (), dtype)


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.int8, np.uint8, np.int64, np.float16, np.float32, np.float64, np.complex64, "int32", "<f4"]
)
def test_good_dtypes(dtype):
    c = ColumnSpec("x", (2, 3), dtype)
    assert c.dtype == np.dtype(dtype)
    assert isinstance(c.dtype, np.dtype)
    assert c.nbytes == 6 * np.dtype(dtype).itemsize


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">c16", ">u2"])
def test_a_non_native_byte_order_is_the_native_dtype(make_table, dtype):
    """A column declared big-endian was kept so, and every sample of it failed in torch (which takes only the
    native order) after the sample had been applied: with max_times_sampled=1 its items expired unseen.  It
    is now the same type in the native order, and big-endian values inserted come back as they went in."""
    c = ColumnSpec("x", (2,), dtype)
    assert c.dtype == np.dtype(dtype).newbyteorder("=") and c.dtype.isnative
    t = make_table(TableSpec((c,), capacity=16), max_times_sampled=1, seed=0)
    values = (np.arange(8).reshape(4, 2) + 1).astype(dtype)
    t.insert({"x": values})
    got = t.sample(4, 1)["x"].numpy()[:, 0]
    assert got[np.argsort(got[:, 0].real)].tolist() == values.astype(c.dtype).tolist()
    assert t.info()["size"] == 0  # each handed out once, then gone


def test_column_frozen():
    c = ColumnSpec("x", (2,), np.float32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "y"
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.shape = (3,)


def test_table_frozen_and_defaults():
    spec = TableSpec((ColumnSpec("x", (2,)),), capacity=100, num_shards=3)
    assert spec.max_size == 300
    assert spec.item_unit == "step"
    assert isinstance(spec.columns, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.capacity = 5


def test_columns_list_becomes_tuple():
    cols = [ColumnSpec("a", ()), ColumnSpec("b", (4,), np.int64)]
    spec = TableSpec(cols, capacity=8)
    cols.append(ColumnSpec("c", ()))  # mutating the caller's list changes nothing
    assert spec.names == ("a", "b")
    assert spec.step_nbytes == 4 + 32


def test_duplicate_columns():
    with pytest.raises(SpecError, match=r"unique.*\['a'\]"):
        TableSpec((ColumnSpec("a", ()), ColumnSpec("b", ()), ColumnSpec("a", (2,))), capacity=8)


def test_no_columns():
    with pytest.raises(SpecError, match="at least one column"):
        TableSpec((), capacity=8)


def test_columns_must_be_columnspecs():
    with pytest.raises(SpecError, match="ColumnSpec"):
        TableSpec(({"name": "x"},), capacity=8)


@pytest.mark.parametrize("capacity", [0, -1, 1.5, "10", True, None, 10.0])
def test_bad_capacity(capacity):
    with pytest.raises(SpecError, match="capacity") as e:
        TableSpec((ColumnSpec("x", ()),), capacity=capacity)
    assert repr(capacity) in str(e.value)


@pytest.mark.parametrize("num_shards", [0, -2, 128, 1000, 2.0, False])
def test_bad_num_shards(num_shards):
    with pytest.raises(SpecError, match="num_shards"):
        TableSpec((ColumnSpec("x", ()),), capacity=8, num_shards=num_shards)


def test_num_shards_limit_inclusive():
    assert TableSpec((ColumnSpec("x", ()),), capacity=1, num_shards=127).max_size == 127


@pytest.mark.parametrize("max_size", [0, -5, 2.5, True])
def test_bad_max_size(max_size):
    with pytest.raises(SpecError, match="max_size"):
        TableSpec((ColumnSpec("x", ()),), capacity=8, max_size=max_size)


@pytest.mark.parametrize("unit", ["steps", "window", "", None])
def test_bad_item_unit(unit):
    with pytest.raises(SpecError, match="item_unit"):
        TableSpec((ColumnSpec("x", ()),), capacity=8, item_unit=unit)


def test_column_lookup():
    spec = TableSpec((ColumnSpec("a", ()), ColumnSpec("b", (2,), np.int8)), capacity=4)
    assert spec.column("b").dtype == np.int8
    with pytest.raises(SpecError, match="no column 'z'"):
        spec.column("z")


def test_errors_are_valueerrors_too():
    with pytest.raises(ValueError):
        ColumnSpec("keys", ())
    assert issubclass(SpecError, GearFlowError)


@pytest.mark.parametrize("item_unit", ["step", "episode"])
def test_dict_round_trip(item_unit):
    spec = TableSpec(
        (
            ColumnSpec("obs", (84, 84, 3), np.uint8),
            ColumnSpec("action", (), np.int64),
            ColumnSpec("reward", (), np.float32),
            ColumnSpec("done", (), np.bool_),
            ColumnSpec("c", (2,), ">f8"),
        ),
        capacity=1234,
        num_shards=5,
        item_unit=item_unit,
        max_size=777,
    )
    d = spec.to_dict()
    d2 = json.loads(json.dumps(d))  # JSON-able
    back = TableSpec.from_dict(d2)
    assert back == spec
    assert back.column("c").dtype == np.dtype(">f8").newbyteorder("=")  # (a column's dtype is native)
    assert back.column("obs").shape == (84, 84, 3)
    assert back.max_size == 777 and back.item_unit == item_unit


def test_round_trip_default_max_size():
    spec = TableSpec((ColumnSpec("x", ()),), capacity=10, num_shards=2)
    assert TableSpec.from_dict(spec.to_dict()).max_size == 20


def test_from_dict_validates():
    d = TableSpec((ColumnSpec("x", ()),), capacity=10).to_dict()
    d["capacity"] = 0
    with pytest.raises(SpecError):
        TableSpec.from_dict(d)
    d = TableSpec((ColumnSpec("x", ()),), capacity=10).to_dict()
    d["columns"][0]["name"] = "mask"
    with pytest.raises(SpecError, match="reserved"):
        TableSpec.from_dict(d)
