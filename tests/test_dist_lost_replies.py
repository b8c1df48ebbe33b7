"""A lane reply lost after the worker acted: what may be sent again, and what may not.

A request goes to a worker over its lane (a Unix socket on the machine, a
TCP socket of its own elsewhere); when the lane breaks after the request was
sent, the worker may have acted on it.  Requests the worker acts on once
however often they come (an insert's steps, a sample's finish) go again over
the comm and count once; a draw does not (``test_dist_thread_sample``); a
worker that closes while it answers counts as lost, so a degraded table
serves the batch from the other shards.

A worker lost in the middle of any other call of a degraded table leaves
that call whole for the shards left and the coordinator agreeing with them:
a priority update or a delete (the lost shard's keys stale), an insert's
eviction to ``max_size`` (the insert is stored, so it returns), a checkpoint
(written again, of the shards left), a queue's finish (the batch, whole, is
handed out).  A grant whose placement lookup then fails is given back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import dask
import numpy as np
import pytest
from dist_support import DIAL, coordinator, handed, own_cluster, tables_here, wait_for
from lane_support import break_lane_after

import gear_flow as gf
from gear_flow.distributed import DistributedTable, writes
from gear_flow.distributed.plugin import PLUGIN_NAME

pytestmark = pytest.mark.timeout(240)

TAG = (gf.ColumnSpec("tag", (), np.int64),)


def tagged(tags):
    return [{"tag": np.array([t], np.int64)} for t in tags]


def _broke(client, addr):
    return client.run(lambda dask_worker: dask_worker.plugins[PLUGIN_NAME].broke, workers=[addr])[addr]


@pytest.mark.parametrize("plane", ["shared-memory", "tcp-lane"])
def test_a_finish_whose_lane_reply_is_lost_counts_its_expiries_once(dist_client, plane):
    """A queue's sample is finished on each worker it drew from (the items expire there); the finish's
    reply is lost: sent again over the comm, the worker answers with what it did the first time, so the
    coordinator counts each expiry once and the queue goes on in order, nothing lost or handed out twice."""
    with dask.config.set({"gear-flow.distributed.shared-memory": plane == "shared-memory"}):
        t = DistributedTable.queue(dist_client, gf.TableSpec(TAG, capacity=64, num_shards=2), 16, timeout=30, seed=0)
        h, ctx = handed(t, seed=0)  # the handle whose lanes are read, on a context of the test's own
    try:
        h.insert(tagged(range(1, 9)))
        assert h.sample(2)["tag"].numpy()[:, 0].tolist() == [1, 2]  # the lanes learnt
        assert set(ctx.lanes.paths) == set(h.placement.values())
        addr = h.placement[0]
        dist_client.run(break_lane_after, "finish_sample", workers=[addr])
        got = h.sample(4)["tag"].numpy()[:, 0].tolist()
        assert got == [3, 4, 5, 6]
        assert _broke(dist_client, addr) == [("finish_sample", True)]  # served, its reply lost, served again
        info = h.info()
        assert info["size"] == info["coordinator_size"] == 2, info
        assert info["totals"]["sampled"] == 6 and info["rate_limiter"]["samples"] == 6
        assert h.sample(2)["tag"].numpy()[:, 0].tolist() == [7, 8]
        info = h.info()
        assert info["size"] == info["coordinator_size"] == 0, info
    finally:
        t.close()


def _close_while_serving(op, dask_worker=None):
    """This worker serves the next ``op`` (from its lane or its comm), then closes without replying, and
    answers nothing more (a request sent again, or the next one, waits until its connection closes)."""
    plugin = dask_worker.plugins[PLUGIN_NAME]
    closing = []

    def wrapped(real):
        async def serve(action, *args):
            if closing:  # as a worker that is gone
                await asyncio.Event().wait()
            reply = await real(action, *args)
            if action == op:
                closing.append(asyncio.ensure_future(dask_worker.close(reason=f"closing while it serves {op}")))
                await asyncio.Event().wait()  # no reply: the connection closes with the worker
            return reply

        return serve

    plugin.lane._serve, plugin.serve = wrapped(plugin.lane._serve), wrapped(plugin.serve)


@pytest.mark.parametrize("plane", ["shared-memory", "tcp-lane"])
def test_a_worker_closing_while_it_draws_counts_as_lost(plane):
    """Its lane closes before the reply; its comm still answers, but no longer its gear_flow handler: the
    worker is lost, not a live worker whose reply went missing, so a degraded table serves the batch from
    the other shard."""
    planes = {
        "gear-flow.distributed.shared-memory": plane == "shared-memory",
        "gear-flow.distributed.tcp-lane": True,
        "gear-flow.distributed.reader-draw": False,  # the owners draw: the worker closes while it serves one
    }
    with own_cluster({**DIAL, **planes}) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        t = DistributedTable.create(client, spec, degraded=True, seed=0)
        try:
            h, ctx = handed(t, seed=0)  # the handle whose lanes are read, on a context of the test's own
            h.insert(tagged(range(1, 13)), shard=0)
            h.insert(tagged(range(101, 113)), shard=1)
            h.sample(8)  # the lanes learnt
            assert set(ctx.lanes.paths) == set(h.placement.values())
            client.run(_close_while_serving, "sample_part", workers=[h.placement[1]])
            h._masses.clear()  # the plan asks the workers first: the event loop's path
            b = h.sample(64)
            assert set(b["tag"].numpy()[:, 0].tolist()) <= set(range(1, 13))  # all from the shard left
            assert set(h.lost) == {1}
        finally:
            t.close()


@pytest.mark.parametrize("degraded", [True, False])
@pytest.mark.parametrize("op", ["candidates", "remove"])
def test_a_worker_lost_while_an_insert_evicts_leaves_the_insert_stored_and_says_so(op, degraded):
    """The insert is committed before it evicts to ``max_size``; the other shard's worker closes while it
    lists its eviction candidates, or after removing its victim.  A degraded table marks that shard lost
    and the insert returns (its items are stored: nothing to send again), with the live shard's removal
    counted; otherwise the ShardLostError says the insert was stored.  Either way no internal error leaks
    and the coordinator agrees with the shards."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2, max_size=20)
        t = DistributedTable.create(client, spec, degraded=degraded, seed=0)
        try:
            h, ctx = handed(t, seed=0)  # the handle whose lanes are read, on a context of the test's own
            for k in range(1, 11):  # the oldest two, 1 and 101, on different shards: the Fifo remover's victims
                h.insert(tagged([k]), shard=0)
                h.insert(tagged([100 + k]), shard=1)
            h.sample(8)  # the lanes learnt
            assert set(ctx.lanes.paths) == set(h.placement.values())
            client.run(_close_while_serving, op, workers=[h.placement[1]])
            if degraded:
                r = h.insert(tagged([11, 12]), shard=0)
                assert r.shards.tolist() == [0, 0]
            else:
                with pytest.raises(gf.ShardLostError, match="the insert was stored"):
                    h.insert(tagged([11, 12]), shard=0)
            assert set(h.lost) == {1}
            if degraded:
                kept = set(range(1 if op == "candidates" else 2, 13))  # tag 1 evicted when the removal ran
                info = h.info()
                assert info["size"] == info["coordinator_size"] == len(kept), info
                assert set(h.sample(64)["tag"].numpy()[:, 0].tolist()) == kept
        finally:
            t.close()


