"""Validated, frozen descriptions of what a table stores.

Examples
--------
>>> import numpy as np
>>> from gear_flow.spec import ColumnSpec, TableSpec
>>> spec = TableSpec(
...     columns=(ColumnSpec("obs", (4,), np.float32), ColumnSpec("action", (), np.int64)),
...     capacity=10_000,
... )
>>> spec.step_nbytes
24
"""

from __future__ import annotations

import keyword
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import DTypeLike

from .errors import SpecError

#: The unit that carries a priority: every stored step is the start (or end) of
#: a window item, or every episode is one item.
ItemUnit = Literal["step", "episode"]

#: What happens to windows that would cross an episode boundary.
#: ``strict``: such windows are never sampled (items whose window does not fit
#: are excluded, with the probabilities renormalised exactly).
#: ``pad_tail``: the window starts at the item and is zero-padded after the
#: episode's last step (mask False there).
#: ``pad_head``: the window *ends* at the item and is zero-padded before the
#: episode's first step (Decision-Transformer style right-aligned windows).
Boundary = Literal["strict", "pad_tail", "pad_head"]
BOUNDARIES: tuple[str, ...] = ("strict", "pad_tail", "pad_head")
ITEM_UNITS: tuple[str, ...] = ("step", "episode")

#: Names used by the sample result itself; a column may not shadow them.
RESERVED = frozenset({"keys", "probabilities", "weights", "mask", "table_size", "info"})


@dataclass(frozen=True)
class ColumnSpec:
    """One named column: every step holds an array of ``shape`` and ``dtype``.

    Parameters
    ----------
    name : str
        A Python identifier, not one of the sample result's own field names.
    shape : tuple of int
        Per-step shape (``()`` for scalars).
    dtype : numpy dtype-like
        Any fixed-size numeric or bool dtype.

    Examples
    --------
    >>> ColumnSpec("obs", (84, 84), "uint8").nbytes
    7056
    """

    name: str
    shape: tuple[int, ...] = ()
    dtype: np.dtype = field(default=np.dtype(np.float32))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier() or keyword.iskeyword(self.name):
            raise SpecError(f"column name {self.name!r} must be a Python identifier")
        if self.name in RESERVED:
            raise SpecError(f"column name {self.name!r} is reserved; reserved names: {sorted(RESERVED)}")
        dims = (
            self.shape
            if isinstance(self.shape, Iterable) and not isinstance(self.shape, (str, bytes))
            else (self.shape,)
        )
        dims = tuple(dims)
        # whole numbers only: int() would make 2.5 a 2, "3" a 3 and True a 1
        if not all(isinstance(s, numbers.Integral) and not isinstance(s, (bool, np.bool_)) for s in dims):
            raise SpecError(f"column {self.name!r}: shape {self.shape!r} must be a tuple of ints")
        shape = tuple(int(s) for s in dims)
        if any(s <= 0 for s in shape):
            raise SpecError(f"column {self.name!r}: shape {shape} must have positive dimensions")
        dtype = column_dtype(self.dtype, f"column {self.name!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of one step of this column."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True)
