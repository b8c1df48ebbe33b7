"""The wire protocol: one schema per operation, checked where a message enters a worker or the coordinator.

A worker's ``gear_flow`` handler and the scheduler's ``gear_flow_coord`` handler
receive whatever a client sends, including a buggy or version-skewed one.  Every
message carries :data:`VERSION`; a message of another version is refused with
both versions named.  Its fields are then checked against the operation's
schema here (types, ranges, shapes, dtypes, known names) before anything runs;
what needs the table's state (known shards, the spec's row bytes, buffer
extents, key ranges) is checked by the host or the gate before any state
changes.  A bad message gets a :class:`~gear_flow.errors.ProtocolError` naming
the operation, the field and what is allowed, and changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ProtocolError
from ..spec import BOUNDARIES

#: bumped whenever a message's meaning changes; both sides must agree
VERSION = 2

#: largest count a message may carry (items, batch sizes, seeds stay below 2**63)
MAX_COUNT = 1 << 40

#: a field checker: returns nothing, or raises ``_Bad`` saying what is allowed
Checker = Callable[[Any], None]


class _Bad(Exception):
    """Internal: ``what`` is allowed (the caller adds operation and field)."""


# -- field checkers: each returns nothing or raises _Bad(allowed) ----------------------------------------
def integer(lo: int = 0, hi: int = MAX_COUNT) -> Checker:
    """A checker for an integer (not a bool) in ``[lo, hi]``.

    Parameters
    ----------
    lo, hi : int
        Inclusive bounds (default ``[0, MAX_COUNT]``).

    Returns
    -------
    Checker
        Accepts Python and NumPy integers.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is an integer in ``[lo, hi]``.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
            raise _Bad(f"an integer in [{lo}, {hi}]")

    return check


def number(lo: float = 0.0, hi: float = math.inf, closed_hi: bool = True) -> Checker:
    """A checker for a finite real number (not a bool) in ``[lo, hi]`` (``[lo, hi)`` unless ``closed_hi``).

    Parameters
    ----------
    lo : float, default 0.0
        Inclusive lower bound.
    hi : float, default inf
        Upper bound.
    closed_hi : bool, default True
        Whether ``hi`` itself is allowed.

    Returns
    -------
    Checker
        Accepts Python and NumPy integers and floats; NaN and infinities
        are refused.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is a finite number in range.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise _Bad(f"a number in [{lo}, {hi}]")
        f = float(v)
        if not (math.isfinite(f) and lo <= f and (f <= hi if closed_hi else f < hi)):
            raise _Bad(f"a finite number in [{lo}, {hi}{']' if closed_hi else ')'}")

    return check


def text(max_len: int = 512) -> Checker:
    """A checker for a non-empty string of at most ``max_len`` characters.

    Parameters
    ----------
    max_len : int, default 512
        Longest allowed length.

    Returns
    -------
    Checker
        The checker.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is a non-empty ``str`` of at most ``max_len`` characters.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, str) or not 0 < len(v) <= max_len:
            raise _Bad(f"a non-empty string of at most {max_len} characters")

    return check


def boolean(v: Any) -> None:
    """Check that ``v`` is ``True`` or ``False`` (Python or NumPy bool).

    Parameters
    ----------
    v : object
        A field's value.

    Raises
    ------
    _Bad
        Anything else (0 and 1 included).
    """
    if not isinstance(v, (bool, np.bool_)):
        raise _Bad("True or False")


def choice(*values: str) -> Checker:
    """A checker for one of the strings ``values``.

    Parameters
    ----------
    *values : str
        The allowed strings.

    Returns
    -------
    Checker
        The checker.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is one of ``values``.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, str) or v not in values:
            raise _Bad(f"one of {list(values)}")

    return check


def optional(inner: Checker) -> Checker:
    """A checker that lets None (or an absent field) through and checks anything else with ``inner``.

    Parameters
    ----------
    inner : Checker
        Checks values that are not None.

    Returns
    -------
    Checker
        The checker.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is None or passes ``inner``.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if v is not None:
            inner(v)

    return check