def _one_more_serves_the_wait(t, **where):
    """Item 1 waits alone in queue ``t``: with item 3 inserted (``where``: insert's ``shard``), a sample of 2
    gets both, in order, and leaves the queue empty on the workers and the coordinator, its counts agreed."""
    t.insert(tagged([3]), **where)
    assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [1, 3]
    info = t.info()
    limiter = info["rate_limiter"]
    assert info["size"] == info["coordinator_size"] == 0 and limiter["inserts"] == limiter["samples"]


def _hold_each(ops, dask_worker=None):
    """This worker's first request of each of ``ops`` waits until :func:`_release_op` releases that op
    (other requests are served meanwhile)."""
    plugin = dask_worker.plugins[PLUGIN_NAME]
    plugin.holds = holds = {op: {"waiting": False, "go": asyncio.Event()} for op in ops}

    def wrapped(real):
        async def serve(action, *args):
            h = holds.get(action)
            if h is not None and not h["waiting"]:
                h["waiting"] = True
                await h["go"].wait()
            return await real(action, *args)

        return serve

    plugin.lane._serve, plugin.serve = wrapped(plugin.lane._serve), wrapped(plugin.serve)


def _release_op(op, dask_worker=None):
    dask_worker.plugins[PLUGIN_NAME].holds[op]["go"].set()


def _hold_first(op, dask_worker=None):
    """This worker's next ``op`` request waits until :func:`_release_held` (another connection's requests
    are served meanwhile)."""
    _hold_each([op], dask_worker)
    plugin = dask_worker.plugins[PLUGIN_NAME]
    plugin.held = plugin.holds[op]


def _held_waiting(dask_worker=None):
    return dask_worker.plugins[PLUGIN_NAME].held["waiting"]


def _release_held(dask_worker=None):
    dask_worker.plugins[PLUGIN_NAME].held["go"].set()


def _delete_while_held(client, t, op, addr, doomed):
    """Sample 2 from queue ``t`` while ``addr`` holds the sample's ``op`` request; another client deletes
    ``doomed`` meanwhile.  The sample, left one item for two rows, waits again (a timeout), never handing
    the item left out twice."""
    from distributed import Client

    client.run(_hold_first, op, workers=[addr])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        f = pool.submit(t.sample, 2, timeout=3)
        wait_for(lambda: client.run(_held_waiting, workers=[addr])[addr], f"the held {op}", 30)
        with Client(client.scheduler.address) as other:  # its own connections: served meanwhile
            assert DistributedTable.attach(t.name, other).delete(doomed).applied == 1
        client.run(_release_held, workers=[addr])
        with pytest.raises(gf.RateLimitTimeout):
            f.result(timeout=60)


