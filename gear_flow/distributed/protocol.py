"""The wire protocol: one schema per operation, checked where a message enters a worker or the coordinator.

A worker's ``gear_flow`` handler and the scheduler's ``gear_flow_coord`` handler
receive whatever a client sends, including a buggy or version-skewed one.  Every
message carries :data:`VERSION`; a message of another version is refused with
both versions named.  Its fields are then checked against the operation's
schema (declared with the operation in :mod:`.operations`, from the field
checkers built here: types, ranges, shapes, dtypes, known names) before anything runs;
what needs the table's state (known shards, the spec's row bytes, buffer
extents, key ranges) is checked by the host or the gate before any state
changes.  A bad message gets a :class:`~gear_flow.errors.ProtocolError` naming
the operation, the field and what is allowed, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import ProtocolError
from ..spec import BOUNDARIES
from .checkers import (
    MAX_COUNT,
    Checker,
    _Bad,
    anything,
    choice,
    float_array,
    int_array,
    integer,
    mapping,
    number,
    optional,
    record,
    sequence,
    text,
)

#: bumped whenever a message's meaning changes; both sides must agree (5: a take carries its sample's horizon;
#: 6: a remover's candidates carry their seqs and a removal by slots spares slots written over since;
#: 7: a weighted table with max_times_sampled draws item by item: ``sequences``, then a take checking seqs;
#: 8: a sample too large for the items left waits for arrivals, ``after``; 9: an insert's abort or commit
#: names the workers whose parts its abort did not reach, ``unreached``, and the coordinator aborts them;
#: 10: shards move between workers: every worker request carries the placement version it was planned at,
#: ``epoch``, and the ``move_*`` operations and the coordinator's ``move``/``rebalance`` exist; 11: a move's
#: pull and seal carry the seal's ``lease``, timed from the coordinator's move timeout; 12: a shard's
#: ``sequences`` answer its draws by weight and then its uniform draws over the items of weight 0)
VERSION = 12

SHARD = integer(0, 126)
SEQS = int_array(0, (1 << 56) - 1)
NAME = text()
TXN = text(64)
LENGTH = integer(1, 1 << 30)
BOUNDARY = choice(*BOUNDARIES)
SEED = integer(0, (1 << 63) - 1)
COLUMNS = sequence(text(256), 4096)
TIMEOUT = optional(number(0.0, 1e7))
#: seconds a move's source stays sealed without hearing from the move again
LEASE = number(1.0, 1e7)
#: a placement version (the coordinator's ``version`` of a table)
EPOCH = integer(0, 1 << 62)
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

PER_SHARD = optional(mapping(SHARD, integer(0, MAX_COUNT), 127))

_WORKER: dict[str, Mapping[str, Checker]] = {}
_COORDINATOR: dict[str, Mapping[str, Checker]] = {}
#: worker operation -> {field: checker}; a field absent from a message is passed as None to its checker.  The
#: schemas of :data:`gear_flow.distributed.operations.WORKER_OPS`: that module builds them from this module's
#: checkers, so this one cannot import it; it declares them (:func:`declare`) when it loads, which the package
#: does before anything reads them.  Read-only: only :func:`declare` adds an operation
WORKER: Mapping[str, Mapping[str, Checker]] = MappingProxyType(_WORKER)
#: coordinator operation -> {field: checker} (``name`` is checked for every operation that names a table);
#: those of :data:`gear_flow.distributed.operations.COORDINATOR_OPS`, declared as :data:`WORKER`'s are
COORDINATOR: Mapping[str, Mapping[str, Checker]] = MappingProxyType(_COORDINATOR)


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


def declare(side: str, schemas: Mapping[str, Mapping[str, Checker]]) -> None:
    """Declare operations' schemas: :data:`WORKER`'s or :data:`COORDINATOR`'s, each operation once.

    Parameters
    ----------
    side : str
        ``"worker"`` or ``"coordinator"``.
    schemas : mapping
        ``{operation: {field: checker}}``, fields in the order they are
        checked.

    Raises
    ------
    ValueError
        ``side`` is neither, or an operation was declared before.
    """
    table = {"worker": _WORKER, "coordinator": _COORDINATOR}.get(side)
    if table is None:
        raise ValueError(f"side must be 'worker' or 'coordinator', got {side!r}")
    again = sorted(set(schemas) & set(table))
    if again:
        raise ValueError(f"{side} operations {again} are declared already")
    table.update({op: MappingProxyType(dict(fields)) for op, fields in schemas.items()})


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


def check(schemas: Mapping[str, Mapping[str, Checker]], op: Any, fields: Mapping, where: str) -> None:
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