def int_array(lo: int = -(1 << 62), hi: int = 1 << 62, max_len: int = MAX_COUNT) -> Checker:
    """A checker for a 1-d array (or list, tuple) of integers in ``[lo, hi]``.

    Parameters
    ----------
    lo, hi : int
        Inclusive bounds of every element (default ``[-2**62, 2**62]``).
    max_len : int, default MAX_COUNT
        Most elements allowed.

    Returns
    -------
    Checker
        Accepts any signed or unsigned integer dtype; an empty array passes.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is a 1-d integer array within the bounds.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        a = v if isinstance(v, np.ndarray) else None
        if a is None:
            if not isinstance(v, (list, tuple)):
                raise _Bad("an array of integers")
            try:
                a = np.asarray(v)
            except (TypeError, ValueError):
                raise _Bad("an array of integers") from None
        if a.ndim != 1 or len(a) > max_len or (len(a) and a.dtype.kind not in "iu"):
            raise _Bad("a 1-d array of integers")
        if len(a) and (int(a.min()) < lo or int(a.max()) > hi):
            raise _Bad(f"integers in [{lo}, {hi}]")

    return check


def float_array(v: Any) -> None:
    """Check that ``v`` is a 1-d array (or list, tuple) of finite numbers >= 0 (priorities).

    Parameters
    ----------
    v : object
        A field's value.

    Raises
    ------
    _Bad
        Not 1-d, not numeric, or an element that is negative, NaN or
        infinite.
    """
    a = np.asarray(v) if isinstance(v, (list, tuple, np.ndarray)) else None
    if a is None or a.ndim != 1 or (len(a) and a.dtype.kind not in "iuf"):
        raise _Bad("a 1-d array of numbers")
    if len(a) and not np.all(np.isfinite(a.astype(np.float64)) & (a >= 0)):
        raise _Bad("finite numbers >= 0")


def mapping(key: Checker, value: Checker, max_len: int = 4096) -> Checker:
    """A checker for a mapping of at most ``max_len`` entries whose keys pass ``key`` and values ``value``.

    Parameters
    ----------
    key : Checker
        Checks each key.
    value : Checker
        Checks each value.
    max_len : int, default 4096
        Most entries allowed.

    Returns
    -------
    Checker
        Its message names the first bad key or value.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is such a mapping.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, Mapping) or len(v) > max_len:
            raise _Bad("a mapping")
        for k, x in v.items():
            try:
                key(k)
            except _Bad as e:
                raise _Bad(f"a mapping whose keys are {e}") from None
            try:
                value(x)
            except _Bad as e:
                raise _Bad(f"a mapping whose values are {e} (key {k!r})") from None

    return check


