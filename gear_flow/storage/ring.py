"""Column rings: one contiguous ``[capacity, *shape]`` array per column.

Steps are written at an ever-increasing absolute position ``t``; step ``t``
lives at ring slot ``t % capacity``.  Episodes are stored back to back without
padding, and a window is a contiguous slice of the ring (two at the wrap), so
overlapping windows are never stored twice.
"""

from __future__ import annotations

import numpy as np

from ..spec import TableSpec
from .base import StorageTier


class ColumnRing:
    """The step data of one shard.

    Parameters
    ----------
    spec : TableSpec
        Columns and capacity.
    tier : StorageTier
        Where the arrays live.

    Examples
    --------
    >>> from gear_flow.spec import ColumnSpec, TableSpec
    >>> from gear_flow.storage.base import HostTier
    >>> ring = ColumnRing(TableSpec((ColumnSpec("x", (2,)),), capacity=8), HostTier())
    >>> ring.columns["x"].shape
    (8, 2)
    """

    def __init__(self, spec: TableSpec, tier: StorageTier):
        self.spec = spec
        self.tier = tier
        self.capacity = spec.capacity
        if getattr(tier, "persistent", False):  # files named by the column's place (names may not be file names)
            self.columns = {
                c.name: tier.array(f"ring-{k}", (spec.capacity, *c.shape), c.dtype) for k, c in enumerate(spec.columns)
            }
        else:
            self.columns = {c.name: tier.empty((spec.capacity, *c.shape), c.dtype) for c in spec.columns}
        # byte views [capacity, step_nbytes] used by the dtype-agnostic gather
        self.bytes = {n: a.reshape(self.capacity, -1).view(np.uint8) for n, a in self.columns.items()}
        # shared rings publish their write position for readers in other processes (a seqlock)
        self.header = tier.empty((2,), np.int64) if getattr(tier, "shared", False) else None
        if self.header is not None:
            self.header[:] = 0
        self._wp = 0

    @property
    def write_pos(self) -> int:
        """Absolute position of the next step to write."""
        return self._wp

    @write_pos.setter
    def write_pos(self, v: int) -> None:
        self._wp = int(v)
        if self.header is not None:
            self.header[0] = self._wp
            self.header[1] = max(int(self.header[1]), self._wp)

    def begin_write(self, upto: int) -> None:
        """Announce that steps up to ``upto`` (absolute) are about to be written (before any slot changes).

        Shared rings publish it in their seqlock header, so that a reader in
        another process detects a window being overwritten; a no-op otherwise.

        Parameters
        ----------
        upto : int
            Absolute position one past the last step about to be written.
        """
        if self.header is not None:
            self.header[1] = int(upto)

    def write(self, pos: int, name: str, rows: np.ndarray) -> None:
        """Write rows of one column from an absolute position (wrapping).

        Parameters
        ----------
        pos : int
            Absolute step position of the first row.
        name : str
            The column.
        rows : numpy.ndarray
            ``[T, *column.shape]``, ``T <= capacity``.
        """
        self.tier.write_rows(self.columns[name], pos % self.capacity, rows)

    def write_chunks(self, pos: int, name: str, parts: list) -> None:
        """Write ``parts`` back to back from absolute ``pos``: one tier call per column per insert.

        Parameters
        ----------
        pos : int
            Absolute step position of the first row.
        name : str
            The column.
        parts : list of arrays
            Rows ``[T_k, *shape]`` of that column (host or device), one per episode.
        """
        self.tier.write_chunks(self.columns[name], pos % self.capacity, parts)

    def read(self, name: str, start: int, n: int) -> np.ndarray:
        """Copy ``n`` steps of one column, from an absolute position, to host memory.

        Parameters
        ----------
        name : str
            The column.
        start : int
            Absolute step position of the first step.
        n : int
            Steps to read, ``n <= capacity``.

        Returns
        -------
        numpy.ndarray
            A new host array ``[n, *column.shape]``.
        """
        return self.tier.read_rows(self.columns[name], start % self.capacity, n)

    @property
    def nbytes(self) -> int:
        """Bytes of the column rings (the tier's memory, whatever is stored)."""
        return sum(int(a.nbytes) for a in self.columns.values())