def _queue_item_deleted_while_held(op: str, cfg: dict, n: int, warm: bool) -> None:
    """A queue of two shards holds items 1 (shard 0) and 2 (shard 1); a sample of 2 is sent, shard 1's
    worker holds its ``op`` request while another client deletes item 2 (:func:`_delete_while_held`), and
    one more item serves the wait (:func:`_one_more_serves_the_wait`).  ``warm``: one sample first, so
    that the handle has learnt its lanes."""
    with own_cluster(cfg, n=n) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        t = DistributedTable.queue(client, spec, 32, timeout=30, seed=0)
        try:
            if warm:
                t.insert(tagged([10]), shard=0)
                t.insert(tagged([11]), shard=1)
                assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [10, 11]  # the lanes learnt
            t.insert(tagged([1]), shard=0)
            doomed = t.insert(tagged([2]), shard=1).first_keys
            _delete_while_held(client, t, op, t.placement[1], doomed)
            _one_more_serves_the_wait(t, shard=1)
        finally:
            t.close()


def test_a_queue_sample_whose_item_is_deleted_after_its_grant_is_admitted_again():
    """A queue holds one item per shard; a sample of 2 is granted, and before shard 1's worker answers
    for its candidates another client deletes that shard's item.  The sample finds one item for two rows:
    it gives its admission back and waits again (a timeout here) instead of handing the item left out
    twice; with a new item it is served, in order."""
    _queue_item_deleted_while_held("candidates", {"gear-flow.distributed.shared-memory": True}, 2, warm=True)


def test_a_queue_sample_on_one_worker_whose_item_is_deleted_after_its_grant_is_admitted_again():
    """The same on one worker reached over the comm only (no shared memory, no lanes): the whole sample is
    one ``sample_all`` request, which the worker holds while another client deletes one of the two items.
    The worker finds one item for the batch of two and says so; the sample gives its admission back and
    waits again instead of handing the item left out twice, and is served in order after one more insert."""
    cfg = {"gear-flow.distributed.shared-memory": False, "gear-flow.distributed.tcp-lane": False}
    _queue_item_deleted_while_held("sample_all", cfg, 1, warm=False)


def test_an_insert_whose_other_worker_is_lost_as_it_applies_still_evicts_to_max_size():
    """Shard 0 is full (max_size 10); an insert of two episodes, one per shard, is staged on both workers,
    and shard 1's worker closes while it applies its part.  The part on shard 0 is stored, so the error
    says so (``.stored``, naming shard 1), and the table is evicted back to max_size first, as after an
    insert that returns (shard 0's oldest item goes), the coordinator agreeing with the shard."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2, max_size=10)
        t = DistributedTable.create(client, spec, degraded=True, seed=0)
        try:
            t.insert(tagged(range(1, 11)), shard=0)
            t.sample(8)  # the lanes learnt
            assert writes.route(t, np.ones(2, np.int64), None).tolist() == [0, 1]  # the next insert: one per shard
            client.run(_close_while_serving, "apply", workers=[t.placement[1]])
            with pytest.raises(gf.ShardLostError, match="the rest of the insert was stored") as e:
                t.insert(tagged([11, 12]))
            assert e.value.stored is True and e.value.shard == 1
            assert set(t.lost) == {1}
            info = t.info()
            assert info["size"] == info["coordinator_size"] == 10, info
            assert set(t.sample(64)["tag"].numpy()[:, 0].tolist()) == set(range(2, 12))
        finally:
            t.close()


def _refuse(op, dask_worker=None):
    """This worker answers every ``op`` request with an error (as a live worker refusing it would)."""
    from gear_flow.errors import SpecError

    plugin = dask_worker.plugins[PLUGIN_NAME]

    def wrapped(real):
        async def serve(action, *args):
            if action == op:
                return False, SpecError(f"{op} refused (injected)")
            return await real(action, *args)

        return serve

    plugin.lane._serve, plugin.serve = wrapped(plugin.lane._serve), wrapped(plugin.serve)


def test_a_live_worker_that_refuses_to_apply_its_part_is_not_taken_as_lost():
    """An insert of one episode per shard is staged on both workers, and shard 1's worker, alive, answers
    the apply with an error.  Its shard is not marked lost (its items are not dropped from the table):
    the insert fails with an error naming the worker and saying the rest was stored, the coordinator
    counts just shard 0's part, and the table goes on with both shards."""
    with own_cluster({"gear-flow.distributed.shared-memory": True}) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        t = DistributedTable.create(client, spec, seed=0)
        try:
            t.insert(tagged([1]), shard=0)
            t.insert(tagged([2]), shard=1)
            assert writes.route(t, np.ones(2, np.int64), None).tolist() == [0, 1]  # the next insert: one per shard
            w1 = t.placement[1]
            client.run(_refuse, "apply", workers=[w1])
            with pytest.raises(gf.GearFlowError, match=f"worker {w1} did not apply.*the rest of the insert was stored"):
                t.insert(tagged([3, 4]))
            assert not t.lost
            info = t.info()
            assert info["size"] == info["coordinator_size"] == 3, info
            assert sorted(set(t.sample(64)["tag"].numpy()[:, 0].tolist())) == [1, 2, 3]
            t.insert(tagged([5]), shard=1)  # shard 1 takes writes still (one worker: a write, not an apply)
            assert t.info()["coordinator_size"] == 4
        finally:
            t.close()


