"""Every message's description: the tables derived from the operation registry hold what they held when each
was written by hand (names, field names in order, handlers, lane and resend claims, which ops are quick, how a move's
gate treats each)."""

from __future__ import annotations

import inspect

import grimp  # (import-linter's graph of the package)
import pytest

from gear_flow.distributed import coordinator, host_moves, lane, operations, plugin, protocol
from gear_flow.distributed.coordinator import GearFlowCoordinator
from gear_flow.distributed.host import ShardHost
from gear_flow.distributed.operations import COORDINATOR_OPS, WORKER_OPS, CoordinatorOp, WorkerOp
from gear_flow.distributed.plugin import GearFlowWorker
from gear_flow.distributed.protocol import EPOCH

# -- today's tables, written out ---------------------------------------------------------------------------
#: worker operation -> its fields, in the order they are checked (``epoch`` last unless the op names it)
WORKER_FIELDS = {
    "create": ("name", "config", "shard_ids", "tier", "epoch"),
    "drop": ("name", "epoch"),
    "close_table": ("name", "epoch"),
    "drop_shard": ("name", "shard", "epoch"),
    "shared_layout": ("name", "epoch"),
    "lane": ("name", "epoch"),
    "stage": ("name", "txn", "parts", "epoch"),
    "apply": ("name", "txn", "epoch"),
    "write": ("name", "txn", "parts", "epoch"),
    "abort": ("name", "txn", "epoch"),
    "status": ("name", "txn", "epoch"),
    "summaries": ("name", "kinds", "length", "boundary", "epoch"),
    "new_epoch": ("name", "txn", "epoch"),
    "candidates": ("name", "n", "role", "length", "boundary", "horizon", "epoch"),
    "sample_part": (
        "name", "length", "boundary", "columns", "seed", "counts", "scale", "slots", "txn", "record", "out",
        "offsets", "geometry", "updates", "by_count", "horizon", "seqs", "epoch",
    ),
    "sequences": ("name", "n", "length", "boundary", "seed", "by_count", "epoch"),
    "finish_sample": ("name", "txn", "commit", "epoch"),
    "uncount": ("name", "counts", "epoch"),
    "draw_host": ("name", "length", "boundary", "columns", "parts", "epoch"),
    "count_drawn": ("name", "counts", "epoch"),
    "sample_all": ("name", "n", "length", "boundary", "columns", "seed", "horizon", "out", "updates", "epoch"),
    "check_keys": ("name", "seqs_by_shard", "epoch"),
    "update": ("name", "seqs_by_shard", "prios_by_shard", "stamps_by_shard", "masses", "epoch"),
    "delete": ("name", "seqs_by_shard", "epoch"),
    "remove": ("name", "counts", "slots", "seed", "seqs", "epoch"),
    "info": ("name", "epoch"),
    "nbytes": ("name", "epoch"),
    "checkpoint": ("name", "directory", "epoch"),
    "restore": ("name", "config", "directory", "files", "tier", "epoch"),
    "reopen": ("name", "config", "directory", "shard", "epoch"),
    "flush_disk": ("name", "epoch"),
    "move_out": ("name", "shards", "move", "machine", "lease", "epoch"),
    "move_in": ("name", "config", "move", "source", "shards", "lease", "epoch"),
    "move_commit": ("name", "move", "epoch"),
    "move_release": ("name", "shards", "move", "epoch"),
    "move_abort": ("name", "move", "epoch"),
    "move_thaw": ("name", "move", "epoch"),
}  # fmt: skip
COORDINATOR_FIELDS = {
    "register": ("config", "placement"),
    "lookup": (),
    "list": (),
    "admit_insert": ("n", "episodes", "per_shard", "timeout", "owner", "grouped", "ticket"),
    "commit_insert": ("txn", "items", "evicted", "unsettled", "unreached"),
    "abort_insert": ("txn", "unreached"),
    "admit_sample": ("n", "timeout", "done", "lease", "exclusive", "owner", "after", "ticket"),
    "admit_hold": ("timeout", "owner", "ticket"),
    "withdraw": ("ticket",),
    "sample_finished": ("txn", "rollback", "expired"),
    "count_samples": ("n",),
    "stamps": ("n",),
    "removed": ("k", "per_shard"),
    "mark_lost": ("shard", "detail"),
    "worker_alive": ("address",),
    "workers": (),
    "restore_state": ("state",),
    "shard_restored": ("shard", "worker", "size", "inserted"),
    "move": ("shards", "worker"),
    "rebalance": (),
    "close": ("created",),
    "drop": ("created",),
    "lane": (),
}
#: worker operation -> the ShardHost method or host_moves function plugin.OPS runs it with
HOST_METHODS = (
    "create", "drop", "close_table", "drop_shard", "shared_layout", "stage", "apply", "write", "abort", "status", "summaries",
    "new_epoch", "candidates", "sample_part", "sequences", "finish_sample", "uncount", "draw_host", "count_drawn",
    "sample_all",
    "check_keys",
    "update", "delete", "remove", "info", "checkpoint", "restore", "reopen", "flush_disk", "nbytes",
)  # fmt: skip
MOVE_STEPS = ("move_out", "move_thaw", "move_release", "move_commit", "move_abort")
LANE_OPS = {
    "abort", "apply", "candidates", "check_keys", "finish_sample", "new_epoch", "sample_part", "sequences", "stage",
    "summaries", "uncount", "draw_host", "count_drawn", "update", "write",
}  # fmt: skip
RESENDABLE_OPS = {
    "abort", "apply", "candidates", "check_keys", "finish_sample", "sequences", "stage", "summaries", "update", "write"
}  # fmt: skip
NO_TABLE = {"lane", "list"}
COORD_LANE_OPS = set(COORDINATOR_FIELDS) - {"lane", "move", "rebalance"}
#: operations on a transaction already begun: let through while a move drains the table, never refused as stale
THROUGH = {"apply", "abort", "status", "finish_sample"}
#: operations a table's move gate never holds or refuses (the table's lifecycle, a move's own steps)
UNGATED = {
    "create", "drop", "close_table", "restore", "reopen", "drop_shard", "move_out", "move_in", "move_commit", "move_release",
    "move_abort", "move_thaw",
}  # fmt: skip
#: the operations whose ``epoch`` is their argument (the new placement version), not the request's: a move's
#: steps, and a restore's drop of the copy it replaced
EPOCH_ARGUMENT = {"move_commit", "move_release", "drop_shard"}
#: the worker operations that run on the event loop whatever their size
ALWAYS_QUICK = {
    "summaries", "uncount", "count_drawn", "info", "status", "finish_sample", "new_epoch", "nbytes", "abort", "close_table"
}  # fmt: skip
#: gated operations a table closed without being dropped still runs: reads, durability, earlier draws' counts
AFTER_CLOSE = {"shared_layout", "lane", "info", "nbytes", "checkpoint", "flush_disk", "count_drawn", "uncount"}
#: those that do when small (and their table's locks are free)
QUICK_WHEN_SMALL = {
    "sample_all", "sequences", "sample_part", "update", "check_keys", "candidates", "remove", "write", "stage", "apply"
}  # fmt: skip
#: arguments too large for every operation whose quickness depends on its arguments
LARGE = {
    "n": 1 << 30,
    "length": 1 << 10,
    "out": {"x": b""},
    "slots": {0: range(plugin.QUICK_ITEMS + 1)},
    "seqs_by_shard": {0: range(plugin.QUICK_ITEMS + 1)},
    "parts": [{"staged": {"segment": "gf_x"}}],
    "name": "t",
    "txn": "t1",
}


