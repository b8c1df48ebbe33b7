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

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import ProtocolError
from ..spec import BOUNDARIES
from .checkers import (
    MAX_COUNT,
    Checker,
    _Bad,
    anything,
    boolean,
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
#: ``epoch``, and the ``move_*`` operations and the coordinator's ``move``/``rebalance`` exist)
VERSION = 10

SHARD = integer(0, 126)
SEQS = int_array(0, (1 << 56) - 1)
NAME = text()
TXN = text(64)
LENGTH = integer(1, 1 << 30)
BOUNDARY = choice(*BOUNDARIES)
SEED = integer(0, (1 << 63) - 1)
COLUMNS = sequence(text(256), 4096)
TIMEOUT = optional(number(0.0, 1e7))
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
    "lane": {"name": NAME},
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
        "horizon": optional(integer(0, 1 << 62)),
        "seqs": optional(mapping(SHARD, SEQS, 127)),
    },
    "sequences": {
        "name": NAME,
        "n": integer(1, 1 << 31),
        "length": LENGTH,
        "boundary": BOUNDARY,
        "seed": SEED,
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
        "seqs": optional(mapping(SHARD, SEQS, 127)),
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
    # a move's steps (gear_flow.distributed.host_moves), sent by the coordinator (move_out: by the destination)
    "move_out": {"name": NAME, "shards": sequence(SHARD, 127), "move": TXN},
    "move_in": {
        "name": NAME,
        "config": mapping(text(), anything),
        "move": TXN,
        "source": text(),
        "shards": sequence(SHARD, 127),
    },
    "move_commit": {"name": NAME, "move": TXN, "epoch": EPOCH},
    "move_release": {"name": NAME, "shards": sequence(SHARD, 127), "move": TXN, "epoch": EPOCH},
    "move_abort": {"name": NAME, "move": TXN},
    "move_thaw": {"name": NAME, "move": TXN},
}
#: every other operation carries the placement version its request was planned at (``epoch``; optional: a
#: worker's own and the coordinator's requests carry none): a worker whose shards changed since refuses it
for _op, _schema in WORKER.items():
    _schema.setdefault("epoch", optional(EPOCH))
del _op, _schema

PER_SHARD = optional(mapping(SHARD, integer(0, MAX_COUNT), 127))

#: coordinator operation -> {field: checker} (``name`` is checked for every operation but ``list`` and ``lane``)
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
    "commit_insert": {
        "txn": TXN,
        "items": PER_SHARD,
        "evicted": PER_SHARD,
        "unsettled": optional(sequence(text(), 127)),
        "unreached": optional(sequence(text(), 127)),
    },
    "abort_insert": {"txn": TXN, "unreached": optional(sequence(text(), 127))},
    "admit_sample": {
        "n": integer(1, 1 << 31),  # a batch: larger can never be served
        "timeout": TIMEOUT,
        "done": optional(integer(0, MAX_COUNT)),
        "lease": optional(integer(0, 1 << 20)),
        "exclusive": optional(boolean),
        "owner": optional(text()),
        "after": optional(integer(0, 1 << 62)),
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
    "move": {"shards": sequence(SHARD, 127), "worker": optional(text())},
    "rebalance": {},
    "close": {},
    "drop": {},
    "lane": {},
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