def test_a_weighted_draw_whose_items_are_written_over_before_its_take_is_drawn_again():
    """A uniform table with ``max_times_sampled=1`` draws item by item (each shard's sequence, then one
    take).  Shard 1's worker holds the take while another client writes 8 new items over every slot of
    its ring.  The take finds other items in its slots and the sample is drawn again, from the new items:
    two of them, each once, reported ``1/8`` then ``1/7``, never the old items' ``1/4, 1/3`` on new
    data."""
    from distributed import Client

    with own_cluster({"gear-flow.distributed.shared-memory": True}) as client:
        spec = gf.TableSpec(TAG, capacity=8, num_shards=2)
        t = DistributedTable.create(client, spec, sampler=gf.Uniform(), max_times_sampled=1, timeout=30, seed=0)
        try:
            t.insert(tagged([1, 2, 3, 4]), shard=1)
            w1 = t.placement[1]
            client.run(_hold_first, "sample_part", workers=[w1])
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                f = pool.submit(t.sample, 2)
                wait_for(lambda: client.run(_held_waiting, workers=[w1])[w1], "the held take", 30)
                with Client(client.scheduler.address) as other:
                    DistributedTable.attach(t.name, other).insert(tagged(range(100, 108)), shard=1)
                client.run(_release_held, workers=[w1])
                b = f.result(timeout=60)
            tags = b["tag"].numpy()[:, 0].tolist()
            assert len(set(tags)) == 2 and set(tags) <= set(range(100, 108)), tags
            np.testing.assert_allclose(b.probabilities.numpy(), [1 / 8, 1 / 7])
            info = t.info()
            assert info["size"] == info["coordinator_size"] == 6, info
        finally:
            t.close()


def test_an_insert_whose_eviction_a_live_worker_does_not_answer_returns_stored(caplog):
    """An insert takes the table over max_size, and the worker holds the eviction's ``remove`` unanswered
    past the reply timeout while it stays alive.  The insert is stored, so it returns (a caller must not
    send it again), the warning says the eviction failed, and the table stays over max_size on the
    worker and the coordinator alike until the next eviction."""
    # the short reply timeout only from the insert on: the worker's first write (its compiles, on a loaded
    # machine) may take longer than 2 s, and it is not what this test holds back
    cfg = {"gear-flow.distributed.rpc-timeout": 2, "gear-flow.distributed.rpc-retries": 0}
    with own_cluster(n=1) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=1, max_size=10)
        t = DistributedTable.create(client, spec, seed=0)
        try:
            t.insert(tagged(range(10)))
            client.run(_hold_first, "remove", workers=[t.placement[0]])
            with dask.config.set(cfg), caplog.at_level("WARNING", logger="gear_flow.distributed.edits"):
                res = t.insert(tagged([10, 11]))
            assert res.num_items == 2
            assert "its eviction to max_size failed" in caplog.text
            info = t.info()
            assert info["size"] == info["coordinator_size"] == 12, info
        finally:
            t.close()