def sequence(item: Checker, max_len: int = MAX_COUNT) -> Checker:
    """A checker for a list or tuple of at most ``max_len`` items, each passing ``item``.

    Parameters
    ----------
    item : Checker
        Checks each item.
    max_len : int, default MAX_COUNT
        Most items allowed.

    Returns
    -------
    Checker
        Its message names the first bad item's index.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is such a list.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, (list, tuple)) or len(v) > max_len:
            raise _Bad("a list")
        for i, x in enumerate(v):
            try:
                item(x)
            except _Bad as e:
                raise _Bad(f"a list of {e} (item {i})") from None

    return check


def anything(v: Any) -> None:
    """Accept any value (checked later by the host or the gate, which know the table's state).

    Parameters
    ----------
    v : object
        A field's value.
    """
    return None


def record(**fields: Checker) -> Checker:
    """A checker for a mapping with exactly these keys (``optional`` ones may be absent).

    Parameters
    ----------
    **fields : Checker
        A checker per allowed key; an absent key is checked as None.

    Returns
    -------
    Checker
        Refuses unknown keys.
    """

    def check(v: Any) -> None:
        """Raise ``_Bad`` unless ``v`` is a mapping whose keys are among ``fields`` and whose values pass them.

        Parameters
        ----------
        v : object
            A field's value (None when the message lacks the field).
        """
        if not isinstance(v, Mapping):
            raise _Bad(f"a mapping with keys {sorted(fields)}")
        unknown = sorted(set(v) - set(fields))
        if unknown:
            raise _Bad(f"a mapping with keys {sorted(fields)} (unknown: {unknown})")
        for k, f in fields.items():
            try:
                f(v.get(k))
            except _Bad as e:
                raise _Bad(f"a mapping whose {k!r} is {e}") from None

    return check


SHARD = integer(0, 126)
SEQS = int_array(0, (1 << 56) - 1)
NAME = text()
TXN = text(64)
LENGTH = integer(1, 1 << 30)
BOUNDARY = choice(*BOUNDARIES)
SEED = integer(0, (1 << 63) - 1)
COLUMNS = sequence(text(256), 4096)
TIMEOUT = optional(number(0.0, 1e7))
PART = record(
    shard=SHARD,
    chunks=sequence(mapping(text(256), anything), 1 << 24),
    lengths=int_array(1, 1 << 40),
    episode_ids=int_array(0),
    stamps=int_array(0),
    priorities=optional(float_array),
    staged=optional(record(segment=text(255))),  # chunks are places in the client's staging segment
)
BUFFERS = mapping(text(256), anything)

#: the plans a caller keeps masses for (an update's reply carries the updated shards' masses for each)
MASS_PLANS = optional(sequence(record(length=LENGTH, boundary=BOUNDARY), 16))
#: priority updates riding on a sample request, applied before the draw (the ``update`` operation's fields)
UPDATES = optional(
    record(seqs_by_shard=mapping(SHARD, SEQS, 127), prios_by_shard=mapping(SHARD, float_array, 127), masses=MASS_PLANS)
)

#: worker operation -> {field: checker}; a field absent from a message is passed as None to its checker

WORKER = {
    "create": {
        "name": NAME,
        "config": mapping(text(), anything),
        "shard_ids": sequence(SHARD, 127),
        "tier": optional(text()),
    },
    "drop": {"name": NAME},
    "drop_shard": {"name": NAME, "shard": SHARD},
    "shared_layout": {"name": NAME},
    "stage": {"name": NAME, "txn": TXN, "parts": sequence(PART, 1 << 16)},
    "apply": {"name": NAME, "txn": TXN},
    "write": {"name": NAME, "txn": TXN, "parts": sequence(PART, 1 << 16)},
    "abort": {"name": NAME, "txn": TXN},
    "status": {"name": NAME, "txn": TXN},
    "summaries": {
        "name": NAME,
        "kinds": sequence(choice("sampler", "unseen", "remover", "size", "valid"), 5),
        "length": optional(LENGTH),
        "boundary": optional(BOUNDARY),
    },
    "new_epoch": {"name": NAME},
    "candidates": {
        "name": NAME,
        "n": integer(0, 1 << 31),
        "role": optional(choice("sampler", "remover")),
        "length": optional(LENGTH),
        "boundary": optional(BOUNDARY),
        "horizon": optional(integer(0, 1 << 62)),
    },
    "sample_part": {
        "name": NAME,
        "length": LENGTH,
        "boundary": BOUNDARY,
        "columns": COLUMNS,
        "seed": SEED,
        "counts": optional(mapping(SHARD, integer(1, 1 << 31), 127)),
        "scale": optional(mapping(SHARD, number(0.0, 1.0), 127)),
        "slots": optional(mapping(SHARD, int_array(0, 1 << 40, 1 << 31), 127)),
        "txn": optional(TXN),
        "record": optional(boolean),
        "out": optional(BUFFERS),
        "offsets": optional(mapping(SHARD, integer(0, 1 << 31), 127)),
        "geometry": optional(boolean),
        "updates": UPDATES,
        "by_count": optional(boolean),
    },
    "finish_sample": {"name": NAME, "txn": TXN, "commit": boolean},
    "uncount": {"name": NAME, "counts": mapping(SHARD, integer(0, 1 << 40), 127)},
    "sample_all": {
        "name": NAME,
        "n": integer(1, 1 << 31),
        "length": LENGTH,
        "boundary": BOUNDARY,
        "columns": COLUMNS,
        "seed": SEED,
        "horizon": optional(integer(0, 1 << 62)),
        "out": anything,
        "updates": UPDATES,
    },
    "check_keys": {"name": NAME, "seqs_by_shard": mapping(SHARD, SEQS, 127)},
    "update": {
        "name": NAME,
        "seqs_by_shard": mapping(SHARD, SEQS, 127),
        "prios_by_shard": mapping(SHARD, float_array, 127),
        "stamps_by_shard": optional(mapping(SHARD, int_array(0), 127)),
        "masses": MASS_PLANS,
    },
    "delete": {"name": NAME, "seqs_by_shard": mapping(SHARD, SEQS, 127)},
    "remove": {
        "name": NAME,
        "counts": optional(mapping(SHARD, integer(0, 1 << 40), 127)),
        "slots": optional(mapping(SHARD, int_array(0, 1 << 40), 127)),
        "seed": optional(SEED),
    },
    "info": {"name": NAME},
    "nbytes": {"name": NAME},
    "checkpoint": {"name": NAME, "directory": text(4096)},
    "restore": {
        "name": NAME,
        "config": mapping(text(), anything),
        "directory": text(4096),
        "files": mapping(SHARD, mapping(text(), anything), 127),
        "tier": optional(text()),
    },
}

PER_SHARD = optional(mapping(SHARD, integer(0, MAX_COUNT), 127))

#: coordinator operation -> {field: checker} (``name`` is checked for every operation but ``list``)
COORDINATOR = {
    "register": {"config": mapping(text(), anything), "placement": mapping(anything, text(), 127)},
    "lookup": {},
    "list": {},
    "admit_insert": {
        "n": integer(0, MAX_COUNT),
        "episodes": integer(0, MAX_COUNT),
        "per_shard": PER_SHARD,
        "timeout": TIMEOUT,
        "owner": optional(text()),
    },
    "commit_insert": {"txn": TXN, "items": PER_SHARD, "evicted": PER_SHARD},
    "abort_insert": {"txn": TXN},
    "admit_sample": {
        "n": integer(1, 1 << 31),  # a batch: larger can never be served
        "timeout": TIMEOUT,
        "done": optional(integer(0, MAX_COUNT)),
        "lease": optional(integer(0, 1 << 20)),
        "exclusive": optional(boolean),
        "owner": optional(text()),
    },
    "admit_hold": {"timeout": TIMEOUT, "owner": optional(text())},
    "sample_finished": {"txn": optional(TXN), "rollback": optional(integer(0, MAX_COUNT)), "expired": PER_SHARD},
    "count_samples": {"n": integer(0, MAX_COUNT)},
    "stamps": {"n": integer(1, MAX_COUNT)},
    "removed": {"k": integer(0, MAX_COUNT), "per_shard": PER_SHARD},
    "mark_lost": {"shard": SHARD, "detail": optional(text(4096))},
    "worker_alive": {"address": text()},
    "workers": {},
    "restore_state": {"state": mapping(text(), anything)},
    "shard_restored": {
        "shard": SHARD,
        "worker": text(),
        "size": integer(0, MAX_COUNT),
        "inserted": integer(0, MAX_COUNT),
    },
    "close": {},
    "drop": {},
}


#: the counters of a restored table (``restore_state``)
RESTORED_STATE = {
    "state": {
        "size": integer(0, MAX_COUNT),
        "shard_size": mapping(anything, integer(0, MAX_COUNT), 127),
        "shard_inserted": mapping(anything, integer(0, MAX_COUNT), 127),
        "next_episode_id": integer(0, MAX_COUNT),
        "next_stamp": integer(0, MAX_COUNT),
    }
}


def check_version(v: Any, where: str) -> None:
    """Refuse a message of another protocol version.

    Parameters
    ----------
    v : object
        The version the message carries (None when it carries none).
    where : str
        Who checks, for the message (``"worker tcp://..."``).

    Raises
    ------
    ProtocolError
        ``v`` is not :data:`VERSION`; the message names both versions.
    """
    if v != VERSION:
        raise ProtocolError(
            f"{where} speaks gear_flow protocol {VERSION}, the request is of version {v!r}; "
            "run the same gear_flow version on clients, scheduler and workers"
        )


def check(schemas: dict[str, dict[str, Checker]], op: Any, fields: Mapping, where: str) -> None:
    """Raise :class:`ProtocolError` unless ``fields`` fit the schema of operation ``op``.

    Parameters
    ----------
    schemas : dict
        ``{operation: {field: checker}}``: :data:`WORKER`,
        :data:`COORDINATOR` or :data:`RESTORED_STATE`.
    op : str
        The operation named by the message.
    fields : mapping
        The message's arguments; a field absent from it is checked as None.
    where : str
        Who checks, for the message (``"coordinator"``, ``"worker ..."``).

    Raises
    ------
    ProtocolError
        An unknown operation, arguments that are not a mapping, an unknown
        field, or a field its checker refuses; the message names the
        operation, the field, what is allowed and what was given.

    Examples
    --------
    >>> check(WORKER, "drop", {"name": "replay"}, "worker")
    >>> check(WORKER, "drop", {"name": ""}, "worker")
    Traceback (most recent call last):
    ...
    gear_flow.errors.ProtocolError: worker 'drop': field 'name' must be a non-empty string of at most 512 characters, got ''
    """
    if not isinstance(op, str) or op not in schemas:
        raise ProtocolError(f"{where}: unknown operation {op!r}; known: {sorted(schemas)}")
    if not isinstance(fields, Mapping):
        raise ProtocolError(f"{where} {op!r}: the arguments must be a mapping, got {type(fields).__name__}")
    schema = schemas[op]
    unknown = sorted(set(fields) - set(schema))
    if unknown:
        raise ProtocolError(f"{where} {op!r}: unknown field(s) {unknown}; allowed: {sorted(schema)}")
    for field, checker in schema.items():
        try:
            checker(fields.get(field))
        except _Bad as e:
            got = fields.get(field)
            shown = f"{type(got).__name__}" if isinstance(got, (np.ndarray, Mapping, list, tuple)) else repr(got)[:80]
            raise ProtocolError(f"{where} {op!r}: field {field!r} must be {e}, got {shown}") from None
