"""Input validation shared by every table: nothing is applied unless all of it is valid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
from numba import njit
from numpy.typing import ArrayLike

from ..backend import is_device_array
from ..errors import InvalidDataError, InvalidPriorityError, SpecError, UnknownKeyError
from ..keys import decode, shard_of
from ..ops._mem import array_headers, rows_of
from ..spec import BOUNDARIES, TableSpec


def as_episode_list(episodes: Mapping | Sequence[Mapping]) -> list[Mapping]:
    """One mapping (one episode) or a sequence of mappings, as a list of episodes.

    Parameters
    ----------
    episodes : mapping or sequence of mappings
        One episode (``{column: array}``) or several.

    Returns
    -------
    list of mapping
        The episodes (a single one wrapped in a list).

    Raises
    ------
    InvalidDataError
        Neither, or a sequence with an item that is not a mapping.
    """
    if isinstance(episodes, Mapping):
        return [episodes]
    if isinstance(episodes, Sequence) and not isinstance(episodes, (str, bytes)):
        eps = list(episodes)
        if set(map(type, eps)) <= _DICT:  # (the usual case, checked in C: no isinstance per episode)
            return eps
        for i, e in enumerate(eps):
            if not isinstance(e, Mapping):
                raise InvalidDataError(f"episode {i} is a {type(e).__name__}; expected a mapping of column -> array")
        return eps
    raise InvalidDataError(
        f"episodes must be a mapping of column -> array or a sequence of them, got {type(episodes).__name__}"
    )


def check_episode(spec: TableSpec, ep: Mapping, i: int) -> tuple[dict, int]:
    """Validate one episode and cast it to the spec's dtypes, or raise, naming what is wrong.

    Parameters
    ----------
    spec : TableSpec
        The table's spec.
    ep : mapping
        ``{column: array [T, *column.shape]}`` with exactly the spec's
        columns; NumPy arrays, anything ``np.asarray`` reads, or CuPy arrays.
    i : int
        The episode's index in the call, for messages.

    Returns
    -------
    columns : dict of str to array
        Each column C-contiguous in its column's dtype (device arrays stay on
        the device).
    T : int
        Steps of the episode (>= 1).

    Raises
    ------
    InvalidDataError
        Missing or unknown columns, a non-numeric dtype, a wrong shape, a
        dtype that cannot be cast within its kind, columns of different
        lengths, or no steps.
    """
    if ep.keys() != spec.name_set:
        _check_names(spec, ep, f"episode {i}")
    out = {}
    T = None
    for c in spec.columns:
        a = ep[c.name]
        if _ready(a, c, 1) is None:
            dims = "".join(", " + str(s) for s in c.shape)
            a = _contiguous(
                _column(a, c, f"episode {i}, column {c.name!r}", 1, f"(T, *{c.shape}) = (T{dims})"), c.dtype
            )
        if T is None:
            T = a.shape[0]
        elif a.shape[0] != T:
            raise InvalidDataError(
                f"episode {i}: columns have different lengths ({c.name!r} has {a.shape[0]} steps, "
                f"{spec.columns[0].name!r} has {T})"
            )
        out[c.name] = a
    if not T:
        raise InvalidDataError(f"episode {i} has no steps; an episode needs at least one")
    return out, int(T)


def check_episodes(spec: TableSpec, eps: Sequence[Mapping]) -> tuple[list, np.ndarray]:
    """:func:`check_episode` of every episode of an insert: each one's columns and the steps of each.

    Episodes that are already what the table stores (every column a
    C-contiguous NumPy array of its dtype and row shape, with one length per
    episode: what a collector or a dataset reader hands over) are checked
    column by column over all episodes at once, in C (``map`` over the
    arrays' attributes), and kept as they are: an insert of many short
    episodes then costs a fraction of a microsecond per array, not the
    microsecond of Python a check per array takes.  Anything else is checked
    and cast episode by episode, with :func:`check_episode`'s errors.

    Parameters
    ----------
    spec : TableSpec
        The table's spec.
    eps : sequence of mapping
        The episodes (:func:`as_episode_list`).

    Returns
    -------
    columns : list of dict
        Per episode ``{column: array [T, *shape]}``, C-contiguous in the
        column's dtype.
    lengths : numpy.ndarray
        int64 ``[n]``: steps of each episode.

    Raises
    ------
    InvalidDataError
        As :func:`check_episode`, for the first episode that is wrong.
    """
    lengths = _ready_episodes(spec, eps)
    if lengths is not None:
        return list(eps), lengths
    checked = [check_episode(spec, e, i) for i, e in enumerate(eps)]
    return [c for c, _ in checked], np.array([t for _, t in checked], dtype=np.int64)


def _ready_episodes(spec: TableSpec, eps: Sequence[Mapping]) -> np.ndarray | None:
    """The steps of each episode when every one is ready to store as it is (exactly the spec's columns, each a
    C-contiguous NumPy array of its dtype, ``[T >= 1, *shape]``, one ``T`` per episode), else None."""
    # exactly the spec's columns: as many keys as columns, each column's key present (its itemgetter below);
    # a length each is a tenth of comparing each key view with the spec's names
    if not eps or set(map(len, eps)) != {len(spec.columns)}:
        return None
    lengths = None
    for c in spec.columns:
        try:
            parts = list(map(itemgetter(c.name), eps))
        except KeyError:
            return None
        t = _ready_lengths(parts, c)
        if t is None:
            return None
        if lengths is None:
            lengths = t
        elif not np.array_equal(lengths, t):
            return None
    return lengths


def _ready_lengths(parts: list, c) -> np.ndarray | None:
    """The steps of each of one column's ``parts`` when every one is ready to store as it is (a C-contiguous
    NumPy array of the column's dtype, ``[T >= 1, *shape]``), else None: read off the arrays' objects in
    one compiled pass (:func:`~gear_flow.ops._mem.array_headers`: 1,024 episodes of 4 columns in 0.22 ms,
    where asking the arrays took 0.62 ms), or asked of them where those cannot be read or disagree (a
    dtype object that is not the column's own)."""
    head = array_headers(parts)
    if head is not None:
        t = np.empty(len(parts), dtype=np.int64)
        if rows_of(head, id(c.dtype), np.array(c.shape, dtype=np.int64), t) and t.min() >= 1:
            return t
    if (
        set(map(type, parts)) != _NDARRAY
        or set(map(attrgetter("dtype"), parts)) != {c.dtype}
        or set(map(attrgetter("flags.c_contiguous"), parts)) != _TRUE
    ):
        return None
    if c.shape:
        for shape in set(map(attrgetter("shape"), parts)):  # a few distinct shapes
            if len(shape) != 1 + len(c.shape) or shape[1:] != c.shape:
                return None
    elif set(map(attrgetter("ndim"), parts)) != _ONE:  # (an int each: cheaper than a shape's tuple)
        return None
    t = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    return t if t.min() >= 1 else None


_NDARRAY, _TRUE, _ONE, _DICT = {np.ndarray}, {True}, {1}, {dict}


def check_batch(spec: TableSpec, columns: Mapping) -> tuple[dict, int, int]:
    """Validate a batch of trajectories and cast it to the spec's dtypes, or raise, naming what is wrong.

    The batched form of :func:`check_episode` (``[B, T, *shape]`` per column,
    rows are trajectories); device arrays stay on the device.

    Parameters
    ----------
    spec : TableSpec
        The table's spec.
    columns : mapping
        ``{column: array [B, T, *column.shape]}`` with exactly the spec's
        columns.

    Returns
    -------
    arrays : dict of str to array
        Each column C-contiguous in its column's dtype.
    B : int
        Trajectories (>= 1).
    T : int
        Steps per trajectory (>= 1).

    Raises
    ------
    InvalidDataError
        Not a mapping, missing or unknown columns, a non-numeric dtype, a
        wrong shape, a dtype that cannot be cast within its kind, columns of
        different ``(B, T)``, or ``B`` or ``T`` of 0.
    """
    if not isinstance(columns, Mapping):
        raise InvalidDataError(f"a batch must map every column to a [B, T, ...] array, got {type(columns).__name__}")
    _check_names(spec, columns, "batch")
    out, BT = {}, None
    for c in spec.columns:
        a = _ready(columns[c.name], c, 2)
        if a is None:
            dims = "".join(", " + str(s) for s in c.shape)
            a = _column(columns[c.name], c, f"batch column {c.name!r}", 2, f"(B, T{dims})")
        if BT is None:
            BT = tuple(a.shape[:2])
        elif tuple(a.shape[:2]) != BT:
            raise InvalidDataError(
                f"batch: columns have different (B, T) ({c.name!r} has {tuple(a.shape[:2])}, "
                f"{spec.columns[0].name!r} has {BT})"
            )
        out[c.name] = _contiguous(a, c.dtype)
    if not BT[0] or not BT[1]:
        raise InvalidDataError(f"batch of shape (B, T) = {BT}: needs at least one trajectory of at least one step")
    return out, int(BT[0]), int(BT[1])


def _check_names(spec: TableSpec, given: Mapping, where: str) -> None:
    """Exactly the spec's columns, or an error naming the missing and unknown ones."""
    names, got = set(spec.names), set(given)
    if got != names:
        missing, extra = sorted(names - got), sorted(got - names)
        raise InvalidDataError(
            f"{where}: columns do not match the table"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {extra}" if extra else "")
            + f" (table columns: {list(spec.names)})"
        )


def _ready(value, c, lead: int):
    """``value`` when it is already a C-contiguous NumPy array of ``c.dtype`` and ``lead`` leading dimensions
    then ``c.shape`` (the usual case: nothing to check further or cast), else None."""
    if (
        type(value) is np.ndarray
        and value.dtype == c.dtype
        and value.ndim == lead + len(c.shape)
        and value.shape[lead:] == c.shape
        and value.flags.c_contiguous
    ):
        return value
    return None


def _column(value, c, where: str, lead: int, shape_text: str):
    """``value`` read as an array of ``lead`` leading dimensions then ``c.shape``, checked storable as
    ``c.dtype`` (:func:`storable`; not yet cast), or an error naming ``where`` and, for the shape,
    ``shape_text``."""
    a = as_array(value, where)
    if a.dtype.kind not in "biufc":
        raise InvalidDataError(f"{where}: dtype {a.dtype} is not numeric")
    if a.ndim != lead + len(c.shape) or tuple(a.shape[lead:]) != c.shape:
        raise InvalidDataError(f"{where}: shape {tuple(a.shape)} must be {shape_text}")
    storable(a, c.dtype, where)
    return a


def storable(a: np.ndarray, dtype: np.dtype, where: str) -> None:
    """Refuse values whose cast to a column's ``dtype`` would change them beyond rounding: the one rule of
    every way in (inserts, batches, writers).

    Allowed: dtypes that cast safely or within their kind (float64 into a
    float32 column rounds), and integers of either sign into an integer
    column when every value fits it.  Refused: a cast across kinds that
    loses (float into int, anything into bool, complex into real), an
    integer that would wrap round, and a finite value that would become
    infinite in a narrower float.

    Parameters
    ----------
    a : numpy.ndarray or device array
        Numeric values.
    dtype : numpy.dtype
        The column's.
    where : str
        Names the values in the message.

    Raises
    ------
    InvalidDataError
        The first such value or dtype, named.
    """
    dtype = np.dtype(dtype)
    ints = a.dtype.kind in "iu" and dtype.kind in "iu"
    if not (ints or np.can_cast(a.dtype, dtype, "same_kind")):
        raise InvalidDataError(
            f"{where}: dtype {a.dtype} cannot be stored as {dtype} "
            "(allowed: dtypes that cast safely or within the same kind)"
        )
    if not a.size or np.can_cast(a.dtype, dtype, "safe"):
        return
    if ints:  # an integer cast within its kind, or across signs, must fit: one that does not wraps round
        lo, hi, info = int(a.min()), int(a.max()), np.iinfo(dtype)
        if lo < info.min or hi > info.max:
            raise InvalidDataError(
                f"{where}: value {lo if lo < info.min else hi} does not fit {dtype} [{info.min}, {info.max}]"
            )
    elif dtype.kind == "f" and a.dtype.kind in "iuf":  # a finite value past the float's range becomes inf
        top = float(np.finfo(dtype).max)
        source = np.iinfo(a.dtype) if a.dtype.kind in "iu" else np.finfo(a.dtype)
        if float(source.max) <= top:  # (int64 into float32: no value can; only float16 is that narrow)
            return
        with np.errstate(invalid="ignore"):
            lo, hi = float(a.min()), float(a.max())  # (NaN: no comparison holds; an inf given stays one)
        bad = _overflows(a, dtype) if hi > top or lo < -top else None
        if bad is not None:
            raise InvalidDataError(f"{where}: value {bad[0]!r} does not fit {dtype} (it would become {bad[1]})")


def _overflows(a, dtype) -> tuple[float, float] | None:
    """The first finite value of ``a`` that is infinite cast to ``dtype``, and what it becomes; None if none
    (values past the largest float that round to it are kept)."""
    host = to_host(a)
    with np.errstate(over="ignore"):
        cast = np.asarray(host).astype(dtype)
    bad = np.flatnonzero(np.isinf(cast) & np.isfinite(host))
    if not len(bad):
        return None
    i = int(bad[0])
    return host.reshape(-1)[i].item(), float(cast.reshape(-1)[i])


def _contiguous(a, dtype):
    """``a`` as a C-contiguous array of ``dtype``, where it lives (device arrays stay on the device)."""
    if is_device_array(a):
        import cupy

        return cupy.ascontiguousarray(a, dtype=dtype)
    return np.ascontiguousarray(a, dtype=dtype)


def as_array(value: Any, what: str) -> Any:
    """``np.asarray(value)``, with NumPy's own errors (ragged nesting, ...) translated.

    Device arrays (CuPy, trajectories an actor produced on a GPU) are kept as
    they are; a torch tensor that requires grad is read detached (its values
    are what a table stores).

    Parameters
    ----------
    value : array_like, torch.Tensor or device array
        The values.
    what : str
        Names them in the message.

    Returns
    -------
    numpy.ndarray or device array
        The values as an array.

    Raises
    ------
    InvalidDataError
        They cannot be read as an array.
    """
    if getattr(value, "requires_grad", False):  # a tensor still in an autograd graph: its values are stored
        value = value.detach()
    if is_device_array(value):
        return value
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise InvalidDataError(f"{what}: cannot be read as an array ({e})") from None


def real_numbers(values: Any, what: str) -> np.ndarray:
    """``values`` (host or device) as float64, refused unless they are real numbers.

    A complex value is refused, not cast: its imaginary part would be
    dropped (NumPy casts an array of them with only a warning).

    Parameters
    ----------
    values : array_like, float, torch.Tensor or CuPy array
        The values, any shape.
    what : str
        Names them in the message (``"priorities"``).

    Returns
    -------
    numpy.ndarray
        float64, the shape of ``values`` (a view where it can be one).

    Raises
    ------
    InvalidDataError
        Values that are not numbers, or complex ones.
    """
    v = to_host(values)
    try:
        a = np.asarray(v)
    except (TypeError, ValueError) as e:
        raise InvalidDataError(f"{what} must be numbers, got {values!r} ({e})") from None
    if a.dtype.kind == "c" or (a.dtype.kind == "O" and any(isinstance(x, complex) for x in a.reshape(-1))):
        raise InvalidDataError(f"{what} must be real numbers, got complex ones")
    # text and None are not numbers, whatever NumPy's cast makes of them ("7.5" became 7.5, None NaN)
    if a.dtype.kind in "USV" or (a.dtype.kind == "O" and any(x is None or isinstance(x, (str, bytes)) for x in a.flat)):
        raise InvalidDataError(f"{what} must be numbers, got {values!r}")
    try:
        return a.astype(np.float64, copy=False)
    except (TypeError, ValueError) as e:
        raise InvalidDataError(f"{what} must be numbers, got {values!r} ({e})") from None


def check_priorities(priorities: ArrayLike | float | None, n: int, what: str = "items") -> np.ndarray | None:
    """Validate priorities: None, a scalar, or ``n`` values; all finite and >= 0.

    Parameters
    ----------
    priorities : array_like, float or None
        Host or device (CuPy, torch) values, any shape with ``n`` elements,
        or one value for all.
    n : int
        Items (or keys) they are for.
    what : str, default "items"
        What ``n`` counts, for the message.

    Returns
    -------
    numpy.ndarray or None
        float64 ``[n]`` (a scalar repeated), or None when ``priorities`` is
        None.

    Raises
    ------
    InvalidDataError
        Not numbers, or not ``n`` of them.
    InvalidPriorityError
        A value that is NaN, infinite or negative (the first one is named).
    """
    if priorities is None:
        return None
    p = real_numbers(priorities, "priorities")
    if p.ndim == 0:
        p = np.full(n, float(p))
    p = p.reshape(-1)
    if len(p) != n:
        raise InvalidDataError(f"got {len(p)} priorities for {n} {what}")
    bad = _first_bad_priority(p)
    if bad >= 0:
        raise InvalidPriorityError(int(bad), float(p[bad]))
    return p


def insert_priorities(priorities: Any, lengths: np.ndarray, step_items: bool) -> np.ndarray | None:
    """An insert's priorities, one per item, checked: the one rule of both tables' inserts.

    Parameters
    ----------
    priorities : None, float, array_like or sequence of array_like
        None (each shard's running max), one value for all, a flat array over
        all items of all episodes, or one array per episode (its steps' for
        step items, one value for an episode item).
    lengths : numpy.ndarray
        int64 ``[E]``, the episodes' steps.
    step_items : bool
        Items are steps (else episodes).

    Returns
    -------
    numpy.ndarray or None
        float64 ``[items]``; None when ``priorities`` is None.

    Raises
    ------
    InvalidDataError
        Not numbers; not one per item; one array per episode where an array
        is not its episode's (or not one array per episode).
    InvalidPriorityError
        A value that is NaN, infinite or negative (named by its item).

    Examples
    --------
    >>> insert_priorities([[1.0, 2.0], [3.0]], np.array([2, 1]), True).tolist()
    [1.0, 2.0, 3.0]
    >>> insert_priorities([[1.0], [2.0, 3.0]], np.array([2, 1]), True)
    Traceback (most recent call last):
    ...
    gear_flow.errors.InvalidDataError: got 1 priorities for episode 0's 2 items
    """
    per_episode = lengths if step_items else np.ones_like(lengths)
    if isinstance(priorities, (list, tuple)) and priorities and np.ndim(priorities[0]) >= 1:
        if len(priorities) != len(lengths):
            raise InvalidDataError(f"got {len(priorities)} priority arrays for {len(lengths)} episodes")
        arrays = []
        for i, (p, k) in enumerate(zip(priorities, per_episode.tolist())):
            a = real_numbers(p, f"priorities of episode {i}").reshape(-1)
            if len(a) != k:  # each its own episode's: concatenated, a wrong one would shift the rest
                raise InvalidDataError(f"got {len(a)} priorities for episode {i}'s {k} items")
            arrays.append(a)
        priorities = np.concatenate(arrays)
    return check_priorities(priorities, int(per_episode.sum()))


def to_host(x: Any) -> Any:
    """``x`` in host memory.

    A torch tensor (on any device) or a CuPy array (a learner's keys or new
    priorities, computed on its GPU) is copied explicitly to a NumPy array;
    anything else is returned as it is.

    Parameters
    ----------
    x : object
        A torch tensor, a CuPy array, or anything else.

    Returns
    -------
    object
        A NumPy array for a tensor or CuPy array, else ``x`` itself.
    """
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, on any device
        if getattr(x, "is_cpu", False) and not x.requires_grad:  # its own memory (a batch's keys): no detached copy
            return x.numpy()
        return x.detach().cpu().numpy()
    if is_device_array(x) and hasattr(x, "get"):  # CuPy
        return x.get()
    return x


def integer_keys(keys: ArrayLike) -> np.ndarray:
    """Item keys as int64, flattened: integers below ``2**63`` (:func:`check_keys` without its table's shards).

    A key that is not a 64-bit integer is refused, never cast: a float64 key
    of a shard above 0 has lost its low bits, and an int32 one its high bits
    (its shard), and either would name another item.

    Parameters
    ----------
    keys : array_like of int
        Host or device keys, any shape.

    Returns
    -------
    numpy.ndarray
        int64 ``[n]`` (a view of ``keys`` where it can be one).

    Raises
    ------
    InvalidDataError
        Keys that are not 64-bit integers (a narrower type: keys cast, whose high bits are lost).
    UnknownKeyError
        An unsigned key of ``2**63`` or more (no table issues one).
    """
    k = np.asarray(to_host(keys))
    if k.size == 0:  # no keys ([] reads as float64): nothing to apply
        k = k.astype(np.int64)
    if k.dtype.kind not in "iu":
        raise InvalidDataError(f"keys must be integers, got dtype {k.dtype}")
    if k.dtype.itemsize < 8:  # (a cast cut them: a shard above 0's key became another shard's, or a seq another)
        raise InvalidDataError(
            f"keys must be 64-bit integers as the table issues them (shard << 56 | seq), got dtype {k.dtype}: "
            "keys cast to a narrower type lose their high bits and name other items"
        )
    if k.dtype.kind == "u" and k.size and k.max() > np.iinfo(np.int64).max:  # (int64 would wrap it negative)
        raise UnknownKeyError(int(k.max()), "keys are below 2**63 (an int64 shard << 56 | seq)")
    return k.astype(np.int64, copy=False).reshape(-1)


def check_keys(keys: ArrayLike, num_shards: int) -> np.ndarray:
    """Validate item keys: integers whose encoded shard exists.

    Parameters
    ----------
    keys : array_like of int
        Host or device keys, any shape.
    num_shards : int
        Shards of the table.

    Returns
    -------
    numpy.ndarray
        int64 ``[n]``, the keys flattened.

    Raises
    ------
    InvalidDataError
        Keys that are not 64-bit integers.
    UnknownKeyError
        A key naming a shard outside ``[0, num_shards)``.
    """
    k = integer_keys(keys)
    bad = _first_bad_shard(k, num_shards)
    if bad >= 0:
        shard = int(decode(k[bad : bad + 1])[0][0])
        raise UnknownKeyError(int(k[bad]), f"it names shard {shard}; this table has {num_shards}")
    return k


@njit(nogil=True, cache=True)
def _first_bad_shard(keys, num_shards):
    """Index of the first key whose shard (its high bits, :mod:`gear_flow.keys`) is not below
    ``num_shards`` or is negative, or -1: one pass, where NumPy makes four arrays."""
    for i in range(keys.shape[0]):
        s = shard_of(keys[i])
        if s < 0 or s >= num_shards:
            return i
    return -1


@njit(nogil=True, cache=True)
def _first_bad_priority(p):
    """Index of the first priority that is NaN, infinite or negative, or -1."""
    for i in range(p.shape[0]):
        if not (p[i] >= 0.0 and p[i] < np.inf):
            return i
    return -1


def sample_columns(spec: TableSpec, columns: str | Sequence[str] | None) -> tuple[str, ...]:
    """The columns a sample asks for: all when None, one name, or a sequence; each must exist.

    Parameters
    ----------
    spec : TableSpec
        The table's spec.
    columns : str, sequence of str or None
        One column, several, or None for all.

    Returns
    -------
    tuple of str
        The columns, in the order given (the spec's order for None).

    Raises
    ------
    SpecError
        A name that is not a column of the spec, or not names at all.
    """
    if columns is None:
        return spec.names
    try:
        columns = (columns,) if isinstance(columns, str) else tuple(columns)
    except TypeError:
        raise SpecError(f"columns ({columns!r}) must be a column name, a sequence of them or None") from None
    for c in columns:
        if not isinstance(c, str):
            raise SpecError(f"columns ({columns!r}) must be a column name, a sequence of them or None")
        spec.column(c)
    return columns


def check_sample_args(batch_size: int, length: int, boundary: str | None, capacity: int | None = None) -> None:
    """Validate the scalar arguments of a sample.

    Parameters
    ----------
    batch_size : int
        Must be a positive integer (not a bool).
    length : int
        Must be a positive integer (not a bool), at most ``capacity``.
    boundary : str or None
        Must be one of ``strict``, ``pad_tail``, ``pad_head``.
    capacity : int, optional
        Steps a shard holds: no window is longer (a padded one of more steps
        would be padding beyond it, and its batch's buffers could not be
        allocated).

    Raises
    ------
    SpecError
        The first bad argument, named with what is allowed.
    """
    for name, v in (("batch_size", batch_size), ("length", length)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise SpecError(f"{name} ({v!r}) must be a positive integer")
    if boundary not in BOUNDARIES:
        raise SpecError(f"boundary {boundary!r} must be one of {BOUNDARIES}")
    if capacity is not None and length > capacity:
        raise SpecError(f"length ({length}) is longer than a shard holds ({capacity} steps): no window is that long")


def seeded_rng(seed: object, key: str | None = None) -> np.random.Generator:
    """A table's generator from ``seed``, or (``key``, when ``seed`` is None) the configuration's seed.

    Parameters
    ----------
    seed : object
        The caller's ``seed``: None, a non-negative int, or anything else
        :func:`numpy.random.default_rng` takes.
    key : str, optional
        The configuration key read when ``seed`` is None (``"table.seed"``);
        None: fresh entropy then.

    Returns
    -------
    numpy.random.Generator
        The generator.

    Raises
    ------
    SpecError
        A seed NumPy refuses (a string, a fraction, a negative number), naming
        the argument or the configuration key it came from.
    """
    from .. import config

    value = seed if key is None else config.get(key, seed)
    try:
        return np.random.default_rng(value)
    except (TypeError, ValueError) as e:
        where = "seed" if seed is not None or key is None else f"gear-flow.{key} (configuration)"
        raise SpecError(f"{where} = {value!r} must be an integer >= 0 or None ({e})") from None


def check_rng(rng: object) -> None:
    """A call's generator: None (the table's) or a :class:`numpy.random.Generator`.

    Parameters
    ----------
    rng : object
        The value given.

    Raises
    ------
    SpecError
        Anything else.
    """
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise SpecError(f"rng ({rng!r}) must be a numpy.random.Generator or None")