@pytest.mark.parametrize(
    "op, edit", [("check_keys", "update"), ("update", "update"), ("check_keys", "delete"), ("delete", "delete")]
)
def test_a_worker_lost_during_a_key_edit_of_a_degraded_table_counts_its_keys_stale(op, edit):
    """A priority update or a delete by key over two shards; one shard's worker closes while it checks the
    keys or applies the edit.  The call returns (no internal error): the live shard's keys applied, the lost
    one's counted stale, and the coordinator's size agrees with the shards' (the removals of the worker that
    answered are counted)."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        t = DistributedTable.create(client, spec, sampler=gf.Prioritized(1.0), degraded=True, seed=0)
        try:
            t.insert(tagged(range(1, 11)), shard=0, priorities=1.0)
            t.insert(tagged(range(101, 111)), shard=1, priorities=1.0)
            b = t.sample(64)  # the lanes learnt; keys of both shards
            shard = gf.keys.decode(b.keys.numpy())[0]
            keys = np.concatenate([np.unique(b.keys.numpy()[shard == s])[:3] for s in (0, 1)])
            # a second handle has seen no key issued (it samples nothing): its edit checks the keys on both
            # workers first; its requests go over the comm, the first handle's over the lanes
            h = DistributedTable.attach(t.name, client=client) if op == "check_keys" else t
            client.run(_close_while_serving, op, workers=[t.placement[1]])
            if edit == "update":
                r = h.update_priorities(keys, 5.0)
            else:
                r = h.delete(keys)
            assert (r.applied, r.stale) == (3, 3)
            assert set(h.lost) == {1}
            info = h.info()
            assert info["size"] == info["coordinator_size"] == (10 if edit == "update" else 7), info
            got = h.sample(64)
            if edit == "update":  # the live shard's three keys carry the new priority
                new = np.isin(got.keys.numpy(), keys[:3])
                assert new.any() and set(got.priorities.numpy()[new].tolist()) == {5.0}
                assert set(got.priorities.numpy()[~new].tolist()) == {1.0}
            else:
                assert not np.isin(got.keys.numpy(), keys).any()
        finally:
            t.close()


def test_a_worker_lost_during_a_checkpoint_of_a_degraded_table_leaves_a_checkpoint_of_the_rest(tmp_path):
    """One shard's worker closes while it writes its part of a checkpoint: the degraded table marks it
    lost and writes the checkpoint again, of the live shard, into a fresh directory (no partial one left
    behind).  The checkpoint restores as it was taken: that shard's items, the other shard lost."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        t = DistributedTable.create(client, spec, degraded=True, seed=0)
        try:
            t.insert(tagged(range(1, 11)), shard=0)
            t.insert(tagged(range(101, 111)), shard=1)
            t.checkpoint(tmp_path / "full")
            client.run(_close_while_serving, "checkpoint", workers=[t.placement[1]])
            r = t.checkpoint(tmp_path / "ck")
            assert r["shards"] == [0] and set(t.lost) == {1}
            assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "full"]  # the first attempt's removed
        finally:
            t.close()
        u = DistributedTable.restore(client, tmp_path / "ck", seed=0)
        try:  # restored as it was taken: shard 1 lost (restore_shard would rebuild it from an older checkpoint)
            assert set(u.lost) == {1} and "before the checkpoint" in u.info()["lost"][1]["detail"]
            info = u.info()
            assert info["size"] == info["coordinator_size"] == 10, info
            assert set(u.sample(64)["tag"].numpy()[:, 0].tolist()) == set(range(1, 11))
            assert u.insert(tagged([11])).shards.tolist() == [0]  # inserts go to the live shard
            rep = u.restore_shard(1, tmp_path / "full")  # the lost shard, from the earlier checkpoint
            assert rep["items_restored"] == 10
            info = u.info()
            assert not info["lost"] and info["size"] == info["coordinator_size"] == 21, info
            assert set(u.sample(256)["tag"].numpy()[:, 0].tolist()) == set(range(1, 12)) | set(range(101, 111))
        finally:
            u.close()


def test_a_worker_lost_while_a_degraded_queue_finishes_a_sample_hands_the_batch_out():
    """A queue's sample drew from both shards and is being finished (each worker expires what it handed
    out); one worker closes while it finishes.  The batch is whole (every part arrived before the finish),
    so it is returned: the live shard's items it expired are neither lost (drawn again into another batch
    that nobody gets) nor left counted by the coordinator, and the queue goes on in order."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        t = DistributedTable.queue(client, spec, 32, timeout=30, seed=0, degraded=True)
        try:
            on = t.insert(tagged(range(1, 13))).shards.tolist()  # spread over both shards
            assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [1, 2]  # the lanes learnt
            client.run(_close_while_serving, "finish_sample", workers=[t.placement[1]])
            assert t.sample(4)["tag"].numpy()[:, 0].tolist() == [3, 4, 5, 6]
            assert set(t.lost) == {1}
            info = t.info()
            kept = [k for k, s in zip(range(1, 13), on) if s == 0 and k > 6]  # the live shard's, not handed out
            assert info["size"] == info["coordinator_size"] == len(kept) > 0, info
            limiter = info["rate_limiter"]
            assert limiter["inserts"] - limiter["samples"] == len(kept), limiter  # the queue's count of waiting
            assert t.sample(len(kept))["tag"].numpy()[:, 0].tolist() == kept
        finally:
            t.close()


def test_a_queue_sample_admitted_before_a_loss_it_meets_waits_for_as_many_items_again():
    """A degraded queue holds one item per shard; a sample of 2 is admitted and asks both workers for
    candidates, and shard 1's worker closes while it answers.  The shard left holds one item: the sample
    gives its admission back and waits again (a timeout here), never handing that item out twice; with
    a second item it is served, in order."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        t = DistributedTable.queue(client, spec, 32, timeout=30, seed=0, degraded=True)
        try:
            t.insert(tagged([10]), shard=0)
            t.insert(tagged([11]), shard=1)
            assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [10, 11]  # the lanes learnt
            t.insert(tagged([1]), shard=0)
            t.insert(tagged([2]), shard=1)
            client.run(_close_while_serving, "candidates", workers=[t.placement[1]])
            with pytest.raises(gf.RateLimitTimeout):
                t.sample(2, timeout=1)
            assert set(t.lost) == {1}
            _one_more_serves_the_wait(t)
        finally:
            t.close()


