"""An actor's insert into its own worker's shards runs in the actor's thread.

A task on a shard's worker inserting into that worker's shards needs neither
the worker's event loop nor the plugin's threads: admission and commit go to
the coordinator over its lane on a blocking socket, and the task's thread
writes the rings.  Everything else an insert can meet (the rate limiter's
wait and timeout, a shard refusing the episodes, a lane that cannot be
reached, a reply lost after the coordinator acted) must end as on the event
loop's path: nothing partially applied, nothing counted twice.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from dist_support import assert_same, handed, snapshot
from helpers import COLUMNS, episode

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.coordinator import COORDINATOR_NAME

pytestmark = pytest.mark.timeout(120)

X = (gf.ColumnSpec("x", (), np.float32),)


def _served(dask_scheduler):
    return dask_scheduler.plugins[COORDINATOR_NAME].lane.served


def xs(values):
    return [{"x": np.array([float(v)], np.float32)} for v in values]


def _insert_here(name, tags, length):
    """A task: insert one episode per tag into this worker's shards, one call each; what the handle did."""
    from distributed import get_worker
    from helpers import episode

    from gear_flow.distributed.plugin import PLUGIN_NAME

    t = DistributedTable.attach(name)
    plugin = get_worker().plugins[PLUGIN_NAME]  # this worker's gear_flow plugin
    ran = dict(plugin.ran)
    results = [t.insert([episode(k, length)]) for k in tags]
    return {
        "ids": [int(r.episode_ids[0]) for r in results],
        "keys": [int(r.first_keys[0]) for r in results],
        "shards": [int(r.shards[0]) for r in results],
        "insert_in_thread": t.stats["insert_in_thread"],
        "insert_local_bytes": t.stats["insert_local_bytes"],
        "plugin_ran": {k: plugin.ran[k] - ran[k] for k in ran},
        "local_shards": t.local_shards,
    }


def test_an_actor_insert_into_its_own_shards_runs_in_its_thread(dist_client):
    t = DistributedTable.create(dist_client, gf.TableSpec(COLUMNS, capacity=500, num_shards=2), seed=0)
    try:
        worker = t.placement[1]
        before = dist_client.run_on_scheduler(_served)
        tags, length = [3, 4, 5, 6], 30
        got = dist_client.submit(_insert_here, t.name, tags, length, workers=[worker], pure=False).result()
        assert got["local_shards"] == [1] and got["shards"] == [1, 1, 1, 1], got
        assert got["insert_in_thread"] == len(tags), got  # every insert, the first included
        assert got["plugin_ran"] == {"loop": 0, "pool": 0}, got  # the write never went through the plugin
        # over the coordinator's lane: the handle's lookup as it attaches, then per insert its admission and
        # its commit; nothing else
        assert dist_client.run_on_scheduler(_served) - before == 1 + 2 * len(tags)
        assert got["insert_local_bytes"] == sum(a.nbytes for k in tags for a in episode(k, length).values())
        assert got["ids"] == list(range(got["ids"][0], got["ids"][0] + len(tags)))  # one admission each, in order
        assert got["keys"] == sorted(set(got["keys"]))
        info = t.info()
        assert info["size"] == info["coordinator_size"] == len(tags) * length
        b = t.sample(200, 1)
        obs = b["obs"].numpy()[:, 0]
        tag, step = obs[:, 0].astype(np.int64), obs[:, 1].astype(np.int64)
        assert set(tag.tolist()) <= set(tags) and np.array_equal(obs[:, 2], 1000 * tag + step)
        assert np.array_equal(b["ep"].numpy()[:, 0], tag) and np.array_equal(b["t"].numpy()[:, 0], step)
        assert np.array_equal(b.episode_ids, np.array(got["ids"])[tag - tags[0]])
    finally:
        t.close()


def _insert_or_error(name, values, shard, timeout=None):
    t = DistributedTable.attach(name)
    try:
        t.insert(xs(values), shard=shard, timeout=timeout)
    except gf.GearFlowError as e:
        return type(e).__name__, str(e), t.stats["insert_in_thread"]
    return None, None, t.stats["insert_in_thread"]


def test_an_actor_insert_its_shard_refuses_changes_nothing(dist_client):
    t = DistributedTable.queue(dist_client, gf.TableSpec(X, capacity=4, num_shards=2), 16, timeout=5)
    try:
        worker = t.placement[0]
        run = dist_client.submit(_insert_or_error, t.name, [0, 1, 2], 0, workers=[worker], pure=False).result()
        assert run == (None, None, 1)
        before = snapshot(t)
        kind, msg, in_thread = dist_client.submit(
            _insert_or_error, t.name, [3, 4, 5], 0, workers=[worker], pure=False
        ).result()
        assert kind == "CapacityError" and "never handed out" in msg and "\n" not in msg, msg
        assert in_thread == 0  # refused by the shard in the actor's thread: the admission given back
        assert_same(before, snapshot(t))
        assert t.sample(3)["x"].numpy()[:, 0].tolist() == [0.0, 1.0, 2.0]
        assert dist_client.submit(_insert_or_error, t.name, [6], 0, workers=[worker], pure=False).result() == (
            None,
            None,
            1,
        )
        assert t.info()["coordinator_size"] == 1
    finally:
        t.close()


