"""Every message of the distributed table, declared once: a worker's and the coordinator's operations.

Each operation is one record: its fields (the checkers :mod:`.protocol`
builds), the handler that runs it, and what may be claimed of it (whether it
may take a lane, whether a worker acts on it once however often it comes,
whether it is small enough for a worker's event loop, how a move's gate
treats it, whether it names a table).  The tables the rest of the package reads are derived from these
records and nothing else: :data:`protocol.WORKER <.protocol.WORKER>` and
:data:`protocol.COORDINATOR <.protocol.COORDINATOR>` (each operation's
schema, filled in from here), :data:`plugin.OPS <.plugin.OPS>` (the
handlers), :data:`lane.LANE_OPS <.lane.LANE_OPS>` and
:data:`lane.RESENDABLE_OPS <.lane.RESENDABLE_OPS>`, the plugin's quick
predicates, the move gate's :data:`THROUGH`, :data:`UNGATED` and
:data:`EPOCH_ARGUMENT` (here), and the coordinator's dispatch, :data:`NO_TABLE
<.coordinator.NO_TABLE>` and :data:`COORD_LANE_OPS
<.coordinator.COORD_LANE_OPS>`.

Handlers are named, not imported (``"ShardHost.sample_part"``,
``"host_moves.move_out"``, a coordinator method's name): the host and the
coordinator import this module, so it imports neither; :mod:`.plugin` and the
coordinator resolve the names when they load, and ``tests/test_operations.py``
checks that every one exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from . import protocol
from .checkers import (
    MAX_COUNT,
    Checker,
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
from .protocol import (
    BOUNDARY,
    BUFFERS,
    COLUMNS,
    EPOCH,
    LEASE,
    LENGTH,
    MASS_PLANS,
    NAME,
    PART,
    PER_SHARD,
    SEED,
    SEQS,
    SHARD,
    TIMEOUT,
    TXN,
    UPDATES,
)

#: what a caller may withdraw an admission by (``withdraw``): chosen by the caller, one per request
TICKET = optional(text(64))
#: who may run a worker operation: a :class:`~gear_flow.distributed.host.ShardHost` method, a move's step
#: (:mod:`gear_flow.distributed.host_moves`), or the plugin itself (what needs the worker, not only its host)
HANDLER_OWNERS = ("ShardHost", "host_moves", "GearFlowWorker")
#: a worker operation that runs on the event loop whatever its arguments (:attr:`WorkerOp.quick`)
ALWAYS = "always"
#: the placement version a worker request was planned at (optional: a worker's own and the coordinator's
#: requests carry none): a worker whose shards changed since refuses it
_ANY_EPOCH = optional(EPOCH)


@dataclass(frozen=True)
class WorkerOp:
    """One operation a worker's ``gear_flow`` handler serves.

    Parameters
    ----------
    name : str
        The operation, as a message names it.
    fields : mapping of str to checker
        Its fields, in the order they are checked; every operation also
        carries an optional ``epoch`` (:attr:`schema`) unless it names one.
    handler : str
        What runs it: ``"ShardHost.<method>"``, ``"host_moves.<function>"``
        or ``"GearFlowWorker.<method>"`` (resolved by :mod:`.plugin`).
    lane : bool, default False
        A handle may send it over a worker's lane (:mod:`.lane`): a control
        operation with a small reply, or an insert's step (its episodes are
        received straight into the arrays they become).
    resendable : bool, default False
        A worker acts on it once however often it comes, so a request whose
        lane reply was lost may go again over the comm; only a lane
        operation can be.
    quick : str, optional
        When it may run on the worker's event loop: :data:`ALWAYS`, or the
        name of the plugin's predicate that says whether these arguments are
        small enough; None: never (the plugin's threads).
    through : bool, default False
        It goes on with a transaction already begun (an insert's apply or
        abort, a txn's status, a sample's finish): a table's move gate lets
        it through while a move drains the table, since the move waits for
        that transaction's staged and pending parts to be gone, and never
        refuses it as stale, since it names a transaction, not a placement.
    ungated : bool, default False
        It is not the table's data path (the table's lifecycle, a move's own
        steps): no move gate holds it or refuses it as stale, so a move can
        run its steps on the table it seals.
    epoch_argument : bool, default False
        Its ``epoch`` field is its argument, the new placement version a
        move's step installs or releases at, not the version the request was
        planned at: the worker hands it to the handler instead of checking
        it.  Exactly the operations that name ``epoch`` in :attr:`fields`.
    after_close : bool, default False
        It still runs on a table closed without being dropped
        (``close(drop=False)``): a read of the table's state (its info, a
        checkpoint), making it durable, or the count of draws made before
        the close.  Every other gated operation that starts no later step of
        a transaction is refused with
        :class:`~gear_flow.errors.TableClosedError` there, as a closed
        LocalTable refuses its calls.

    Examples
    --------
    >>> WorkerOp("info", {"name": NAME}, "ShardHost.info", quick=ALWAYS).schema.keys()
    dict_keys(['name', 'epoch'])
    """

    name: str
    fields: Mapping[str, Checker]
    handler: str
    lane: bool = False
    resendable: bool = False
    quick: str | None = None
    through: bool = False
    ungated: bool = False
    epoch_argument: bool = False
    after_close: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))  # frozen through and through
        owner, _, attr = self.handler.partition(".")
        if owner not in HANDLER_OWNERS or not attr.isidentifier():
            raise ValueError(
                f"worker operation {self.name!r}: handler {self.handler!r} must be '<owner>.<name>' with the owner "
                f"one of {HANDLER_OWNERS}"
            )
        if self.resendable and not self.lane:
            raise ValueError(f"worker operation {self.name!r}: only a lane operation is sent again (lane=True)")
        if self.through and self.ungated:
            raise ValueError(f"worker operation {self.name!r}: an ungated operation passes no gate to go through")
        if self.after_close and (self.through or self.ungated):
            raise ValueError(
                f"worker operation {self.name!r}: a closed table lets a transaction's later steps and its "
                "lifecycle through anyway; after_close is for the other gated operations"
            )
        if self.epoch_argument != ("epoch" in self.fields):
            raise ValueError(
                f"worker operation {self.name!r}: an operation whose epoch is its argument names an 'epoch' field, "
                "and one that names it takes it as its argument (epoch_argument=True)"
            )

    @property
    def schema(self) -> dict[str, Checker]:
        """The fields a message of this operation is checked against: :attr:`fields`, then ``epoch``."""
        schema = dict(self.fields)
        schema.setdefault("epoch", _ANY_EPOCH)
        return schema

    @property
    def owner(self) -> str:
        """Who runs it: one of :data:`HANDLER_OWNERS`."""
        return self.handler.partition(".")[0]

    @property
    def attribute(self) -> str:
        """The method's or function's name on its :attr:`owner`."""
        return self.handler.partition(".")[2]


@dataclass(frozen=True)
class CoordinatorOp:
    """One operation the scheduler's ``gear_flow_coord`` handler serves.

    Parameters
    ----------
    name : str
        The operation, as a message names it.
    fields : mapping of str to checker
        Its fields besides ``name``, in the order they are checked.
    handler : str
        The :class:`~gear_flow.distributed.coordinator.GearFlowCoordinator`
        method that answers it (called with the table's name, then the
        fields).
    table : bool, default True
        It names a table (``name`` must be a table's name).
    lane : bool, default True
        A handle may send it over the coordinator's lane once it has found
        it.

    Examples
    --------
    >>> CoordinatorOp("list", {}, "_list", table=False).lane
    True
    """

    name: str
    fields: Mapping[str, Checker]
    handler: str
    table: bool = True
    lane: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))
        if not self.handler.isidentifier():
            raise ValueError(f"coordinator operation {self.name!r}: handler {self.handler!r} must be a method's name")


def _by_name(*ops: WorkerOp | CoordinatorOp) -> Mapping:
    out: dict = {}
    for op in ops:
        if op.name in out:
            raise ValueError(f"operation {op.name!r} is declared twice")
        out[op.name] = op
    return MappingProxyType(out)


#: worker operation -> its record
WORKER_OPS: Mapping[str, WorkerOp] = _by_name(
    WorkerOp(
        "create",
        {
            "name": NAME,
            "config": mapping(text(), anything),
            "shard_ids": sequence(SHARD, 127),
            "tier": optional(text()),
        },
        "ShardHost.create",
        ungated=True,
    ),
    WorkerOp("drop", {"name": NAME}, "ShardHost.drop", ungated=True),
    # close(drop=False): every handle's data path refused from now on, the data kept (a LocalTable's close)
    WorkerOp("close_table", {"name": NAME}, "ShardHost.close_table", ungated=True, quick=ALWAYS),
    WorkerOp(
        "drop_shard",
        {"name": NAME, "shard": SHARD, "epoch": EPOCH},
        "ShardHost.drop_shard",
        ungated=True,
        epoch_argument=True,
    ),
    WorkerOp("shared_layout", {"name": NAME}, "ShardHost.shared_layout", after_close=True),
    # where handles on other machines (or without shared memory) ask for the worker's TCP lane
    WorkerOp("lane", {"name": NAME}, "GearFlowWorker._lane", after_close=True),
    # an insert's steps are resent safely: the transaction memory (host_transactions) stages a txn's parts
    # once, answers a write or apply sent again with its first result, and refuses one after its abort
    WorkerOp(
        "stage",
        {"name": NAME, "txn": TXN, "parts": sequence(PART, 1 << 16)},
        "ShardHost.stage",
        lane=True,
        resendable=True,
        quick="few_bytes",
    ),
    WorkerOp(
        "apply",
        {"name": NAME, "txn": TXN},
        "ShardHost.apply",
        lane=True,
        resendable=True,
        quick="few_staged",
        through=True,
    ),
    WorkerOp(
        "write",
        {"name": NAME, "txn": TXN, "parts": sequence(PART, 1 << 16)},
        "ShardHost.write",
        lane=True,
        resendable=True,
        quick="few_bytes",
    ),
    WorkerOp(
        "abort",
        {"name": NAME, "txn": TXN},
        "ShardHost.abort",
        lane=True,
        resendable=True,
        quick=ALWAYS,
        through=True,
    ),
    WorkerOp("status", {"name": NAME, "txn": TXN}, "ShardHost.status", quick=ALWAYS, through=True),
    WorkerOp(
        "summaries",
        {
            "name": NAME,
            "kinds": sequence(choice("sampler", "unseen", "remover", "size", "valid", "goes"), 6),
            "length": optional(LENGTH),
            "boundary": optional(BOUNDARY),
        },
        "ShardHost.summaries",
        lane=True,
        resendable=True,  # a read
        quick=ALWAYS,
    ),
    # not resendable: a new epoch sent twice would start two
    WorkerOp("new_epoch", {"name": NAME, "txn": optional(TXN)}, "ShardHost.new_epoch", lane=True, quick=ALWAYS),
    WorkerOp(
        "candidates",
        {
            "name": NAME,
            "n": integer(0, 1 << 31),
            "role": optional(choice("sampler", "remover")),
            "length": optional(LENGTH),
            "boundary": optional(BOUNDARY),
            "horizon": optional(integer(0, 1 << 62)),
        },
        "ShardHost.candidates",
        lane=True,
        resendable=True,  # a read
        quick="few_draws",
    ),
    # not resendable: a draw whose reply was lost is not drawn again (the worker may have counted it)
    WorkerOp(
        "sample_part",
        {
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
        "ShardHost.sample_part",
        lane=True,
        quick="small_part",
    ),
    WorkerOp(
        "sequences",
        {
            "name": NAME,
            "n": integer(1, 1 << 31),
            "length": LENGTH,
            "boundary": BOUNDARY,
            "seed": SEED,
            "by_count": optional(boolean),
        },
        "ShardHost.sequences",
        lane=True,
        resendable=True,  # draws that record nothing: the take that follows (sample_part ``seqs``) counts them
        quick="few_draws",
    ),
    WorkerOp(
        "finish_sample",
        {"name": NAME, "txn": TXN, "commit": boolean},
        "ShardHost.finish_sample",
        lane=True,
        resendable=True,  # its first outcome is remembered and answered again
        quick=ALWAYS,
        through=True,
    ),
    # not resendable: an uncount sent twice would take the draws back twice
    WorkerOp(
        "uncount",
        {"name": NAME, "counts": mapping(SHARD, integer(0, 1 << 40), 127)},
        "ShardHost.uncount",
        lane=True,
        quick=ALWAYS,
        after_close=True,  # draws made before the close, taken back
    ),
    # not resendable: its draws are counted by the reader that asked (it would count them twice)
    WorkerOp(
        "draw_host",
        {
            "name": NAME,
            "length": LENGTH,
            "boundary": BOUNDARY,
            "columns": COLUMNS,
            "parts": mapping(
                text(),
                record(
                    layout=anything,
                    counts=mapping(SHARD, integer(1, 1 << 31), 127),
                    scale=mapping(SHARD, number(0.0, 1.0), 127),
                    seed=SEED,
                ),
                1024,
            ),
        },
        "ShardHost.draw_host",
        lane=True,
    ),
    # not resendable: a count sent twice would count the draws twice
    WorkerOp(
        "count_drawn",
        {"name": NAME, "counts": mapping(SHARD, integer(0, 1 << 40), 127)},
        "ShardHost.count_drawn",
        lane=True,
        quick=ALWAYS,
        after_close=True,  # draws made before the close
    ),
    WorkerOp(
        "sample_all",
        {
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
        "ShardHost.sample_all",
        quick="few_windows",
    ),
    WorkerOp(
        "check_keys",
        {"name": NAME, "seqs_by_shard": mapping(SHARD, SEQS, 127)},
        "ShardHost.check_keys",
        lane=True,
        resendable=True,  # a read
        quick="few_keys",
    ),
    WorkerOp(
        "update",
        {
            "name": NAME,
            "seqs_by_shard": mapping(SHARD, SEQS, 127),
            "prios_by_shard": mapping(SHARD, float_array, 127),
            "stamps_by_shard": optional(mapping(SHARD, int_array(0), 127)),
            "masses": MASS_PLANS,
        },
        "ShardHost.update",
        lane=True,
        resendable=True,  # priorities set to given values: setting them again changes nothing
        quick="few_keys",
    ),
    WorkerOp("delete", {"name": NAME, "seqs_by_shard": mapping(SHARD, SEQS, 127)}, "ShardHost.delete"),
    WorkerOp(
        "remove",
        {
            "name": NAME,
            "counts": optional(mapping(SHARD, integer(0, 1 << 40), 127)),
            "slots": optional(mapping(SHARD, int_array(0, 1 << 40), 127)),
            "seed": optional(SEED),
            "seqs": optional(mapping(SHARD, SEQS, 127)),
        },
        "ShardHost.remove",
        quick="few_removals",
    ),
    WorkerOp("info", {"name": NAME}, "ShardHost.info", quick=ALWAYS, after_close=True),
    WorkerOp("nbytes", {"name": NAME}, "ShardHost.nbytes", quick=ALWAYS, after_close=True),
    WorkerOp("checkpoint", {"name": NAME, "directory": text(4096)}, "ShardHost.checkpoint", after_close=True),
    WorkerOp(
        "restore",
        {
            "name": NAME,
            "config": mapping(text(), anything),
            "directory": text(4096),
            "files": mapping(SHARD, mapping(text(), anything), 127),
            "tier": optional(text()),
        },
        "ShardHost.restore",
        ungated=True,
    ),
    # a lost disk shard's files reopened in place by a worker that can see them (its lifecycle, as a restore)
    WorkerOp(
        "reopen",
        {"name": NAME, "config": mapping(text(), anything), "directory": text(4096), "shard": SHARD},
        "ShardHost.reopen",
        ungated=True,
    ),
    # a disk table's shards made durable (the data path's: a move holds it, as it holds a write)
    WorkerOp("flush_disk", {"name": NAME}, "ShardHost.flush_disk", after_close=True),
    # a move's steps (gear_flow.distributed.host_moves), sent by the coordinator (move_out: by the destination)
    WorkerOp(
        "move_out",
        # ``machine``: the destination's (host_moves: a disk shard moving on one machine is handed over in place);
        # ``lease``: seconds the source stays sealed unless a later step comes (the coordinator's move timeout)
        {"name": NAME, "shards": sequence(SHARD, 127), "move": TXN, "machine": optional(text()), "lease": LEASE},
        "host_moves.move_out",
        ungated=True,
    ),
    # the destination pulls the shards from the source itself: the plugin, which holds the worker's comm
    WorkerOp(
        "move_in",
        {
            "name": NAME,
            "config": mapping(text(), anything),
            "move": TXN,
            "source": text(),
            "shards": sequence(SHARD, 127),
            "lease": LEASE,
        },
        "GearFlowWorker._move_in",
        ungated=True,
    ),
    WorkerOp(
        "move_commit",
        {"name": NAME, "move": TXN, "epoch": EPOCH},
        "host_moves.move_commit",
        ungated=True,
        epoch_argument=True,
    ),
    WorkerOp(
        "move_release",
        {"name": NAME, "shards": sequence(SHARD, 127), "move": TXN, "epoch": EPOCH},
        "host_moves.move_release",
        ungated=True,
        epoch_argument=True,
    ),
    WorkerOp("move_abort", {"name": NAME, "move": TXN}, "host_moves.move_abort", ungated=True),
    WorkerOp("move_thaw", {"name": NAME, "move": TXN}, "host_moves.move_thaw", ungated=True),
)

#: operations on a transaction already begun, which a table's move gate lets through while a move drains the
#: table and never refuses as stale; each one's ``through`` claim, and why, on :class:`WorkerOp`
THROUGH: frozenset[str] = frozenset(op.name for op in WORKER_OPS.values() if op.through)
#: operations that are not the table's data path (lifecycle, a move's own steps): never held or refused by a
#: move gate; each one's ``ungated`` claim
UNGATED: frozenset[str] = frozenset(op.name for op in WORKER_OPS.values() if op.ungated)
#: gated operations a table closed without being dropped still runs (reads, durability, counts of earlier
#: draws); each one's ``after_close`` claim
AFTER_CLOSE: frozenset[str] = frozenset(op.name for op in WORKER_OPS.values() if op.after_close)
#: a move's steps, and a restore's drop of the copy it replaced, whose ``epoch`` is their argument (the new
#: placement version), not the request's; each one's ``epoch_argument`` claim
EPOCH_ARGUMENT: frozenset[str] = frozenset(op.name for op in WORKER_OPS.values() if op.epoch_argument)

#: coordinator operation -> its record (``name`` is checked for every operation that names a table)
COORDINATOR_OPS: Mapping[str, CoordinatorOp] = _by_name(
    CoordinatorOp(
        "register",
        {"config": mapping(text(), anything), "placement": mapping(anything, text(), 127)},
        "_register",
    ),
    CoordinatorOp("lookup", {}, "_lookup"),
    CoordinatorOp("list", {}, "_list", table=False),
    CoordinatorOp(
        "admit_insert",
        {
            "n": integer(0, MAX_COUNT),
            "episodes": integer(0, MAX_COUNT),
            "per_shard": PER_SHARD,
            "timeout": TIMEOUT,
            "owner": optional(text()),
            "grouped": optional(boolean),
            "ticket": TICKET,
        },
        "_admit_insert",
    ),
    CoordinatorOp(
        "commit_insert",
        {
            "txn": TXN,
            "items": PER_SHARD,
            "evicted": PER_SHARD,
            "unsettled": optional(sequence(text(), 127)),
            "unreached": optional(sequence(text(), 127)),
        },
        "_commit_insert",
    ),
    CoordinatorOp("abort_insert", {"txn": TXN, "unreached": optional(sequence(text(), 127))}, "_abort_insert"),
    CoordinatorOp(
        "admit_sample",
        {
            "n": integer(1, 1 << 31),  # a batch: larger can never be served
            "timeout": TIMEOUT,
            "done": optional(integer(0, MAX_COUNT)),
            "lease": optional(integer(0, 1 << 20)),
            "exclusive": optional(boolean),
            "owner": optional(text()),
            "after": optional(integer(0, 1 << 62)),
            "ticket": TICKET,
        },
        "_admit_sample",
    ),
    CoordinatorOp("admit_hold", {"timeout": TIMEOUT, "owner": optional(text()), "ticket": TICKET}, "_admit_hold"),
    # an admission its caller gave up before the answer reached it (the ticket it was sent with)
    CoordinatorOp("withdraw", {"ticket": text(64)}, "_withdraw"),
    CoordinatorOp(
        "sample_finished",
        {"txn": optional(TXN), "rollback": optional(integer(0, MAX_COUNT)), "expired": PER_SHARD},
        "_sample_finished",
    ),
    CoordinatorOp("count_samples", {"n": integer(0, MAX_COUNT)}, "_count_samples"),
    CoordinatorOp("stamps", {"n": integer(1, MAX_COUNT)}, "_stamps"),
    CoordinatorOp("removed", {"k": integer(0, MAX_COUNT), "per_shard": PER_SHARD}, "_removed"),
    CoordinatorOp("mark_lost", {"shard": SHARD, "detail": optional(text(4096))}, "_mark_lost"),
    CoordinatorOp("worker_alive", {"address": text()}, "_worker_alive"),
    CoordinatorOp("workers", {}, "_workers"),
    CoordinatorOp("restore_state", {"state": mapping(text(), anything)}, "_restore_state"),
    CoordinatorOp(
        "shard_restored",
        {"shard": SHARD, "worker": text(), "size": integer(0, MAX_COUNT), "inserted": integer(0, MAX_COUNT)},
        "_shard_restored",
    ),
    # a move and a rebalance take the comm: they run for as long as their shards take to copy between workers
    CoordinatorOp("move", {"shards": sequence(SHARD, 127), "worker": optional(text())}, "_move", lane=False),
    CoordinatorOp("rebalance", {}, "_rebalance", lane=False),
    CoordinatorOp("close", {"created": optional(text(64))}, "_close"),
    CoordinatorOp("drop", {"created": optional(text(64))}, "_drop"),
    # how a handle finds the coordinator's lane, so never sent over it
    CoordinatorOp("lane", {}, "_lane", table=False, lane=False),
)

protocol.declare("worker", {op.name: op.schema for op in WORKER_OPS.values()})
protocol.declare("coordinator", {op.name: dict(op.fields) for op in COORDINATOR_OPS.values()})