@pytest.mark.parametrize("degraded", [True, False])
def test_a_worker_lost_while_the_table_counts_its_bytes(degraded):
    """``nbytes()`` while one shard's worker closes: a degraded table counts that shard 0 from then on (its
    rings' bytes leave the sum), one that is not raises ShardLostError; never an internal error."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), degraded=degraded, seed=0)
        try:
            t.insert(tagged(range(1, 11)), shard=0)
            t.insert(tagged(range(101, 111)), shard=1)
            before = t.nbytes()
            client.run(_close_while_serving, "nbytes", workers=[t.placement[1]])
            if degraded:
                got = t.nbytes()
                assert got["data"] == before["data"] // 2 and set(t.lost) == {1}
                assert t.nbytes() == got
            else:
                with pytest.raises(gf.ShardLostError):
                    t.nbytes()
        finally:
            t.close()


def test_a_worker_lost_while_a_checkpoint_is_restored_leaves_nothing_behind(tmp_path):
    """One of the two workers a checkpoint is restored onto closes while it loads its shard: the restore
    raises ShardLostError (not the internal WorkerLost) and the other worker keeps nothing of it."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), seed=0)
        t.insert(tagged(range(1, 11)), shard=0)
        t.insert(tagged(range(101, 111)), shard=1)
        t.checkpoint(tmp_path / "ck")
        t.close()
        addrs = sorted(client.nthreads())
        client.run(_close_while_serving, "restore", workers=[addrs[1]])
        with pytest.raises(gf.ShardLostError, match="nothing of it was built"):
            DistributedTable.restore(client, tmp_path / "ck", name="again", workers=addrs)
        assert "again" not in client.run(tables_here, workers=[addrs[0]])[addrs[0]]
        with pytest.raises(gf.SpecError):
            DistributedTable.attach("again", client=client)


