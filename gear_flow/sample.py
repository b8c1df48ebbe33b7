"""The sample result handed to learners, and reusable output buffers.

Windows are gathered straight into byte buffers that torch tensors alias
(``torch.from_numpy``, zero-copy), so a batch reaches the learner without any
copy beyond the gather itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import TableSpec


def _torch():
    import torch

    return torch


@dataclass
class SampleBatch:
    """One sampled batch of ``B`` windows of ``L`` steps.

    Attributes
    ----------
    data : dict of str to torch.Tensor
        One tensor per requested column, shape ``[B, L, *column.shape]``, the
        column's dtype.  Padded steps are zero.
    keys : torch.Tensor
        int64 ``[B]``: the key of each sampled item, for priority updates and
        deletes.  Keys are never reused.
    probabilities : torch.Tensor
        float64 ``[B]``: the probability with which each item was drawn under
        the distribution actually used (two-level over shards, strict windows
        renormalised).  Deterministic selectors (Fifo, Lifo, heaps) report 1;
        WithoutReplacement reports ``1 / items left in the epoch``.
    weights : torch.Tensor
        float32 ``[B]``: importance-sampling weights ``(P_i)^-beta`` divided by
        the batch maximum, for Prioritized samplers; ones otherwise.
    mask : torch.Tensor
        bool ``[B, L]``: True where the window step holds data, False on padding.
    episode_ids : torch.Tensor
        int64 ``[B]``: table-wide id of each window's episode.
    timesteps : torch.Tensor
        int64 ``[B]``: index within its episode of the window's first valid step.
    table_size : int
        Items in the table when the batch was drawn.
    length : int
        ``L``, the window length.

    Examples
    --------
    ``batch["obs"]`` is ``batch.data["obs"]``.
    """

    data: dict
    keys: object
    probabilities: object
    weights: object
    mask: object
    episode_ids: object
    timesteps: object
    table_size: int
    length: int

    def __getitem__(self, name: str):
        return self.data[name]

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def to(self, device, non_blocking: bool = True) -> SampleBatch:
        """A copy of the batch on ``device`` (torch semantics)."""
        mv = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return SampleBatch(
            {k: mv(v) for k, v in self.data.items()},
            mv(self.keys),
            mv(self.probabilities),
            mv(self.weights),
            mv(self.mask),
            mv(self.episode_ids),
            mv(self.timesteps),
            self.table_size,
            self.length,
        )


class SampleBuffers:
    """Preallocated output of ``sample`` for a fixed ``(B, L, columns)``.

    Passing the same buffers to successive ``sample(out=...)`` calls avoids
    allocating (and page-faulting) fresh memory per batch.  A batch returned
    with ``out=buffers`` aliases them: it is overwritten by the next sample into
    the same buffers.  :class:`~gear_flow.stream.Stream` rotates a pool of them.

    Examples
    --------
    >>> import numpy as np
    >>> from gear_flow.spec import ColumnSpec, TableSpec
    >>> spec = TableSpec((ColumnSpec("obs", (3,), np.float32),), capacity=10)
    >>> buf = SampleBuffers(spec, ["obs"], batch_size=4, length=2)
    >>> buf.arrays["obs"].shape
    (4, 2, 3)
    """

    def __init__(self, spec: TableSpec, columns, batch_size: int, length: int):
        self.columns = tuple(columns)
        self.batch_size = int(batch_size)
        self.length = int(length)
        B, L = self.batch_size, self.length
        self.bytes = {}
        self.arrays = {}
        for name in self.columns:
            c = spec.column(name)
            raw = np.empty((B, L, max(c.nbytes, 1)), dtype=np.uint8)
            self.bytes[name] = raw
            self.arrays[name] = raw.view(c.dtype).reshape(B, L, *c.shape)
        self.keys = np.empty(B, dtype=np.int64)
        self.probabilities = np.empty(B, dtype=np.float64)
        self.weights = np.empty(B, dtype=np.float32)
        self.mask = np.empty((B, L), dtype=np.bool_)
        self.episode_ids = np.empty(B, dtype=np.int64)
        self.timesteps = np.empty(B, dtype=np.int64)
        self._tensors = None

    def matches(self, columns, batch_size: int, length: int) -> bool:
        return tuple(columns) == self.columns and batch_size == self.batch_size and length == self.length

    def batch(self, table_size: int) -> SampleBatch:
        if self._tensors is None:
            t = _torch().from_numpy
            self._tensors = (
                {k: t(v) for k, v in self.arrays.items()},
                t(self.keys),
                t(self.probabilities),
                t(self.weights),
                t(self.mask),
                t(self.episode_ids),
                t(self.timesteps),
            )
        d, k, p, w, m, e, ts = self._tensors
        return SampleBatch(d, k, p, w, m, e, ts, int(table_size), self.length)