def test_worker_schemas_name_the_same_fields_in_the_same_order():
    assert list(protocol.WORKER) == list(WORKER_FIELDS)
    assert {op: tuple(schema) for op, schema in protocol.WORKER.items()} == WORKER_FIELDS


def test_coordinator_schemas_name_the_same_fields_in_the_same_order():
    assert list(protocol.COORDINATOR) == list(COORDINATOR_FIELDS)
    assert {op: tuple(schema) for op, schema in protocol.COORDINATOR.items()} == COORDINATOR_FIELDS


def test_the_plugin_runs_each_operation_with_the_same_host_method_or_move_step():
    # a lookup table: its order means nothing (it is the registry's now, the schemas' order)
    assert set(plugin.OPS) == {*HOST_METHODS, *MOVE_STEPS} and len(plugin.OPS) == len(HOST_METHODS) + len(MOVE_STEPS)
    for op in HOST_METHODS:
        assert plugin.OPS[op] is getattr(ShardHost, op), op
    for op in MOVE_STEPS:
        assert plugin.OPS[op] is getattr(host_moves, op), op


def test_lane_and_resend_claims():
    assert lane.LANE_OPS == LANE_OPS
    assert lane.RESENDABLE_OPS == RESENDABLE_OPS
    assert isinstance(lane.LANE_OPS, frozenset) and isinstance(lane.RESENDABLE_OPS, frozenset)