@pytest.mark.parametrize("case", ["old-lost-in-info", "old-lost-in-drop", "target-lost-in-restore"])
def test_a_worker_lost_while_a_live_shard_is_replaced_from_a_checkpoint(tmp_path, case):
    """``restore_shard(1, ck, replace=True)`` on a degraded table over three workers (one spare), while a
    worker closes: the shard's own worker as it is asked for the shard's size (the shard is then restored as
    a lost one) or as it drops its replaced copy (the shard lives on the new worker: not marked lost), or the
    new worker as it loads the shard (ShardLostError, and the live shard stays as it was).  No internal
    error, and the coordinator agrees with the shards."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": True}, n=3) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), degraded=True, seed=0)
        try:
            t.insert(tagged(range(1, 11)), shard=0)
            t.insert(tagged(range(101, 111)), shard=1)
            t.checkpoint(tmp_path / "ck")
            old = t.placement[1]
            spare = next(a for a in sorted(client.nthreads()) if a not in t.placement.values())
            closing = {"old-lost-in-info": (old, "info"), "old-lost-in-drop": (old, "drop_shard")}
            closing["target-lost-in-restore"] = (spare, "restore")
            who, op = closing[case]
            client.run(_close_while_serving, op, workers=[who])
            if case == "target-lost-in-restore":
                with pytest.raises(gf.ShardLostError, match="nothing was restored"):
                    t.restore_shard(1, tmp_path / "ck", worker=spare, replace=True)
                assert t.placement[1] == old
            else:
                rep = t.restore_shard(1, tmp_path / "ck", worker=spare, replace=True)
                assert rep["items_restored"] == 10 and t.placement[1] == spare
            assert not t.lost
            info = t.info()
            assert info["size"] == info["coordinator_size"] == 20, info
            assert set(t.sample(256)["tag"].numpy()[:, 0].tolist()) == set(range(1, 11)) | set(range(101, 111))
        finally:
            t.close()


def _refresh_fails_once(t):
    """``t``'s next placement lookup after a grant fails (as when the coordinator's reply is lost): the
    handle's placement is made to look old, so the grant's newer version makes it look up."""
    real, failed = t._link.refresh, []

    async def refresh(version=None):
        if version is not None and version != t._view.version and not failed:
            failed.append(version)
            raise gf.GearFlowError("placement lookup failed (injected)")
        return await real(version)

    t._link.refresh = refresh
    t._view.learn(dict(coordinator(t).lookup(), version=-1))


@pytest.mark.parametrize("kind", ["queue", "uniform_once"])
def test_an_admission_whose_placement_lookup_fails_is_given_back(kind):
    """A sample and an insert are granted, and the handle's lookup of the placement that follows fails: the
    call fails with that error and its admission is given back.  Otherwise the sample's exclusive hold, or
    the room the insert was admitted for, would stay taken until the handle goes: the next sample would
    wait for the hold, and the next insert into the full queue for room."""
    with own_cluster({"gear-flow.distributed.shared-memory": True}, n=1) as client:
        spec = gf.TableSpec(TAG, capacity=64, num_shards=1)
        if kind == "queue":
            t = DistributedTable.queue(client, spec, 2, timeout=5, seed=0)
        else:  # weighted and exclusive (each item once): its samples are admitted in the caller's thread
            t = DistributedTable.create(client, spec, sampler=gf.Uniform(), max_times_sampled=1, timeout=5, seed=0)
        try:
            t.insert(tagged([1, 2]))
            if kind != "queue":
                t.insert(tagged([3]))
                assert t.sample(1)["tag"].numpy().size == 1  # masses and lanes learnt: the thread path next
            _refresh_fails_once(t)
            with pytest.raises(gf.GearFlowError, match="injected"):
                t.sample(2)
            if kind == "queue":  # not left waiting for a hold; both items still there, in order
                assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [1, 2]
            else:  # one of the two items left: not left waiting for a hold either
                assert t.sample(1)["tag"].numpy()[0, 0] in (1, 2, 3)
            left = 0 if kind == "queue" else 1
            info = t.info()
            assert info["size"] == info["coordinator_size"] == left, info
            _refresh_fails_once(t)
            with pytest.raises(gf.GearFlowError, match="injected"):
                t.insert(tagged([4, 5]))
            t.insert(tagged([6, 7]))  # a full queue: only with the failed insert's room given back
            info = t.info()
            assert info["size"] == info["coordinator_size"] == left + 2, info
            if kind == "queue":
                assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [6, 7]
        finally:
            t.close()


@pytest.mark.parametrize("op", ["apply", "write"])
@pytest.mark.parametrize("late", [True, False], ids=["written-late", "aborted-first"])
def test_an_insert_part_a_live_worker_does_not_answer_in_time_is_settled_by_the_coordinator(op, late):
    """A live worker holds its part of an insert (``apply`` of a two-worker insert; ``write`` of a
    one-worker one) past the reply timeout.  The insert fails saying that part is not known yet, and the
    coordinator settles it: written before its abort arrived (``written-late``: the worker also holds the
    coordinator's abort until its write is done) it is counted; else the abort comes first and the write,
    delivered later, is refused.  Either way the coordinator agrees with the workers, item by item."""
    cfg = {"gear-flow.distributed.rpc-timeout": 2, "gear-flow.distributed.rpc-retries": 0}
    n = 2 if op == "apply" else 1
    with own_cluster(cfg, n=n) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=n), seed=0)
        try:
            for s in range(n):
                t.insert(tagged([s + 1]), shard=s)
            tags = [10, 11] if n == 2 else [10]
            assert writes.route(t, np.ones(len(tags), np.int64), None).tolist() == list(range(n))  # one per shard
            slow = t.placement[n - 1]
            client.run(_hold_each, [op, "abort"] if late else [op], workers=[slow])
            with pytest.raises(gf.GearFlowError, match=f"worker {slow} did not answer.*not known yet"):
                t.insert(tagged(tags))

            def unsettled():
                return t.info()["unsettled_inserts"]

            assert unsettled() == 1 or not late
            if late:  # the write goes first, then the coordinator's abort finds it written
                client.run(_release_op, op, workers=[slow])
                wait_for(lambda: t.info()["size"] == n + len(tags), "the held part written", 30)
                client.run(_release_op, "abort", workers=[slow])
                wait_for(lambda: unsettled() == 0, "the part settled", 30)
                stored = list(range(1, n + 1)) + tags
            else:  # the coordinator's abort goes first; the write that comes after is refused
                wait_for(lambda: unsettled() == 0, "the part settled", 30)
                client.run(_release_op, op, workers=[slow])
                stored = list(range(1, n + 1)) + tags[:-1]
            info = t.info()
            assert info["size"] == info["coordinator_size"] == len(stored), info
            assert info["rate_limiter"]["inserts"] == len(stored), info
            assert sorted(set(t.sample(64)["tag"].numpy()[:, 0].tolist())) == stored
            t.insert(tagged([99]), shard=n - 1)  # the slow worker's shard takes writes again
            info = t.info()
            assert info["size"] == info["coordinator_size"] == len(stored) + 1, info
        finally:
            t.close()


def _refuse_first(op, dask_worker=None):
    """This worker answers its next ``op`` request with an error, without running it (a request that did not
    reach it); later ones are served."""
    from gear_flow.errors import GearFlowError

    plugin = dask_worker.plugins[PLUGIN_NAME]
    plugin.refused = []

    def wrapped(real):
        async def serve(action, *args):
            if action == op and not plugin.refused:
                plugin.refused.append(action)
                return False, GearFlowError(f"{op} did not arrive (injected)")
            return await real(action, *args)

        return serve

    plugin.lane._serve, plugin.serve = wrapped(plugin.lane._serve), wrapped(plugin.serve)


def _staged_here(name, dask_worker=None):
    return len(dask_worker.plugins[PLUGIN_NAME].host.tables[name].staged)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-memory", "tcp-lane"])
@pytest.mark.parametrize("op", ["stage", "apply"])
def test_a_staged_part_the_clients_abort_does_not_reach_is_aborted_by_the_coordinator(shared, op):
    """An insert of one episode per shard.  ``stage``: worker 0 refuses to stage its part, so the insert is
    aborted, and the client's abort does not reach worker 1, which staged its part.  ``apply``: worker 1
    refuses to apply its part (the rest is stored and committed), and the client's abort of that part
    does not reach it.  Either way the client names worker 1 to the coordinator, which aborts the part
    there: nothing stays staged (a part left staged would keep its episodes in the worker's memory for
    good), and the table goes on, its counts agreed."""
    with own_cluster({"gear-flow.distributed.shared-memory": shared}) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), seed=0)
        try:
            t.insert(tagged([1]), shard=0)
            t.insert(tagged([2]), shard=1)
            assert writes.route(t, np.ones(2, np.int64), None).tolist() == [0, 1]  # the next insert: one per shard
            w0, w1 = t.placement[0], t.placement[1]
            client.run(_refuse, op, workers=[w0 if op == "stage" else w1])
            client.run(_refuse_first, "abort", workers=[w1])
            with pytest.raises(gf.GearFlowError, match=f"{op} refused"):
                t.insert(tagged([3, 4]))
            wait_for(lambda: client.run(_staged_here, t.name, workers=[w1])[w1] == 0, "the staged part aborted", 30)
            assert client.run(lambda dask_worker: dask_worker.plugins[PLUGIN_NAME].refused, workers=[w1])[w1] == [
                "abort"
            ]  # the client's abort was the one that did not arrive
            stored = [1, 2] if op == "stage" else [1, 2, 3]
            info = t.info()
            assert info["size"] == info["coordinator_size"] == len(stored), info
            assert info["rate_limiter"]["inserts"] == len(stored), info
            t.insert(tagged([5]), shard=0)
            assert sorted(set(t.sample(64)["tag"].numpy()[:, 0].tolist())) == stored + [5]
        finally:
            t.close()


@pytest.mark.parametrize("shared", [True, False], ids=["shared-memory", "tcp-lane"])
def test_a_waiting_update_a_live_worker_does_not_answer_in_time_fails_once(shared):
    """A waiting update sent from the caller's thread whose reply does not come within the reply timeout
    (the worker, alive, holds it): the update fails saying so after that one wait, as on the event loop's
    path, rather than being sent again to wait as long once more; the next update goes from the thread."""
    import time

    from gear_flow.keys import decode

    cfg = {"gear-flow.distributed.rpc-timeout": 2, "gear-flow.distributed.rpc-retries": 0,
           "gear-flow.distributed.shared-memory": shared}  # fmt: skip
    with own_cluster(cfg) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), sampler=gf.Prioritized(),
                                    seed=0)  # fmt: skip
        try:
            t.insert(tagged([1]), shard=0)
            t.insert(tagged([2]), shard=1)
            keys = np.unique(t.sample(32).keys.numpy())  # the lanes learnt, the masses kept
            assert set(decode(keys)[0].tolist()) == {0, 1}
            slow = t.placement[1]
            client.run(_hold_each, ["update"], workers=[slow])
            here = t.stats["updates_in_thread"]
            t0 = time.monotonic()
            with pytest.raises(gf.GearFlowError, match=f"worker {slow} did not answer 'update' within 2 s"):
                t.update_priorities(keys, 5.0)
            assert time.monotonic() - t0 < 4  # one wait of 2 s
            client.run(_release_op, "update", workers=[slow])
            r = t.update_priorities(keys, 7.0)
            assert (r.applied, r.stale) == (2, 0) and t.stats["updates_in_thread"] == here + 1
        finally:
            t.close()


def test_a_request_to_a_worker_that_died_fails_once_the_scheduler_knows_not_at_the_connect_timeout():
    """A request to a worker killed meanwhile waited out Dask's connect timeout (30 s by default, retrying the
    refused connection) before ShardLostError, though the scheduler removed the worker within a second.  The
    request asks the coordinator about its worker once early (transport.EARLY_PROBE_S) and fails as soon as
    the worker is gone."""
    import os
    import time

    from dist_support import kill
    from helpers import make_spec

    from gear_flow.distributed.transport import WorkerLost, call

    with own_cluster({"distributed.comm.timeouts.connect": "30s"}) as client:
        t = DistributedTable.create(client, make_spec(capacity=50, num_shards=2), seed=0)
        victim = t.placement[1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        kill(pid)
        wait_for(lambda: victim not in client.scheduler_info()["workers"], "the scheduler removed the worker")
        start = time.monotonic()
        with dask.config.set({"distributed.comm.timeouts.connect": "30s"}):
            with pytest.raises(WorkerLost):
                t._ctx.sync(call, t._ctx, victim, "info", table=t.name, name=t.name)
        assert time.monotonic() - start < 10