def test_an_actor_insert_waits_for_the_rate_limiter_and_times_out_in_its_thread(dist_client):
    t = DistributedTable.queue(dist_client, gf.TableSpec(X, capacity=64, num_shards=2), 2, timeout=5)
    try:
        worker = t.placement[0]
        assert dist_client.submit(_insert_or_error, t.name, [0, 1], 0, workers=[worker], pure=False).result()[0] is None
        before = snapshot(t)
        kind, msg, in_thread = dist_client.submit(
            _insert_or_error, t.name, [2], 0, 0.3, workers=[worker], pure=False
        ).result()
        assert kind == "RateLimitTimeout" and "within 0.3 s" in msg, msg
        assert_same(before, snapshot(t))
        # a waiting actor is admitted as soon as a learner makes room, then writes in its thread
        waiting = dist_client.submit(_insert_or_error, t.name, [2], 0, 30, workers=[worker], pure=False)
        assert t.sample(1)["x"].numpy()[0, 0] == 0.0
        assert waiting.result() == (None, None, 1)
        assert [t.sample(1)["x"].numpy()[0, 0] for _ in range(2)] == [1.0, 2.0]
    finally:
        t.close()


def test_an_unreachable_coordinator_lane_sends_the_actors_requests_over_the_comm(dist_client):
    t = DistributedTable.create(dist_client, gf.TableSpec(X, capacity=64, num_shards=2), seed=0)
    try:

        def vanish_then_insert(name):
            h, ctx = handed(name, worker=True)  # attached in this task, on a context the test holds
            h.insert(xs([0]))

            async def vanish():  # as if the scheduler's lane socket were gone
                f = asyncio.get_running_loop().create_future()
                f.set_result("/nonexistent/gear-flow-lane")
                # the context's found lane replaced by one nothing listens on: no public member plants a lane
                # (drop_coord_lane would spare the handle finding out that it is unreachable, which is what is
                # tested), so this writes the attribute of the test's own Context, not the handle's
                ctx._coord_lane = f

            ctx.sync(vanish)
            h.insert(xs([1]))  # the admission finds the lane unreachable (nothing sent): the comm serves it
            h.insert(xs([2]))
            return h.stats["insert_in_thread"], ctx.found_coord_lane(), ctx.sync(ctx.coord_lane)

        before = dist_client.run_on_scheduler(_served)
        in_thread, found, lane = dist_client.submit(
            vanish_then_insert, t.name, workers=[t.placement[0]], pure=False
        ).result()
        assert (found, lane) == (None, None)  # dropped for good
        # the second insert still wrote in its thread, its admission and commit over the comm; the third took
        # the event loop's path (no lane left)
        assert in_thread == 2
        assert dist_client.run_on_scheduler(_served) - before == 3  # the lookup at attach, the first insert
        assert len(t) == 3 and sorted(t.sample(3, 1)["x"].numpy()[:, 0].tolist())[-1] <= 2.0
    finally:
        t.close()


def test_a_commit_whose_reply_is_lost_is_not_sent_again(dist_client):
    """The coordinator committed the insert, its reply never came: the actor's insert fails, the items are
    counted once, and the handle's next requests go over the comm."""
    t = DistributedTable.create(dist_client, gf.TableSpec(X, capacity=64, num_shards=2), seed=0)

    def break_after(dask_scheduler, op, nth):
        plugin = dask_scheduler.plugins[COORDINATOR_NAME]
        real = plugin.lane._serve
        plugin.broke_after = []
        seen = []

        async def serve(action, args, v):
            reply = await real(action, args, v)
            if action != op:
                return reply
            seen.append(action)
            if len(seen) < nth:
                return reply
            plugin.broke_after.append((action, reply[0]))
            plugin.lane._serve = real
            raise ConnectionResetError("the connection broke before the reply")

        plugin.lane._serve = serve

    def insert_twice(name):
        h, ctx = handed(name, worker=True)  # attached in this task, on a context the test holds
        h.insert(xs([0]))
        try:
            h.insert(xs([1]))
        except gf.CoordinatorLostError as e:
            err = str(e)
        else:
            err = None
        h.insert(xs([2]))
        return err, h.stats["insert_in_thread"], ctx.found_coord_lane()

    try:
        dist_client.run_on_scheduler(break_after, op="commit_insert", nth=2)  # the second insert's commit
        err, in_thread, lane = dist_client.submit(insert_twice, t.name, workers=[t.placement[0]], pure=False).result()
        assert err is not None and "broke during 'commit_insert'" in err, err
        assert dist_client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.plugins[COORDINATOR_NAME].broke_after
        ) == [("commit_insert", True)]
        assert lane is None and in_thread == 1  # the first insert; the third took the event loop's path
        info = t.info()
        assert info["size"] == info["coordinator_size"] == 3  # the broken commit counted once
        assert set(t.sample(64, 1)["x"].numpy()[:, 0].tolist()) == {0.0, 1.0, 2.0}
    finally:
        t.close()