def test_move_gate_claims():
    # the sets host_moves wrote out by hand, now derived from each operation's claims
    assert operations.THROUGH == THROUGH
    assert operations.UNGATED == UNGATED
    assert operations.EPOCH_ARGUMENT == EPOCH_ARGUMENT
    assert operations.AFTER_CLOSE == AFTER_CLOSE
    for derived in (operations.THROUGH, operations.UNGATED, operations.EPOCH_ARGUMENT, operations.AFTER_CLOSE):
        assert isinstance(derived, frozenset)
    # a move's step that takes the new placement version names it, and only those do
    assert {op.name for op in WORKER_OPS.values() if "epoch" in op.fields} == EPOCH_ARGUMENT
    assert not operations.THROUGH & operations.UNGATED
    assert not operations.AFTER_CLOSE & (operations.THROUGH | operations.UNGATED)


def test_coordinator_tables():
    assert coordinator.NO_TABLE == NO_TABLE
    assert coordinator.COORD_LANE_OPS == COORD_LANE_OPS
    assert isinstance(coordinator.NO_TABLE, frozenset) and isinstance(coordinator.COORD_LANE_OPS, frozenset)
    from gear_flow.distributed import transport

    assert transport.COORD_LANE_OPS is coordinator.COORD_LANE_OPS


def test_which_operations_are_quick_whatever_their_arguments():
    quick = {op for op in protocol.WORKER if plugin._quick(op, dict(LARGE))}
    assert quick == ALWAYS_QUICK
    # and those that are quick when small, with the smallest arguments that name what they ask for
    small = {
        "sample_all": {"n": 2, "length": 3},
        "sequences": {"n": 2},
        "sample_part": {"counts": {0: 2}, "length": 3},
        "update": {"seqs_by_shard": {0: [1, 2]}},
        "check_keys": {"seqs_by_shard": {0: [1, 2]}},
        "candidates": {"n": 2},
        "remove": {"counts": {0: 2}},
        "write": {"parts": [{"staged": None, "chunks": []}]},
        "stage": {"parts": [{"staged": None, "chunks": []}]},
    }
    for op, args in small.items():
        assert plugin._quick(op, args), op
    assert not plugin._quick("apply", {"name": "t", "txn": "t1"})  # it needs the host's staged parts to say
    assert set(small) | {"apply"} == QUICK_WHEN_SMALL
    never = set(protocol.WORKER) - ALWAYS_QUICK - QUICK_WHEN_SMALL
    assert never == {
        "create", "drop", "drop_shard", "shared_layout", "lane", "delete", "checkpoint", "restore", "reopen",
        "flush_disk", "move_out", "move_in", "move_commit", "move_release", "move_abort", "move_thaw", "draw_host",
    }  # fmt: skip
    for op in never:
        assert not plugin._quick(op, {"name": "t"}), op


