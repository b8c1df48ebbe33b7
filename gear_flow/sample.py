"""The sample result handed to learners, and reusable output buffers.

Windows are gathered straight into byte buffers that torch tensors alias
(``torch.from_numpy`` for host buffers, ``torch.from_dlpack`` for device
buffers; zero-copy either way), so a batch reaches the learner without any copy
beyond the gather itself.  Which kind of buffer a table fills is decided by its
storage tier (:func:`gear_flow.backend.output_module`): ``host`` gathers into
NumPy memory, ``pinned`` and ``device`` gather on the GPU into CuPy memory.
Only the column data moves to the device; keys, probabilities, weights, mask,
episode ids and timesteps are computed on the host and stay there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from . import backend
from .ops import rows as _rows
from .spec import TableSpec

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from .storage.base import StorageTier


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
        Items in the table when the batch was drawn; a distributed table's
        as its coordinator counted them when it admitted the batch (a batch
        served under an admission lease: when the lease was granted).
    length : int
        ``L``, the window length.
    priorities : torch.Tensor or None
        float64 ``[B]``: each item's priority when it was drawn (Reverb's
        ``SampleInfo.priority``); NaN where the table did not report it.
    times_sampled : torch.Tensor or None
        int64 ``[B]``: how many times each item has been sampled, this sample
        included (Reverb's ``SampleInfo.times_sampled``); -1 where the table
        does not count it.

    Examples
    --------
    ``batch["obs"]`` is ``batch.data["obs"]``; ``batch.to_tensordict()`` is
    the batch as a ``tensordict.TensorDict``.
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
    priorities: object = None
    times_sampled: object = None

    def __getitem__(self, name: str) -> torch.Tensor:
        """The tensor of column ``name`` (``self.data[name]``)."""
        return self.data[name]

    def __len__(self) -> int:
        """``B``, the number of windows."""
        return int(self.keys.shape[0])

    def to(self, device: str | torch.device, non_blocking: bool = True) -> SampleBatch:
        """A copy of the batch on ``device`` (torch semantics).

        Parameters
        ----------
        device : str or torch.device
            Target device, e.g. ``"cuda:0"`` or ``"cpu"``.
        non_blocking : bool, default True
            Passed to every ``Tensor.to``: copies from pinned host memory
            overlap with the caller.

        Returns
        -------
        SampleBatch
            Every tensor moved (tensors already on ``device`` are shared, as
            ``Tensor.to`` does); ``table_size`` and ``length`` as they are.
        """
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
            None if self.priorities is None else mv(self.priorities),
            None if self.times_sampled is None else mv(self.times_sampled),
        )

    def to_tensordict(self, columns: dict | None = None, names: dict | None = None) -> TensorDict:
        """The batch as a ``tensordict.TensorDict`` of batch size ``[B]`` (needs the ``tensordict`` extra).

        Parameters
        ----------
        columns : dict, optional
            Column name -> key in the TensorDict (a str or a tuple for a nested
            key, e.g. ``{"reward": ("next", "reward")}``); other columns keep
            their names.
        names : dict, optional
            Overrides of the keys of the per-item fields; see Returns.

        Returns
        -------
        tensordict.TensorDict
            The column tensors ``[B, L, ...]`` plus, by default under TorchRL's
            names, ``index`` (keys, for ``update_priorities``), ``_weight``
            (importance weights), ``priority``, ``probability``,
            ``times_sampled``, ``mask`` ``[B, L]``, ``episode_id`` and
            ``timestep``.  The tensors are the batch's own (no copy).  A
            column whose key is a field's default key (``timestep`` of
            :func:`~gear_flow.ingest.episode_columns`, a ``priority`` column)
            keeps it, and that field is left out unless ``names`` gives it a key.

        Raises
        ------
        SpecError
            ``names`` or ``columns`` give a column and a field the same key.
        """
        try:
            from tensordict import TensorDict
        except ImportError:
            raise ImportError(
                "SampleBatch.to_tensordict needs tensordict: pip install 'gear-flow[tensordict]'"
            ) from None
        names = names or {}
        keys = {**TENSORDICT_NAMES, **names}
        B = len(self)
        fields = {
            "keys": self.keys,
            "weights": self.weights,
            "priorities": self.priorities,
            "probabilities": self.probabilities,
            "times_sampled": self.times_sampled,
            "mask": self.mask,
            "episode_ids": self.episode_ids,
            "timesteps": self.timesteps,
        }
        td = TensorDict({}, batch_size=[B])
        taken = {}
        for name, t in self.data.items():
            key = (columns or {}).get(name, name)
            td.set(key, t)
            taken[key if isinstance(key, tuple) else (key,)] = name
        for field, t in fields.items():
            key = keys[field]
            name = taken.get(key if isinstance(key, tuple) else (key,))
            if name is not None:  # the user's column wins a default key (it was overwritten by the field)
                if field in names or name in (columns or {}):
                    from .errors import SpecError

                    raise SpecError(
                        f"column {name!r} and the batch's {field} would both be TensorDict key {key!r}; "
                        "give one of them another key (columns= or names=)"
                    )
                continue
            if t is not None:
                td.set(key, t)
        return td


#: rows written without reported priorities or counts: NaN and -1 (:meth:`SampleBuffers.fill_rows`)
NO_PRIORITIES = np.zeros(0, np.float64)
NO_COUNTS = np.zeros(0, np.int64)

#: SampleBatch field -> its key in :meth:`SampleBatch.to_tensordict` (TorchRL's names where it has them)
TENSORDICT_NAMES = {
    "keys": "index",
    "weights": "_weight",
    "priorities": "priority",
    "probabilities": "probability",
    "times_sampled": "times_sampled",
    "mask": "mask",
    "episode_ids": "episode_id",
    "timesteps": "timestep",
}


class SampleBuffers:
    """Preallocated output of ``sample`` for a fixed ``(B, L, columns)``.

    Passing the same buffers to successive ``sample(out=...)`` calls avoids
    allocating (and page-faulting) fresh memory per batch.  A batch returned
    with ``out=buffers`` aliases them: it is overwritten by the next sample into
    the same buffers.  :class:`~gear_flow.stream.Stream` rotates a pool of them.

    Parameters
    ----------
    spec : TableSpec
        The table's columns.
    columns : sequence of str
        Columns to hold.
    batch_size, length : int
        ``B`` and ``L``.
    tier : str or StorageTier
        Storage tier of the table that fills the buffers (default ``"host"``).
        For ``pinned`` and ``device`` the column buffers are CuPy arrays on the
        current device and the batch's column tensors are CUDA tensors.
    empty : callable, optional
        ``empty(shape, dtype)`` makes each column buffer: a tier's
        :meth:`~gear_flow.storage.base.StorageTier.empty_output`, so that a
        worker's reply reuses large buffers once sent (fresh pages cost more
        than the gather); default: the tier's array module's ``empty``.

    Attributes
    ----------
    bytes : dict of str to array
        Per column, ``uint8 [B, L, row bytes]``: what gathers write.
    arrays : dict of str to array
        Per column, the same memory viewed as ``[B, L, *shape]`` in the
        column's dtype.
    keys, episode_ids, timesteps : numpy.ndarray
        int64 ``[B]``.
    probabilities : numpy.ndarray
        float64 ``[B]``.
    weights : numpy.ndarray
        float32 ``[B]``.
    mask : numpy.ndarray
        bool ``[B, L]``.
    priorities : numpy.ndarray
        float64 ``[B]``, NaN where not reported.
    times_sampled : numpy.ndarray
        int64 ``[B]``, -1 where not counted.
    on_device : bool
        Whether the column buffers are device (CuPy) arrays.

    Raises
    ------
    SpecError
        A column not in ``spec``, or an unknown tier.
    BackendUnavailableError
        A GPU tier where there is no usable GPU.

    Examples
    --------
    >>> import numpy as np
    >>> from gear_flow.spec import ColumnSpec, TableSpec
    >>> spec = TableSpec((ColumnSpec("obs", (3,), np.float32),), capacity=10)
    >>> buf = SampleBuffers(spec, ["obs"], batch_size=4, length=2)
    >>> buf.arrays["obs"].shape
    (4, 2, 3)
    """

    def __init__(
        self,
        spec: TableSpec,
        columns: Sequence[str],
        batch_size: int,
        length: int,
        tier: str | StorageTier = "host",
        empty: Callable[[tuple, type], Any] | None = None,
    ) -> None:
        self.columns = tuple(columns)
        self.batch_size = int(batch_size)
        self.length = int(length)
        self.tier = backend.tier_name(tier)
        #: are the column buffers device (CuPy) arrays?
        self.on_device = backend.output_on_device(self.tier)
        xp = backend.output_module(self.tier)
        B, L = self.batch_size, self.length
        self.bytes = {}
        self.arrays = {}
        for name in self.columns:
            c = spec.column(name)
            shape = (B, L, max(c.nbytes, 1))
            raw = xp.empty(shape, dtype=np.uint8) if empty is None else empty(shape, np.uint8)
            self.bytes[name] = raw
            self.arrays[name] = raw.view(c.dtype).reshape(B, L, *c.shape)
        self.keys = np.empty(B, dtype=np.int64)
        self.probabilities = np.empty(B, dtype=np.float64)
        self.weights = np.empty(B, dtype=np.float32)
        self.mask = np.empty((B, L), dtype=np.bool_)
        self.episode_ids = np.empty(B, dtype=np.int64)
        self.timesteps = np.empty(B, dtype=np.int64)
        self.priorities = np.full(B, np.nan)
        self.times_sampled = np.full(B, -1, dtype=np.int64)
        self._tensors = None

    @classmethod
    def wrap(cls, spec: TableSpec, columns: Sequence[str], length: int, parts: dict) -> SampleBuffers:
        """Buffers around arrays that arrived from a worker (no copy).

        Host arrays, or device arrays from a table on a GPU tier (then the
        batch's column tensors are CUDA tensors and ``tier`` is ``device``).

        Parameters
        ----------
        spec : TableSpec
            The table's columns.
        columns : sequence of str
            Columns in ``parts["data"]``.
        length : int
            ``L``.
        parts : dict
            A worker's ``sample_all`` reply: ``data`` (``{column: uint8 [B,
            L, row bytes]}``), ``keys``, ``probabilities``, ``weights``,
            ``mask``, ``episode_ids``, ``timesteps``, and optionally
            ``priorities`` and ``times_sampled``.

        Returns
        -------
        SampleBuffers
            Aliasing the arrays of ``parts``.
        """
        self = cls.__new__(cls)
        self.columns = tuple(columns)
        self.batch_size = len(parts["keys"])
        self.length = int(length)
        self.on_device = any(backend.is_device_array(a) for a in parts["data"].values())
        self.tier = "device" if self.on_device else "host"
        self.bytes = dict(parts["data"])
        self.arrays = {}
        for name in self.columns:
            c = spec.column(name)
            self.arrays[name] = self.bytes[name].view(c.dtype).reshape(self.batch_size, self.length, *c.shape)
        for f in ("keys", "probabilities", "weights", "mask", "episode_ids", "timesteps"):
            setattr(self, f, parts[f])
        # a host that does not report them: NaN / -1 (see SampleBatch)
        self.priorities = parts["priorities"] if "priorities" in parts else np.full(self.batch_size, np.nan)
        self.times_sampled = (
            parts["times_sampled"] if "times_sampled" in parts else np.full(self.batch_size, -1, dtype=np.int64)
        )
        self._tensors = None
        return self

    def matches(
        self,
        columns: Sequence[str],
        batch_size: int,
        length: int,
        tier: str | StorageTier | None = None,
        spec: TableSpec | None = None,
    ) -> bool:
        """Can these buffers hold a sample of ``(columns, batch_size, length)`` from a table of ``tier``?

        Parameters
        ----------
        columns : sequence of str
            Columns of the sample, in order.
        batch_size : int
            ``B`` of the sample.
        length : int
            ``L`` of the sample.
        tier : str or StorageTier, optional
            The table's tier; None: memory kind not checked.
        spec : TableSpec, optional
            The table's columns; None: their dtypes and shapes not checked.

        Returns
        -------
        bool
            Same columns (in order), ``B`` and ``L``, and (with ``tier``)
            the same memory kind (host or device) as the tier's output, and
            (with ``spec``) each column's dtype and step shape.
        """
        same = tuple(columns) == self.columns and batch_size == self.batch_size and length == self.length
        same = same and (tier is None or backend.output_on_device(tier) == self.on_device)
        if same and spec is not None:  # buffers made for another table: a gather would store other bytes
            for name in self.columns:
                c, a = spec.column(name), self.arrays[name]
                if a.dtype != c.dtype or tuple(a.shape[2:]) != c.shape:
                    return False
        return same

    def check(
        self, spec: TableSpec, columns: Sequence[str], batch_size: int, length: int, tier: str | StorageTier
    ) -> None:
        """Raise unless these buffers :meth:`matches` a sample of ``(columns, batch_size, length)`` from a table
        of ``spec`` and ``tier``.

        Parameters
        ----------
        spec : TableSpec
            The table's columns.
        columns : sequence of str
            Columns of the sample, in order.
        batch_size, length : int
            ``B`` and ``L`` of the sample.
        tier : str or StorageTier
            The table's tier.

        Raises
        ------
        SpecError
            Naming what the buffers are for and what the call asks.
        """
        if self.matches(columns, batch_size, length, tier, spec):
            return
        from .errors import SpecError

        mine = ", ".join(f"{n} {self.arrays[n].dtype}{tuple(self.arrays[n].shape[2:])}" for n in self.columns)
        asked = ", ".join(f"{n} {spec.column(n).dtype}{spec.column(n).shape}" for n in columns)
        raise SpecError(
            f"out buffers are for columns ({mine}), batch_size={self.batch_size}, length={self.length}, "
            f"tier={self.tier!r}; this call asks for columns ({asked}), batch_size={batch_size}, length={length} "
            f"from a {backend.tier_name(tier)!r} table"
        )

    def gather_stream(self) -> contextlib.AbstractContextManager:
        """Context in which a table gathers into these buffers.

        For device buffers: the learner's current torch stream (as a CuPy
        stream), so that the gather runs after the learner's work on the
        previous batch in these buffers and before its work on this one.  For
        host buffers: nothing.

        Returns
        -------
        contextlib.AbstractContextManager
            A ``cupy.cuda.Stream`` (device buffers) or a null context.
        """
        if not self.on_device:
            return contextlib.nullcontext()
        from .gpu.streams import learner_stream

        return learner_stream()

    def permute(self, src: np.ndarray) -> None:
        """Reorder the batch in place: the new row ``r`` of every buffer is the old row ``src[r]``.

        ``src`` is a host int array; for device buffers a device copy of it
        does the indexing (the index lives where the data does).

        Parameters
        ----------
        src : numpy.ndarray
            int ``[B]``, a permutation of ``0 .. B-1``.
        """
        src = np.asarray(src, dtype=np.int64)
        dsrc = backend.output_module(self.tier).asarray(src) if self.on_device else src
        for a in self.bytes.values():
            a[...] = a[dsrc]
        for a in self._item_arrays():
            a[...] = a[src]

    def fill_rows(
        self,
        off: int,
        shard_id: int,
        seqs: ArrayLike,
        probabilities: ArrayLike,
        episode_ids: ArrayLike,
        timesteps: ArrayLike,
        dst_offset: ArrayLike,
        n_valid: ArrayLike,
        priorities: ArrayLike | None = None,
        times_sampled: ArrayLike | None = None,
    ) -> None:
        """Everything of rows ``off:off+n`` but the window bytes (gathered separately), in one compiled pass
        (:func:`gear_flow.ops.rows.fill`; a shard's fused take calls it from compiled code).

        Parameters
        ----------
        off : int
            First row to fill.
        shard_id : int
            Shard the ``n`` rows come from (encoded into their keys).
        seqs : array_like of int
            ``[n]`` item seqs within the shard.
        probabilities : array_like of float
            ``[n]`` probability of each draw.
        episode_ids : array_like of int
            ``[n]`` table-wide episode id of each window.
        timesteps : array_like of int
            ``[n]`` index in its episode of each window's first valid step.
        dst_offset : array_like of int
            ``[n]`` first row of the window that holds data (padding before it).
        n_valid : array_like of int
            ``[n]`` steps of the window that hold data.
        priorities : array_like of float, optional
            ``[n]`` priorities when drawn; NaN when not reported.
        times_sampled : array_like of int, optional
            ``[n]`` times sampled, this sample included; -1 when not reported
            (see :class:`SampleBatch`).

        Raises
        ------
        IndexError
            The rows do not fit the batch, or the arrays differ in length; nothing is written then.
        """
        i64 = np.int64
        if not _rows.fill(
            self.rows(), int(off), int(shard_id), np.asarray(seqs, i64), np.asarray(probabilities, np.float64),
            1.0, np.asarray(episode_ids, i64), np.asarray(timesteps, i64), np.asarray(dst_offset, i64),
            np.asarray(n_valid, i64), NO_PRIORITIES if priorities is None else np.asarray(priorities, np.float64),
            NO_COUNTS if times_sampled is None else np.asarray(times_sampled, i64),
        ):  # fmt: skip
            raise IndexError(
                f"fill_rows: {len(seqs)} rows from row {off} do not fit a batch of {len(self.keys)}, "
                "or the row arrays differ in length"
            )

    def rows(self) -> tuple:
        """The per-row arrays in the order :func:`gear_flow.ops.rows.fill` writes them.

        Returns
        -------
        tuple of numpy.ndarray
            ``keys``, ``probabilities``, ``episode_ids``, ``timesteps``,
            ``priorities``, ``times_sampled``, ``mask``.
        """
        return (
            self.keys, self.probabilities, self.episode_ids, self.timesteps, self.priorities, self.times_sampled,
            self.mask,
        )  # fmt: skip

    def _item_arrays(self) -> tuple:
        return (
            self.keys,
            self.probabilities,
            self.weights,
            self.mask,
            self.episode_ids,
            self.timesteps,
            self.priorities,
            self.times_sampled,
        )

    def batch(self, table_size: int) -> SampleBatch:
        """The buffers as a :class:`SampleBatch` of torch tensors aliasing them (no copy).

        The tensors are made once and reused, so successive batches from the
        same buffers share memory.  For device buffers gathered outside
        :meth:`gather_stream`, torch's current stream is first ordered after
        CuPy's.

        Parameters
        ----------
        table_size : int
            Items in the table when the batch was drawn (-1: not known).

        Returns
        -------
        SampleBatch
            Columns ``[B, L, *shape]``, keys, probabilities, weights, mask,
            episode ids, timesteps, priorities and times sampled.
        """
        if self._tensors is None:
            t = _torch().from_numpy
            self._tensors = (
                {k: backend.to_torch(v) for k, v in self.arrays.items()},
                t(self.keys),
                t(self.probabilities),
                t(self.weights),
                t(self.mask),
                t(self.episode_ids),
                t(self.timesteps),
                t(self.priorities),
                t(self.times_sampled),
            )
        elif self.on_device:
            from .gpu.streams import publish

            publish()  # gathered outside gather_stream(): order torch's stream after it
        d, k, p, w, m, e, ts, pr, n = self._tensors
        return SampleBatch(d, k, p, w, m, e, ts, int(table_size), self.length, pr, n)
