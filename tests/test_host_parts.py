"""The worker's shard host as composed parts: each part on its own seam, and the facade's delegation.

No cluster: the host, its transaction memory and the sample-part request are
plain objects over local shards.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

import gear_flow as gf
from gear_flow.distributed import host_sampling
from gear_flow.distributed.host import ShardHost
from gear_flow.distributed.host_sampling import PartRequest, StaleSelectionError
from gear_flow.distributed.host_tables import HostedTable, HostedTables
from gear_flow.distributed.host_transactions import REMEMBER, TransactionMemory
from gear_flow.distributed.plugin import OPS
from gear_flow.errors import ProtocolError, SpecError
from gear_flow.table.config import TableConfig

X = (gf.ColumnSpec("x", (), np.float32),)
HOST_MODULES = sorted((Path(host_sampling.__file__).parent).glob("host*.py"))


def part(shard, n, first=0):
    return {
        "shard": shard,
        "chunks": [{"x": np.full(1, first + i, np.float32)} for i in range(n)],
        "lengths": np.ones(n, np.int64),
        "episode_ids": np.arange(first, first + n),
        "stamps": np.arange(first, first + n),
        "priorities": None,
    }


def host_with(sampler=None, shards=(0, 1), **kw):
    cfg = TableConfig.build(gf.TableSpec(X, capacity=64, num_shards=len(shards)), sampler=sampler or gf.Uniform(), **kw)
    host = ShardHost()
    host.create("t", cfg.to_dict(), list(shards))
    return host


# -- no mixins ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", HOST_MODULES, ids=lambda p: p.name)
def test_host_classes_have_at_most_two_bases_and_modules_name_their_concept(path):
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc and doc.splitlines()[0].strip(), f"{path.name}: no first docstring line"
    assert "mixin" not in doc.lower(), f"{path.name}: the docstring still defends a mixin"
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            assert len(node.bases) <= 2, f"{path.name}: {node.name} has {len(node.bases)} bases"
            assert not node.name.endswith(("Host", "Mixin")) or node.name == "ShardHost", node.name


def test_shard_host_is_a_facade_over_parts_it_builds():
    host = ShardHost()
    assert ShardHost.__bases__ == (object,)
    assert {"tables", "writer", "editor", "checkpointer", "selection", "sampler"} <= set(vars(host))
    for part_ in (host.writer, host.editor, host.checkpointer, host.selection, host.sampler):
        assert part_.tables is host.tables
    assert host.sampler.editor is host.editor


def test_every_operation_of_the_plugin_is_a_documented_host_method_or_move_step():
    for op, fn in OPS.items():
        if fn.__module__.endswith("host_moves"):
            continue
        assert getattr(ShardHost, op) is fn, op
        assert fn.__doc__ and "Parameters" in fn.__doc__, op
        inspect.signature(fn)  # (the facade keeps the part's signature)


# -- the hosted tables --------------------------------------------------------------------------------
def test_hosted_tables_is_a_read_only_mapping_changed_by_its_methods():
    host = host_with()
    tables = host.tables
    assert isinstance(tables, HostedTables) and sorted(tables) == ["t"] and len(tables) == 1
    assert isinstance(tables["t"], HostedTable) and tables.get("u") is None
    with pytest.raises(TypeError):
        tables["u"] = tables["t"]  # type: ignore[index]
    with pytest.raises(SpecError, match="no table 'u' on this worker"):
        host.table("u")
    assert host.drop_shard("t", 1, 1) and not host.drop_shard("t", 1, 1)
    assert sorted(host.table("t").shards) == [0]
    assert host.drop("t") and not host.drop("t")


# -- the transaction memory ---------------------------------------------------------------------------
def test_transaction_memory_answers_what_became_of_each_insert():
    host = host_with()
    t = host.table("t")
    assert host.stage("t", "a", [part(0, 2)]) == 2
    assert t.txns.status("a") == {"state": "staged"} and t.txns.joins("a") and t.txns.touches({0})
    assert not t.txns.touches({1}) and "a" in t.staged
    with pytest.raises(TypeError):
        t.staged["b"] = []  # type: ignore[index]
    res = host.apply("t", "a")
    assert host.apply("t", "a") is res and host.status("t", "a") == {"state": "applied", "result": res}
    assert not t.txns.joins("a") and not t.txns.touches({0})
    assert host.abort("t", "a") is False and host.status("t", "a")["state"] == "applied"
    assert host.stage("t", "b", [part(1, 1, 10)]) == 1
    assert host.abort("t", "b") is True and host.status("t", "b") == {"state": "aborted"}
    for op, args in (("stage", [[part(1, 1, 10)]]), ("write", [[part(1, 1, 10)]]), ("apply", [])):
        with pytest.raises(SpecError, match="was aborted on this worker"):
            getattr(host, op)("t", "b", *args)
    assert host.status("t", "never") == {"state": "unknown"} and not t.txns.joins(3)


def test_transaction_memory_forgets_the_oldest_outcomes():
    memory = TransactionMemory("t", step=False)
    for i in range(REMEMBER + 1):
        memory.forget(f"x{i}")
    assert memory.status("x0") == {"state": "unknown"} and memory.status(f"x{REMEMBER}") == {"state": "aborted"}


def test_the_memory_of_applied_inserts_is_bounded_in_bytes_and_never_applies_twice():
    """Each applied insert's result (every episode's first key) was kept for the last 4,096 inserts whatever
    its size: inserts of 32,768 one-step episodes held 131 KB each per worker, 0.5 GB at the bound for a
    table of 64 KB.  Past REMEMBER_BYTES of arrays the oldest results go (the newest is always kept); a
    forgotten insert's apply sent again is refused, never applied twice."""
    from gear_flow.distributed.host_transactions import REMEMBER_BYTES

    memory = TransactionMemory("t", step=False)
    keys = np.arange(1 << 20)  # 8 MiB of first keys (one array: the test holds no more)
    for i in range(20):
        memory.stage(f"a{i}", [])
        assert memory.begin_apply(f"a{i}") == (None, [])
        memory.end_apply(f"a{i}", {"first_keys": {0: keys}, "items": {0: len(keys)}, "evicted": {}})
    kept = [i for i in range(20) if memory.status(f"a{i}")["state"] == "applied"]
    assert kept == list(range(20 - REMEMBER_BYTES // keys.nbytes, 20))
    assert memory.status("a0") == {"state": "unknown"}
    with pytest.raises(SpecError, match="is not staged on this worker"):
        memory.begin_apply("a0")
    memory.stage("huge", [])
    memory.begin_apply("huge")
    memory.end_apply("huge", {"first_keys": {0: np.zeros(REMEMBER_BYTES)}})  # larger than the bound: kept alone
    assert memory.status("huge")["state"] == "applied" and memory.status("a19") == {"state": "unknown"}


def test_an_apply_that_fails_leaves_its_insert_neither_applying_nor_applied():
    memory = TransactionMemory("t", step=False)
    memory.stage("a", [])
    done, batches = memory.begin_apply("a")
    assert done is None and batches == [] and memory.status("a") == {"state": "applying"}
    assert memory.touches(set())  # any insert being applied holds a move back
    memory.end_apply("a", None)
    assert memory.status("a") == {"state": "unknown"} and not memory.touches(set())


@pytest.mark.parametrize("op", ["write", "apply"])
def test_a_request_sent_again_while_the_first_is_applied_waits_for_it_and_writes_once(op):
    """A write or apply sent again (its lane's reply lost, or its caller interrupted, so the step goes again
    over the comm) while the first was still being written: a write staged the episodes again and wrote them
    twice (4 items of a 2-item insert), an apply was refused as 'not staged' while the first wrote.  The second
    waits for the first and answers its result."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    host = host_with()
    if op == "apply":
        host.stage("t", "a", [part(0, 2)])
    lock = host.table("t").shards[0].lock
    with ThreadPoolExecutor(2) as pool:
        with lock:  # the first request's write waits for the shard; its insert is being applied meanwhile
            call = (lambda: host.write("t", "a", [part(0, 2)])) if op == "write" else (lambda: host.apply("t", "a"))
            first = pool.submit(call)
            while host.status("t", "a")["state"] != "applying":
                threading.Event().wait(0.001)  # polling the memory's state, not a barrier
            second = pool.submit(call)
            assert not second.done()
        a, b = first.result(10), second.result(10)
    assert a is b and a["items"] == {0: 2}
    assert host.table("t").shards[0].size == 2 and host.status("t", "a") == {"state": "applied", "result": a}


# -- two-phase samples --------------------------------------------------------------------------------
def test_a_two_phase_sample_is_pending_until_finished_and_a_finish_sent_again_changes_nothing():
    host = host_with(max_times_sampled=1)
    host.write("t", "w", [part(0, 4), part(1, 4, 4)])
    t = host.table("t")
    res = host.sample_part("t", 1, "pad_tail", ("x",), 0, counts={0: 2, 1: 1}, scale={0: 0.5, 1: 0.5},
                           txn="s", record=False)  # fmt: skip
    assert sorted(k for k in res if isinstance(k, int)) == [0, 1] and t.txns.joins("s")
    assert sum(s.counters.sampled for s in t.shards.values()) == 0  # nothing recorded yet
    first = host.finish_sample("t", "s", commit=True)
    assert sum(first.values()) == len(set(res[0]["seqs"].tolist())) + 1
    assert host.finish_sample("t", "s", commit=True) == first and host.finish_sample("t", "s", commit=False) == {}
    assert not t.txns.joins("s")


def test_an_abort_undoes_a_pending_sample():
    host = host_with()
    host.write("t", "w", [part(0, 4)])
    host.sample_part("t", 1, "pad_tail", ("x",), 0, counts={0: 3}, scale={0: 1.0}, txn="s", record=False)
    assert host.abort("t", "s") is True and host.finish_sample("t", "s", commit=False) == {0: 3}


# -- the sample-part request --------------------------------------------------------------------------
def test_part_request_checks_its_arguments_in_order():
    t = HostedTable("t", TableConfig.build(gf.TableSpec(X, capacity=8, num_shards=2)), [0])
    check = PartRequest.checked
    with pytest.raises(ProtocolError, match="columns"):
        check(t, 1, "pad_tail", ["y"], {0: 1}, {0: 1.0})
    with pytest.raises(ProtocolError, match="exactly one of counts and slots"):
        check(t, 1, "pad_tail", ["x"])
    with pytest.raises(ProtocolError, match="scale must give"):
        check(t, 1, "pad_tail", ["x"], {0: 1}, {})
    with pytest.raises(ProtocolError, match="record=False needs"):
        check(t, 1, "pad_tail", ["x"], {0: 1}, {0: 1.0}, record=False)
    with pytest.raises(SpecError, match="shard 1 of table 't' is not on this worker"):
        check(t, 1, "pad_tail", ["x"], {1: 1}, {1: 1.0})
    req = check(t, 2, "pad_tail", ("x",), slots={0: [3, 1]}, record=None, geometry=None, by_count=None)
    assert (req.ids, req.draws, req.record, req.geometry, req.by_count, req.columns) == (
        (0,), False, True, False, False, ("x",),
    )  # fmt: skip


def test_a_take_of_a_removed_item_is_stale_and_undoes_the_draws_before_it():
    host = host_with(gf.Fifo())
    host.write("t", "w", [part(0, 2), part(1, 2, 2)])
    t = host.table("t")
    with pytest.raises(StaleSelectionError, match="shard 1: a chosen item was removed"):
        host.sample_part("t", 1, "pad_tail", ("x",), 0, slots={0: [0, 1], 1: [5]})
    assert [s.counters.sampled for _, s in sorted(t.shards.items())] == [0, 0]  # shard 0's count given back
    res = host.sample_part("t", 1, "pad_tail", ("x",), 0, slots={0: [1], 1: [0]}, geometry=True)
    assert "data" not in res[0] and "src_abs" in res[0] and res[0]["p"].tolist() == [1.0]


def test_a_whole_batch_reply_takes_its_buffers_from_the_pool_once_the_last_one_is_sent():
    """A worker's ``sample_all`` reply gathers into the tier's reused outputs: once nothing holds the last
    reply (it was sent), the next one fills the same memory, not fresh pages."""
    spec = gf.TableSpec((gf.ColumnSpec("obs", (4096,), np.float32),), capacity=256, num_shards=1)
    host = ShardHost()
    host.create("t", TableConfig.build(spec, sampler=gf.Uniform()).to_dict(), [0])
    rows = np.arange(20 * 4096, dtype=np.float32).reshape(20, 4096)
    host.write("t", "w", [{"shard": 0, "chunks": [{"obs": rows}], "lengths": np.array([20]),
                          "episode_ids": np.arange(1), "stamps": np.arange(1), "priorities": None}])  # fmt: skip
    from gear_flow.storage import base as storage_base

    first = host.sample_all("t", 64, 1, "pad_tail", ("obs",), 0)  # 1 MB: a pooled size
    kept = [b for bs in storage_base._OUTPUTS._kept.values() for b in bs]
    assert any(np.shares_memory(first["data"]["obs"], b) for b in kept)  # the pool's, not the allocator's
    del kept  # (references to the pool's buffers would keep them taken)
    addr = first["data"]["obs"].ctypes.data
    held = host.sample_all("t", 64, 1, "pad_tail", ("obs",), 1)
    assert held["data"]["obs"].ctypes.data != addr  # the first still held: other memory
    del first
    again = host.sample_all("t", 64, 1, "pad_tail", ("obs",), 2)
    assert again["data"]["obs"].ctypes.data == addr
    got = again["data"]["obs"].view(np.float32).reshape(64, 4096)
    np.testing.assert_array_equal(got, rows[again["timesteps"]])  # and holds this batch's rows


def test_a_whole_batch_finding_its_admitted_items_gone_takes_nothing_and_waits_as_on_a_local_table():
    """A worker's ``sample_all`` whose table a delete emptied after the coordinator admitted the batch gives
    the admission back to wait for an insert (``ShortBatchError``), as a LocalTable's sample does and a
    sample over several workers does; stored items none of whose windows fit are still the call's error."""
    spec = gf.TableSpec(X, capacity=16, num_shards=1)
    host = ShardHost()
    host.create("t", TableConfig.build(spec, sampler=gf.Fifo(), max_times_sampled=1).to_dict(), [0])
    with pytest.raises(host_sampling.ShortBatchError, match="admitted for are gone"):
        host.sample_all("t", 1, 1, "strict", ("x",), 0)
    host.write("t", "w", [part(0, 2)])
    with pytest.raises(gf.WindowTooLongError):
        host.sample_all("t", 1, 3, "strict", ("x",), 0)
    got = host.sample_all("t", 2, 1, "strict", ("x",), 0)
    assert got["data"]["x"].view(np.float32).ravel().tolist() == [0.0, 1.0] and got["expired"] == {0: 2}
    with pytest.raises(host_sampling.ShortBatchError):  # both expired: gone as by a delete
        host.sample_all("t", 1, 1, "strict", ("x",), 0)