@pytest.mark.parametrize(
    "op, args",
    [
        ("sample_all", {"n": 4096, "length": 2}),
        ("sample_all", {"n": 1, "length": 1, "out": {"x": b""}}),  # a co-located caller's gather
        ("sequences", {"n": plugin.QUICK_STEPS + 1}),
        ("sample_part", {"slots": {0: range(plugin.QUICK_STEPS // 2 + 1)}, "length": 2}),
        ("sample_part", {"counts": {0: 1}, "out": {"x": b""}}),
        ("update", {"seqs_by_shard": {0: range(plugin.QUICK_ITEMS), 1: [1]}}),
        ("candidates", {"n": plugin.QUICK_STEPS + 1}),
        ("remove", {"counts": {0: plugin.QUICK_PICKS, 1: 1}}),
        ("remove", {"slots": {0: range(plugin.QUICK_ITEMS + 1)}}),
    ],
)
def test_large_operations_go_to_the_pool(op, args):
    assert not plugin._quick(op, args)


def test_geometry_only_parts_are_quick_however_many_rows():
    assert plugin._quick("sample_part", {"counts": {0: 1 << 30}, "length": 64, "geometry": True})


def test_every_coordinator_operation_has_a_handler():
    assert all(callable(getattr(GearFlowCoordinator, "_" + op, None)) for op in COORDINATOR_FIELDS)
    for op in COORDINATOR_OPS.values():
        assert inspect.iscoroutinefunction(getattr(GearFlowCoordinator, op.handler)), op.name


# -- the registry is the only source -------------------------------------------------------------------------
def test_the_schemas_are_the_registrys():
    assert list(protocol.WORKER) == list(WORKER_OPS)
    assert list(protocol.COORDINATOR) == list(COORDINATOR_OPS)
    for op in WORKER_OPS.values():
        assert dict(protocol.WORKER[op.name]) == op.schema, op.name
        assert list(op.schema)[: len(op.fields)] == list(op.fields) and set(op.schema) - set(op.fields) <= {"epoch"}
        assert all(protocol.WORKER[op.name][f] is c for f, c in op.fields.items()), op.name
    for op in COORDINATOR_OPS.values():
        assert dict(protocol.COORDINATOR[op.name]) == dict(op.fields), op.name


def test_the_schemas_are_read_only_and_declared_once():
    with pytest.raises(TypeError):
        protocol.WORKER["extra"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        protocol.WORKER["drop"]["extra"] = None  # type: ignore[index]
    with pytest.raises(ValueError, match="declared already"):
        protocol.declare("worker", {"drop": {}})
    with pytest.raises(ValueError, match="'worker' or 'coordinator'"):
        protocol.declare("scheduler", {"new": {}})
    assert "new" not in protocol.WORKER and "new" not in protocol.COORDINATOR


def test_every_worker_operation_has_one_handler_that_exists():
    plugin_own = set()
    for op in WORKER_OPS.values():
        if op.owner == "GearFlowWorker":
            assert inspect.iscoroutinefunction(getattr(GearFlowWorker, op.attribute)), op.name
            plugin_own.add(op.name)
        else:
            assert plugin.OPS[op.name] is getattr(
                {"ShardHost": ShardHost, "host_moves": host_moves}[op.owner], op.attribute
            )
    # the plugin's own need the worker, not only its host: the lane server and the comm to a move's source
    assert plugin_own == {"lane", "move_in"}
    assert set(plugin.OPS) | plugin_own == set(protocol.WORKER)
    assert not set(plugin.OPS) & plugin_own


def test_every_resendable_operation_is_a_lane_operation():
    assert lane.RESENDABLE_OPS <= lane.LANE_OPS
    assert lane.LANE_OPS <= set(plugin.OPS)  # the lane runs what the host runs
    assert coordinator.COORD_LANE_OPS <= set(protocol.COORDINATOR) and coordinator.NO_TABLE <= set(COORDINATOR_OPS)


def test_a_record_refuses_a_claim_it_cannot_make():
    with pytest.raises(ValueError, match="only a lane operation"):
        WorkerOp("x", {}, "ShardHost.info", resendable=True)
    with pytest.raises(ValueError, match="owner"):
        WorkerOp("x", {}, "Host.info")
    with pytest.raises(ValueError, match="passes no gate"):
        WorkerOp("x", {}, "ShardHost.info", through=True, ungated=True)
    for claim in ({"through": True}, {"ungated": True}):
        with pytest.raises(ValueError, match="after_close is for the other gated operations"):
            WorkerOp("x", {}, "ShardHost.info", after_close=True, **claim)
    with pytest.raises(ValueError, match="epoch"):
        WorkerOp("x", {}, "host_moves.move_commit", epoch_argument=True)
    with pytest.raises(ValueError, match="epoch"):
        WorkerOp("x", {"epoch": EPOCH}, "host_moves.move_commit")
    with pytest.raises(ValueError, match="method's name"):
        CoordinatorOp("x", {}, "self._x")
    with pytest.raises(TypeError):
        WORKER_OPS["drop"].fields["extra"] = None  # type: ignore[index]
    with pytest.raises(ValueError, match="declared twice"):
        operations._by_name(WorkerOp("x", {}, "ShardHost.info"), WorkerOp("x", {}, "ShardHost.drop"))


def test_every_quick_claim_names_a_predicate_and_only_the_claimed_ops_are_quick():
    assert set(plugin._SMALL) == {op.name for op in WORKER_OPS.values() if op.quick is not None}
    assert {op.name for op in WORKER_OPS.values() if op.quick == operations.ALWAYS} == ALWAYS_QUICK
    assert set(plugin._SMALL) == ALWAYS_QUICK | QUICK_WHEN_SMALL


def test_operations_imports_no_host_or_coordinator_code_and_sits_in_no_cycle():
    graph = grimp.build_graph("gear_flow")
    module = "gear_flow.distributed.operations"
    deps = graph.find_modules_directly_imported_by(module)
    assert deps == {"gear_flow.distributed.protocol", "gear_flow.distributed.checkers"}
    for dep in deps:
        assert graph.find_shortest_chain(dep, module) is None, dep