class TableSpec:
    """What one table stores and how its items are defined.

    Parameters
    ----------
    columns : sequence of ColumnSpec
        At least one; names unique.
    capacity : int
        Steps per shard (the length of each column's ring).
    num_shards : int
        Shards of the table (in-process for a local table, on workers for a
        distributed one).  Episodes are never split across shards.
    item_unit : {"step", "episode"}
        What carries a priority: each step (as a window start, or window end in
        ``pad_head`` mode) or each episode.
    max_size : int, optional
        Most items the table keeps; beyond it the remover evicts.  Default:
        every step of every shard (``capacity * num_shards``) for step items.
        For episode items the default is ``capacity * num_shards`` as well (an
        episode has at least one step).

    Examples
    --------
    >>> spec = TableSpec((ColumnSpec("obs", (3,)),), capacity=1000, num_shards=2)
    >>> spec.max_size
    2000
    """

    columns: tuple[ColumnSpec, ...]
    capacity: int
    num_shards: int = 1
    item_unit: ItemUnit = "step"
    max_size: int | None = None

    def __post_init__(self) -> None:
        cols = tuple(self.columns)
        if not cols:
            raise SpecError("a table needs at least one column")
        for c in cols:
            if not isinstance(c, ColumnSpec):
                raise SpecError(f"columns must be ColumnSpec instances, got {type(c).__name__}")
        names = [c.name for c in cols]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SpecError(f"column names must be unique; repeated: {dup}")
        _positive_int("capacity", self.capacity)
        _positive_int("num_shards", self.num_shards)
        if self.num_shards > 127:
            raise SpecError(f"num_shards ({self.num_shards}) must be <= 127 (keys carry the shard in 7 bits)")
        if self.item_unit not in ITEM_UNITS:
            raise SpecError(f"item_unit {self.item_unit!r} must be one of {ITEM_UNITS}")
        max_size = self.capacity * self.num_shards if self.max_size is None else self.max_size
        _positive_int("max_size", max_size)
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "max_size", int(max_size))
        # derived once (not fields: equality, hashing and to_dict see only the fields); every sample asks
        object.__setattr__(self, "_by_name", {c.name: c for c in cols})
        object.__setattr__(self, "_name_set", frozenset(names))  # every inserted episode is checked against it

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in the spec's order."""
        return tuple(self._by_name)

    @property
    def name_set(self) -> frozenset[str]:
        """The column names, as a set."""
        return self._name_set

    def column(self, name: str) -> ColumnSpec:
        """The column called ``name``.

        Parameters
        ----------
        name : str
            A column name.

        Returns
        -------
        ColumnSpec
            Its spec.

        Raises
        ------
        SpecError
            There is no such column (the message lists those there are).
        """
        try:
            return self._by_name[name]
        except (KeyError, TypeError):  # TypeError: not a name at all (unhashable)
            raise SpecError(f"no column {name!r}; columns: {list(self.names)}") from None

    @property
    def step_nbytes(self) -> int:
        """Raw bytes of one step over all columns."""
        return sum(c.nbytes for c in self.columns)

    def batch_step_nbytes(self, columns: Iterable[str]) -> int:
        """Bytes of one window step of ``columns`` in a batch's buffers (a column of no bytes takes one there).

        Parameters
        ----------
        columns : iterable of str
            Column names.

        Returns
        -------
        int
        """
        return sum(max(self.column(c).nbytes, 1) for c in columns)

    def to_dict(self) -> dict[str, object]:
        """A JSON-able description (used by checkpoints and the distributed table).

        Returns
        -------
        dict
            ``columns`` (a list of ``{"name", "shape", "dtype"}``, dtype as its
            ``str`` such as ``"<f4"``), ``capacity``, ``num_shards``,
            ``item_unit`` and ``max_size``.
        """
        return {
            "columns": [{"name": c.name, "shape": list(c.shape), "dtype": c.dtype.str} for c in self.columns],
            "capacity": self.capacity,
            "num_shards": self.num_shards,
            "item_unit": self.item_unit,
            "max_size": self.max_size,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableSpec:
        """The inverse of :meth:`to_dict`.

        Parameters
        ----------
        d : mapping
            As :meth:`to_dict` made it (a column's ``shape`` may be left out: scalar).

        Returns
        -------
        TableSpec
            The spec, validated as the constructor validates it.

        Raises
        ------
        SpecError
            A missing key or a bad value.
        """
        try:
            cols = tuple(ColumnSpec(c["name"], tuple(c.get("shape", ())), c["dtype"]) for c in d["columns"])
            return cls(cols, d["capacity"], d["num_shards"], d["item_unit"], d["max_size"])
        except KeyError as e:
            raise SpecError(f"a table spec needs the key {e.args[0]!r} (columns: name, dtype, shape)") from None
        except TypeError as e:
            raise SpecError(f"a table spec must be a mapping with a list of column mappings ({e})") from None


#: dtype kinds a column may have: bool, signed and unsigned integers, floats, complex
DTYPE_KINDS = "biufc"


def column_dtype(value: DTypeLike, who: str = "column") -> np.dtype:
    """``value`` as a numpy dtype a column may have.

    Parameters
    ----------
    value : numpy dtype-like
        What the user gave (``"float32"``, ``np.int64``, ``bool``...).
    who : str, default "column"
        Names the column in the message (``"column 'obs'"``).

    Returns
    -------
    numpy.dtype
        The dtype in the native byte order; its kind is one of :data:`DTYPE_KINDS`.

    Raises
    ------
    SpecError
        Naming ``who``, ``value`` and what is allowed: not a dtype, not a
        bool/integer/float/complex one, or one torch cannot hold (extended
        precision).

    Examples
    --------
    >>> column_dtype("float32")
    dtype('float32')
    """
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError, SyntaxError):
        raise SpecError(
            f"{who}: dtype {value!r} is not a numpy dtype; use one like float32, float64, int64, uint8 or bool"
        ) from None
    if dtype.kind not in DTYPE_KINDS or dtype.hasobject or dtype.itemsize == 0:
        raise SpecError(f"{who}: dtype {dtype} is not allowed; use a bool, integer, float or complex dtype")
    if (dtype.kind == "f" and dtype.itemsize > 8) or (dtype.kind == "c" and dtype.itemsize > 16):
        # (a batch reaches the learner as torch tensors, and torch has no such type: its samples would fail)
        raise SpecError(f"{who}: dtype {dtype} has no torch counterpart; use float64 or complex128")
    # a non-native byte order is the same numbers: stored, and handed to torch (which takes only the
    # native order), in the native one (an insert's values are cast to it)
    return dtype.newbyteorder("=") if not dtype.isnative else dtype


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise SpecError(f"{name} ({value!r}) must be a positive integer")
