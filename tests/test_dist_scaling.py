"""Tables survive Dask's own scaling: retiring, adaptive and added workers move whole shards instead of losing them.

Every test runs a real ``LocalCluster`` of worker processes and retires,
adds or kills workers the way Dask does (``Client.retire_workers``,
``Adaptive``, ``SpecCluster.scale``, ``Worker.close_gracefully``), while
writer, sampler and consumer threads run on their own handles.  What each
worker holds is read from the shards themselves (``client.run``), so "nothing
lost" is checked on the data, not on what a handle believes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import dask
import numpy as np
import pytest
from dist_support import DIAL, context, coordinator, own_cluster, wait_for
from helpers import chi2_critical, shard_state
from processes import workers_of

import gear_flow as gf
from gear_flow import cli
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.transport import call

pytestmark = pytest.mark.timeout(240)

TAG = (gf.ColumnSpec("tag", (), np.int64),)
PLANES = ["shared-memory", "tcp-lane", "comm"]


def plane(name: str) -> dict:
    return {
        "gear-flow.distributed.shared-memory": name == "shared-memory",
        "gear-flow.distributed.tcp-lane": name == "tcp-lane",
    }


def tagged(tags):
    return [{"tag": np.array([t], np.int64)} for t in tags]


def _tags_on(name, dask_worker=None):
    """``{shard: tags of its live items}`` of this worker's shards, read from the shards themselves."""
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    out = {}
    for i, s in (t.shards if t is not None else {}).items():
        with s.lock:
            out[i] = s.ring.columns["tag"][s.active == 1].tolist()
    return out


def all_tags(client, t) -> list[int]:
    """Every live tag on every worker, from the shards (a shard on two workers would show its tags twice)."""
    return [x for per in client.run(_tags_on, t.name).values() for tags in per.values() for x in tags]


def _states(name, dask_worker=None):
    """``{shard: everything a move must carry}`` of this worker's shards: rings, flags, priorities, trees,
    the episode index, stamps, times sampled, counters."""
    import dataclasses

    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    out = {}
    for i, s in (t.shards if t is not None else {}).items():
        with s.lock:
            idx = s.index
            out[i] = {
                "state": shard_state(s),
                "touched": s.touched.copy(),
                "times_sampled": None if s.times_sampled is None else s.times_sampled.copy(),
                "step_episode": None if s.step_episode is None else s.step_episode.copy(),
                "index": ({k: v[idx.first : idx.next].copy() for k, v in idx.arrays.items()}, idx.next - idx.first),
                "counters": dataclasses.asdict(s.counters)
                if dataclasses.is_dataclass(s.counters)
                else vars(s.counters).copy(),
                "size": s.size,
            }
    return out


def same(x, y) -> bool:
    """Deep equality of nested tuples, dicts and arrays."""
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (tuple, list)):
        return isinstance(y, (tuple, list)) and len(x) == len(y) and all(same(a, b) for a, b in zip(x, y))
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.array_equal(np.asarray(x), np.asarray(y))
    return x == y


def lookup(t) -> dict:
    return coordinator(t).lookup()


class Traffic:
    """Writer and sampler (learner) threads, each on its own handle of table ``name``: every tag is inserted
    once, ``per_insert`` at a time; samplers draw ``read`` rows and, learning, write priorities back (waited
    for, or riding along).  Every error is kept; the run stops on :meth:`stop`."""

    def __init__(self, client, name, writers=2, samplers=2, per_insert=2, read=16, learn=True, consume=False):
        self.client, self.name = client, name
        self.stop_flag = threading.Event()
        self.stop_writing = threading.Event()  # the writers only (consumers go on draining)
        self.lock = threading.Lock()
        self.ok: list[int] = []
        self.got: list[int] = []
        self.errors: list[tuple[str, str]] = []
        self.samples = 0
        self.next_tag = iter(range(10**6))
        self.per_insert, self.read, self.learn, self.consume = per_insert, read, learn, consume
        self.threads = [threading.Thread(target=self.write, daemon=True) for _ in range(writers)]
        self.threads += [threading.Thread(target=self.sample, args=(i,), daemon=True) for i in range(samplers)]
        for th in self.threads:
            th.start()

    def tags(self):
        with self.lock:
            return [next(self.next_tag) for _ in range(self.per_insert)]

    def write(self):
        t = DistributedTable.attach(self.name, self.client)
        while not self.stop_flag.is_set() and not self.stop_writing.is_set():
            tags = self.tags()
            try:
                t.insert(tagged(tags), timeout=30)
            except Exception as e:  # noqa: BLE001 - kept, the test fails on it
                with self.lock:
                    self.errors.append(("insert", repr(e)))
                return
            with self.lock:
                self.ok.extend(tags)

    def sample(self, i):
        t = DistributedTable.attach(self.name, self.client)
        while not self.stop_flag.is_set():
            try:
                b = t.sample(self.read, timeout=1 if self.consume else 30)
                if self.learn:
                    t.update_priorities(b.keys, np.random.default_rng(i).uniform(0.5, 2.0, len(b.keys)), wait=i == 0)
            except gf.RateLimitTimeout:
                if self.consume:  # an empty queue for a second: asked again
                    continue
                with self.lock:
                    self.errors.append(("sample", "timed out"))
                return
            except Exception as e:  # noqa: BLE001 - kept, the test fails on it
                with self.lock:
                    self.errors.append(("sample", repr(e)))
                return
            with self.lock:
                self.samples += 1
                if self.consume:
                    self.got.extend(b["tag"].numpy()[:, 0].tolist())
        if self.learn:
            t.flush()

    def wait_for(self, inserted: int, samples: int):
        wait_for(lambda: (len(self.ok) >= inserted and self.samples >= samples) or self.errors, "traffic")

    def stop(self):
        self.stop_flag.set()
        for th in self.threads:
            th.join(60)
        assert not any(th.is_alive() for th in self.threads)


@pytest.mark.parametrize("data_plane", PLANES)
def test_retiring_a_shard_holder_under_writers_and_samplers_moves_its_shard(data_plane):
    """``client.retire_workers`` on the worker of shard 0 while 2 writers insert and 2 learners sample and
    write priorities back: the worker leaves, its shard lives on another worker, no call fails, and the
    table holds exactly the tags reported inserted, each once (size = inserted - evicted, nothing evicted)."""
    with own_cluster(plane(data_plane), n=3) as client:
        t = DistributedTable.create(
            client, gf.TableSpec(TAG, capacity=50_000, num_shards=3), sampler=gf.Prioritized(0.8, 0.4)
        )
        t.insert(tagged(range(-300, 0)))
        load = Traffic(client, t.name)
        load.wait_for(100, 20)
        holder = t.placement[0]
        retired = client.retire_workers(workers=[holder])
        assert list(retired) == [holder]
        n = len(load.ok)
        load.wait_for(n + 100, load.samples + 20)  # and they go on after it
        load.stop()
        assert not load.errors, load.errors
        assert holder not in workers_of(client)
        st = lookup(t)
        assert st["lost"] == {} and holder not in st["placement"].values()
        tags = all_tags(client, t)
        assert len(tags) == len(set(tags)) and set(tags) == set(load.ok) | set(range(-300, 0))
        info = t.info()
        assert (
            info["size"]
            == info["coordinator_size"]
            == len(tags)
            == info["totals"]["inserted"] - info["totals"]["evicted"]
        )
        t.sample(64)
        t.close()


def test_retiring_a_shard_holder_with_an_empty_worker_moves_the_shard_to_a_worker_that_stays():
    """``retire_workers`` of the worker holding a shard and of a worker holding none (as ``adapt`` retires a
    fresh worker with a holder): the shard goes to the worker that stays, never to the other one leaving;
    it went to the empty worker, which then left with it (the shard lost)."""
    with own_cluster(n=3) as client:
        ws = sorted(workers_of(client))
        holder, empty, stays = ws[-1], ws[0], ws[1]
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=100, num_shards=1), workers=[holder])
        t.insert(tagged(range(10)))
        assert set(client.retire_workers(workers=[holder, empty])) == {holder, empty}
        info = t.info()
        assert t.placement == {0: stays} and not info["lost"] and info["size"] == 10, info
        assert sorted(client.run(_tags_on, t.name, workers=[stays])[stays][0]) == list(range(10))
        assert len(t.sample(16)) == 16
        t.close()


def test_a_closed_tables_kept_shards_keep_their_worker_from_retiring():
    """A table closed but not dropped keeps its data on its workers; retire_workers of its worker retired it
    at once (its shards counted as none, moves of a closed table being refused), and the shards were lost:
    size 40, then 0.  The worker stays, with a line saying why, and the data with it."""
    with own_cluster(n=2) as client:
        ws = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=100, num_shards=2), workers=[ws[0]])
        t.insert(tagged(range(40)))
        t.close(drop=False)
        assert client.retire_workers(workers=[ws[0]]) == {}
        assert ws[0] in workers_of(client)
        h = DistributedTable.attach(t.name, client=client)
        info = h.info()
        assert info["size"] == 40 and not info["lost"], info
        h.close()


@pytest.mark.parametrize("edit", ["update", "delete"])
def test_an_edit_from_a_handle_that_has_not_seen_its_keys_follows_a_shard_moved_meanwhile(edit):
    """Keys on two workers, edited (waited) by a handle that has not seen them issued, right after another
    handle moved one of their shards: the keys are checked and applied where the shard is now.  The moved
    worker's keys were sent back to it with the placement learnt since, and it refused them as not its
    shard's (SpecError)."""
    with own_cluster(n=3) as client:
        ws = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=100, num_shards=2), sampler=gf.Prioritized(), workers=ws[:2])  # fmt: skip
        r = t.insert([{"tag": np.arange(5)}, {"tag": np.arange(5, 10)}])
        keys = np.concatenate([fk + np.arange(5) for fk in r.first_keys])  # 5 keys on each shard
        assert sorted(r.shards.tolist()) == [0, 1]
        h = DistributedTable.attach(t.name, client)
        t.move_shards([0], ws[2])
        res = h.delete(keys) if edit == "delete" else h.update_priorities(keys, np.full(len(keys), 2.0))
        assert (res.applied, res.stale) == (10, 0)
        assert t.info()["size"] == (0 if edit == "delete" else 10)
        t.close()


def _priorities_on(name, dask_worker=None):
    """``{tag: priority}`` of this worker's live items, read from its shards."""
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    out = {}
    for s in (t.shards if t is not None else {}).values():
        with s.lock:
            live = s.active == 1
            out.update(zip(s.ring.columns["tag"][live].tolist(), s.priority[live].tolist()))
    return out


def test_updates_stored_before_another_handle_moved_their_shard_are_applied_in_order(dist_client):
    """A learner stores updates to ride on its next sample (``wait=False``); another handle moves one of their
    shards.  Its flush sent them to the old worker, which refused them as planned before the move, and returned
    with them still stored; and its next waited update, sent after them (to keep call order) and grouped
    before it learnt the move from that refusal, went out as planned at the new placement, so the old worker
    answered that the shard was not there (SpecError).  Stored updates are now sent again where their shards
    are, and an edit's requests say the placement it was grouped at: both apply, the later value last."""
    ws = sorted(workers_of(dist_client))
    t = DistributedTable.create(dist_client, gf.TableSpec(TAG, capacity=100, num_shards=2), sampler=gf.Prioritized(1.0, 0.0), workers=ws, seed=0)  # fmt: skip
    try:
        t.insert([{"tag": np.arange(50)}, {"tag": np.arange(50, 100)}])
        home = t.placement[0]
        learner = DistributedTable.attach(t.name, dist_client, seed=0)
        b = learner.sample(256)
        keys, first = np.unique(b.keys.numpy(), return_index=True)
        tags = b["tag"].numpy()[first, 0]
        assert {int(s) for s in keys >> 56} == {0, 1}

        def priorities():
            got = {}
            for per in dist_client.run(_priorities_on, t.name).values():
                got.update(per)
            return np.array([got[x] for x in tags])

        assert learner.update_priorities(keys, 7.0, wait=False) is None  # stored: rides on the next sample
        t.move_shards([0], next(w for w in ws if w != home))
        learner.flush()
        assert (priorities() == 7.0).all()  # every stored update applied, the moved shard's included

        b = learner.sample(256)  # (this handle's record of the keys it saw issued began again with the move)
        keys, first = np.unique(b.keys.numpy(), return_index=True)
        tags = b["tag"].numpy()[first, 0]
        assert learner.update_priorities(keys, 5.0, wait=False) is None
        t.move_shards([0], home)  # and back
        res = learner.update_priorities(keys, 9.0)  # sent after the stored ones, each where its shard is now
        assert (res.applied, res.stale) == (len(keys), 0)
        learner.flush()
        assert (priorities() == 9.0).all()  # the later value last, on both shards
        assert learner.info()["size"] == 100
    finally:
        t.close()


def test_placement_arguments_that_name_no_worker_or_shard_are_refused_at_once(dist_client, tmp_path):
    """create and restore took a bare address for a list of workers (each character an address: a raw
    ValueError), an address that is no worker (a minute's wait, then ShardLostError 'shard -1 is lost') and
    an empty list (ZeroDivisionError); move_shards took True for shard 1 (and moved it) and '1' for ['1'];
    restore_shard took True for shard 1 and reported shard 7 of 2 as missing from the checkpoint.  Each is
    now a SpecError at the call, nothing placed, moved or restored."""
    ws = sorted(workers_of(dist_client))
    spec = gf.TableSpec(TAG, capacity=100, num_shards=2)
    hosted = dist_client.run(_tables_here)  # (the suite's cluster: other tests' tables may be there)
    t = DistributedTable.create(dist_client, spec, workers=ws, seed=0)
    try:
        t.insert([{"tag": np.arange(10)}, {"tag": np.arange(10, 20)}])
        ck = t.checkpoint(tmp_path / "ck")["path"]
        placed = dict(t.placement)
        for bad, match in (
            ([True], "shard True"),
            ("1", "iterable of shard ids"),
            ([-1], "shard -1"),
            ([2.0], "shard 2.0"),
        ):
            with pytest.raises(gf.SpecError, match=match):
                t.move_shards(bad, ws[0])
        for shard in (True, 7):
            with pytest.raises(gf.SpecError, match=f"shard {shard} must be in"):
                t.restore_shard(shard, ck, replace=True)
        assert t.placement == placed and t.info()["size"] == 20 and t.info()["lost"] == {}
    finally:
        t.close()
    for workers, match in (
        (ws[0], "must be a list of worker addresses"),
        (["tcp://127.0.0.1:1"], "is not a worker of this cluster"),
        ([None], "None is not a worker"),
        ([], "no worker to place shards on"),
    ):
        with pytest.raises(gf.SpecError, match=match):
            DistributedTable.create(dist_client, spec, workers=workers)
        with pytest.raises(gf.SpecError, match=match):
            DistributedTable.restore(dist_client, ck, workers=workers)
    assert dist_client.run(_tables_here) == hosted  # nothing left on any worker


def _tables_here(dask_worker=None):
    plugin = dask_worker.plugins.get("gear-flow")  # (none before a first table)
    return [] if plugin is None else sorted(plugin.host.tables)


def test_fresh_handles_sample_a_table_whose_shard_keeps_moving():
    """A ``max_times_sampled`` table (its samples ask the owners) whose shard moves every 0.05 s, sampled by 100
    fresh handles: each first sample probes the workers' layouts, and a probe refused by a worker that is
    moving the shard is asked again next time, the sample redone as placed now.  The refusal reached the
    caller (ShardMovedError, 13 samples in 200)."""
    with own_cluster(n=3) as client:
        ws = sorted(workers_of(client))
        spec = gf.TableSpec(TAG, capacity=10_000, num_shards=2)
        t = DistributedTable.create(client, spec, workers=ws[:2], max_times_sampled=3)
        t.insert([{"tag": np.arange(1000)} for _ in range(8)])
        stop, moves = threading.Event(), []

        def move():
            m = DistributedTable.attach(t.name, client)
            while not stop.is_set():
                m.move_shards([0], next(w for w in ws if w not in m.placement.values()))
                moves.append(1)
                stop.wait(0.05)  # (the pace of the moves, not a barrier)

        th = threading.Thread(target=move)
        th.start()
        try:
            for _ in range(100):
                h = DistributedTable.attach(t.name, client)
                assert len(h.sample(4)) == 4
        finally:
            stop.set()
            th.join(60)
        assert len(moves) > 5
        t.close()


def test_deletes_racing_scale_downs_apply_every_key_of_a_live_item():
    """One-step items deleted one key at a time, each once, while the cluster scales down (its worker's shard
    moved first, then the worker gone) and up again, over the comm: every delete applies.  A delete sent to a
    worker that had handed its shards over and closed was counted stale, its item left live (3 in 30,000
    over 16 scale-downs)."""
    with own_cluster({**plane("comm")}, n=3) as client:
        cluster = client.cluster
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=20_000, num_shards=3))
        keys = t.insert(tagged(range(15_000))).first_keys.tolist()
        stop, bad, done = threading.Event(), [], []

        def delete():
            h = DistributedTable.attach(t.name, client)
            for k in keys:
                if stop.is_set():
                    return
                res = h.delete([k])
                done.append(1)
                if (res.applied, res.stale) != (1, 0):
                    bad.append((k, res))

        th = threading.Thread(target=delete)
        th.start()
        try:
            for _ in range(6):
                mark = len(done)
                wait_for(lambda: len(done) >= mark + 300, "deletes before the scale-down")  # noqa: B023
                cluster.scale(2)  # SpecCluster: retire_workers, the shard moved first
                wait_for(lambda: len(client.scheduler_info()["workers"]) == 2, "the scale-down")
                mark = len(done)
                wait_for(lambda: len(done) >= mark + 300, "deletes after it")  # noqa: B023
                cluster.scale(3)
                client.wait_for_workers(3, timeout=60)
                t.rebalance()
        finally:
            stop.set()
            th.join(120)
        assert not bad, bad[:5]
        info = t.info()
        assert not info["lost"] and info["size"] == len(keys) - len(done), info
        t.close()


def test_a_moved_shard_keeps_its_items_priorities_counters_and_keys():
    """A prioritized table with ``max_times_sampled``: the moved shard's rings, priorities, sum trees,
    episode index, times-sampled counts and stamps are the same on its new worker, and a key issued before
    the move updates its item after it."""
    with own_cluster(n=3) as client:
        spec = gf.TableSpec(TAG, capacity=1000, num_shards=2)
        t = DistributedTable.create(client, spec, sampler=gf.Prioritized(), max_times_sampled=50, workers=sorted(workers_of(client))[:2], seed=0)  # fmt: skip
        for i in range(20):
            t.insert(tagged(range(10 * i, 10 * i + 10)), priorities=np.arange(1.0, 11.0))
        b = t.sample(64)
        src = t.placement[0]
        before = client.run(_states, t.name, workers=[src])[src][0]
        dest = next(a for a in workers_of(client) if a not in t.placement.values())
        t.move_shards([0], dest)
        assert t.placement[0] == dest and lookup(t)["placement"][0] == dest
        after = client.run(_states, t.name, workers=[dest])[dest][0]
        assert before["times_sampled"].sum() > 0 and before["size"] == 100  # sampled before it moved
        for k in before:
            assert same(before[k], after[k]), k
        assert 0 not in client.run(_tags_on, t.name, workers=[src])[src]  # the source holds it no more
        for worker in (src, dest):  # a request planned at the old placement is refused by both
            with pytest.raises(gf.ShardMovedError, match="placement version"):
                t.client.sync(call, context(t), worker, "summaries", name=t.name, kinds=["size"], epoch=0)
        res = t.update_priorities(b.keys, np.full(len(b.keys), 11.5))
        assert (res.applied, res.stale) == (64, 0)
        on_0 = {k for k in b.keys.tolist() if k >> 56 == 0}
        prio = client.run(_states, t.name, workers=[dest])[dest][0]["state"][3]
        assert int((prio == 11.5).sum()) == len(on_0) > 0  # the keys issued before the move reached it
        t.close()


def test_adapt_keeps_shard_holders_by_default_and_retires_them_after_moving_their_shards_with_move():
    """``cluster.adapt(minimum=1, maximum=3)`` on an idle cluster whose three workers each hold a shard.
    With ``scale-down: keep`` (the default) every adaptive round asks ``valid_workers_downscaling`` and none
    is retired: 5 s at a 100 ms interval are 50 rounds (Dask's default interval is 1 s: 20 s are 20 rounds).
    Then with ``scale-down: move`` the cluster shrinks to one worker, every shard moved onto it first.  No
    step is lost either way, and sampling goes on."""
    import dask

    with own_cluster(n=3) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=10_000, num_shards=3))
        t.insert(tagged(range(3000)))
        adaptive = client.cluster.adapt(minimum=1, maximum=3, interval="100ms", wait_count=1)
        end = time.monotonic() + 5.0
        while time.monotonic() < end:  # watching for a retirement over 50 adaptive rounds (not a barrier)
            assert len(workers_of(client)) == 3
            time.sleep(0.1)
        assert lookup(t)["lost"] == {} and sorted(all_tags(client, t)) == list(range(3000))
        with dask.config.set({"gear-flow.distributed.scale-down": "move"}):  # read by the scheduler, here
            wait_for(lambda: len(workers_of(client)) == 1, "the cluster to shrink to one worker")
        adaptive.stop()
        (only,) = workers_of(client)
        st = lookup(t)
        assert st["lost"] == {} and set(st["placement"].values()) == {only}
        assert sorted(all_tags(client, t)) == list(range(3000))
        assert len(t.sample(100)["tag"]) == 100
        t.close()


async def _close_gracefully(dask_worker=None):
    await dask_worker.close_gracefully()


def test_close_gracefully_and_scaling_down_move_shards_first():
    """``Worker.close_gracefully`` and ``SpecCluster.scale(n)`` down (which names the workers it retires by
    their names): the shards move off before the workers close."""
    with own_cluster(n=3) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=10_000, num_shards=3), degraded=True)
        t.insert(tagged(range(900)))
        victim = t.placement[1]
        client.run(_close_gracefully, workers=[victim], wait=False)
        wait_for(lambda: victim not in workers_of(client), "the worker to close")
        assert lookup(t)["lost"] == {} and sorted(all_tags(client, t)) == list(range(900))
        client.cluster.scale(1)
        wait_for(lambda: len(workers_of(client)) == 1, "scale(1)")
        st = lookup(t)
        assert st["lost"] == {} and len(set(st["placement"].values())) == 1
        assert sorted(all_tags(client, t)) == list(range(900))
        t.insert(tagged([900]))
        assert t.info()["size"] == 901
        t.close()


def test_growing_the_cluster_and_rebalancing_keeps_prioritized_sampling_exact(capsys):
    """From 2 workers to 4, then ``gear-flow rebalance``: the 4 shards end up on 4 workers, a second table made with
    ``rebalance_on_join`` spread by itself, and a chi-square test of prioritized sampling (the probability
    of each item proportional to its priority, across shards) passes; each batch reports the probabilities
    of the draws it made."""
    with own_cluster(n=2) as client:
        spec = gf.TableSpec(TAG, capacity=1000, num_shards=4)
        t = DistributedTable.create(client, spec, sampler=gf.Prioritized(1.0, 0.0), seed=3)
        grow = DistributedTable.create(client, spec, rebalance_on_join=True)
        tags = np.arange(40)
        prios = (tags % 7 + 1).astype(np.float64)
        for s in range(4):  # ten items per shard, with priorities 1..7
            t.insert(tagged(tags[s * 10 : s * 10 + 10]), priorities=prios[s * 10 : s * 10 + 10], shard=s)
            grow.insert(tagged(tags[s * 10 : s * 10 + 10]), shard=s)
        client.cluster.scale(4)
        client.wait_for_workers(4)
        assert cli.main(["rebalance", "--scheduler", client.scheduler.address, "--table", t.name]) == 0
        out = capsys.readouterr().out
        assert out.count(" -> ") == 2 and "2 shard(s) moved" in out, out
        assert t.rebalance() == []  # this handle's placement was planned before the moves: it learns them
        assert len(set(t.placement.values())) == 4
        assert sorted(all_tags(client, t)) == tags.tolist()  # (its moves were done when the command returned)
        # grow's moves go on in the background, and each moves the placement before its source lets go of
        # the copy it holds sealed: the shards are once each on 4 workers only when the last release is done
        wait_for(
            lambda: (
                len(set(lookup(grow)["placement"].values())) == 4 and sorted(all_tags(client, grow)) == tags.tolist()
            ),
            "the joining workers to get shards, each shard on one worker",
        )
        counts = np.zeros(40)
        expected_p = prios / prios.sum()
        for _ in range(50):
            b = t.sample(200)
            got = b["tag"].numpy()[:, 0]
            np.testing.assert_allclose(b.probabilities.numpy(), expected_p[got], rtol=1e-9)
            np.add.at(counts, got, 1)
        expected = expected_p * counts.sum()
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < chi2_critical(39), chi2
        t.close()
        grow.close()


def test_a_queue_drained_by_two_consumers_while_its_shards_move_hands_out_each_item_once():
    """A queue over 2 shards; 2 producers and 2 consumers run while its shards move from worker to worker 6
    times: every item comes out exactly once, and none is left."""
    with own_cluster(n=3) as client:
        t = DistributedTable.queue(client, gf.TableSpec(TAG, capacity=100_000, num_shards=2), 64)
        load = Traffic(client, t.name, per_insert=2, read=4, learn=False, consume=True)
        load.wait_for(200, 20)
        workers = sorted(workers_of(client))
        for i in range(6):
            shard = i % 2
            dest = next(a for a in workers if a not in lookup(t)["placement"].values())
            t.move_shards([shard], dest)
            load.wait_for(len(load.ok) + 40, load.samples + 5)
        load.stop_writing.set()
        for th in load.threads[:2]:  # the producers stop first; the consumers empty the queue
            th.join(60)
        # they take 4 at a time, and a queue's sample of 4 waits for 4 items: fewer are left for this handle
        wait_for(lambda: lookup(t)["size"] < 4 or load.errors, "the consumers to drain the queue")
        load.stop()
        assert not load.errors, load.errors
        left = lookup(t)["size"]
        if left:
            load.got.extend(t.sample(left, timeout=10)["tag"].numpy()[:, 0].tolist())
        assert len(load.got) == len(set(load.got)) and set(load.got) == set(load.ok)
        assert all_tags(client, t) == [] and lookup(t)["size"] == 0
        t.close()


def _fail_once(op, name, times=1, dask_worker=None):
    """This worker's gear_flow handler fails the first ``times`` ``op`` on table ``name`` (as replies lost on
    their way: the coordinator's call raises), and runs every later one."""
    plugin = dask_worker.plugins["gear-flow"]
    real, left = plugin.run, [times]

    async def run(o, **kw):
        if o == op and kw.get("name") == name and left[0]:
            left[0] -= 1
            raise ConnectionResetError(f"{op} lost on its way")
        return await real(o, **kw)

    plugin.run = run


def _sealed_by(name, dask_worker=None):
    """The move sealing table ``name`` on this worker, or None."""
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    return None if t is None else t.gate.sealed


def test_a_release_that_fails_is_sent_again_and_the_source_serves_on_without_the_shard():
    """The source's ``move_release`` fails twice after the destination installed the shard: the coordinator
    sends it again, so the source drops its copy and unseals its part of the table (before: the copy stayed
    beside the moved shard and every operation on the source's other shard waited, both until the seal's
    lease ended, ``move-timeout`` plus two minutes later)."""
    with own_cluster(n=2) as client:
        src, dest = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=1000, num_shards=2), workers=[src])
        t.insert(tagged(range(20)))
        client.run(_fail_once, "move_release", t.name, 2, workers=[src])
        t.move_shards([1], dest)
        assert t.placement == {0: src, 1: dest}
        wait_for(lambda: client.run(_sealed_by, t.name, workers=[src])[src] is None, "the source to unseal")
        wait_for(lambda: sorted(all_tags(client, t)) == list(range(20)), "the source to drop its copy")
        assert list(client.run(_tags_on, t.name, workers=[src])[src]) == [0]
        t.insert(tagged([20, 21]), shard=0)
        assert sorted(all_tags(client, t)) == list(range(22)) and t.info()["size"] == 22
        assert len(t.sample(8)["tag"]) == 8
        t.close()


def test_a_move_off_a_source_whose_release_is_sent_again_waits_for_it():
    """Two shards moved off one worker one after the other (as ``rebalance`` does), the first one's release
    failing twice: the second move waits for that release to be answered, then goes (before: it was refused,
    the source's part of the table being sealed by the first move still)."""
    with own_cluster(n=3) as client:
        src, dest, other = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=1000, num_shards=2), workers=[src])
        t.insert(tagged(range(20)))
        client.run(_fail_once, "move_release", t.name, 2, workers=[src])
        t.move_shards([1], dest)
        t.move_shards([0], other)
        assert t.placement == {0: other, 1: dest}
        wait_for(lambda: sorted(all_tags(client, t)) == list(range(20)), "every copy let go")
        assert client.run(_tags_on, t.name, workers=[src])[src] == {}
        t.insert(tagged([20, 21]))
        assert sorted(all_tags(client, t)) == list(range(22)) and t.info()["size"] == 22
        t.close()


def test_a_thaw_that_fails_after_a_failed_move_is_sent_again_and_the_source_serves_on():
    """The destination fails to install and the source's ``move_thaw`` of the undo fails once: the move is
    refused, the coordinator sends the thaw again, and the source serves its shards again (before: every
    operation on them waited until the seal's lease ended)."""
    with own_cluster(n=2) as client:
        src, dest = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=1000, num_shards=2), workers=[src])
        t.insert(tagged(range(20)))
        client.run(_fail_once, "move_commit", t.name, workers=[dest])
        client.run(_fail_once, "move_thaw", t.name, workers=[src])
        with pytest.raises(gf.SpecError, match="not moved"):
            t.move_shards([1], dest)
        assert t.placement == {0: src, 1: src}
        wait_for(lambda: client.run(_sealed_by, t.name, workers=[src])[src] is None, "the source to unseal")
        t.insert(tagged([20, 21]))
        assert sorted(all_tags(client, t)) == list(range(22)) and t.info()["size"] == 22
        assert client.run(_tags_on, t.name, workers=[dest])[dest] == {}
        t.close()


def _slow_build(seconds, dask_worker=None):
    """This worker starts building a move's copy ``seconds`` late (as a large copy takes long), and counts the
    builds that ended (``late_ended`` on its plugin)."""
    from gear_flow.distributed import host_moves

    plugin = dask_worker.plugins["gear-flow"]
    plugin.late_ended, real = 0, host_moves.move_in

    def slow(*args, **kwargs):
        time.sleep(seconds)  # (in the plugin's thread pool: the copy being made)
        try:
            return real(*args, **kwargs)
        finally:
            plugin.late_ended += 1

    host_moves.move_in = slow


def _late_pull(seconds, dask_worker=None):
    """This worker's pulls of a move (``move_in``) begin ``seconds`` late (as a request queued behind others),
    and count those that ended (``late_ended`` on its plugin)."""
    import asyncio

    plugin = dask_worker.plugins["gear-flow"]
    plugin.late_ended, real = 0, plugin._move_in

    async def late(**kwargs):
        await asyncio.sleep(seconds)
        try:
            return await real(**kwargs)
        finally:
            plugin.late_ended += 1

    plugin._move_in = late


def _late_ended(dask_worker=None):
    return dask_worker.plugins["gear-flow"].late_ended


def _set_aside(name, dask_worker=None):
    """``({move: shards set aside}, shards hosted)`` of table ``name`` on this worker."""
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    return ({}, []) if t is None else ({m: sorted(b) for m, b in t.incoming.items()}, sorted(t.shards))


@pytest.mark.parametrize("late", [_late_pull, _slow_build], ids=["pull", "build"])
def test_a_move_given_up_while_its_destination_is_late_leaves_nothing_behind(late):
    """The coordinator gives a move up (the copy takes longer than ``move-timeout``) while the destination has
    not begun to pull the shard (``pull``) or is still building its copy (``build``): the move is refused, and
    once the destination gets to it, it keeps no copy and the source is not left sealed.  Before: a late pull
    sealed the source's part of the table for a move nobody would end (every operation there waited until the
    seal's lease ended); a late build kept the whole copy set aside for as long as the table lived."""
    with own_cluster(n=2) as client:
        src, dest = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=1000, num_shards=2), workers=[src])
        t.insert(tagged(range(20)))
        client.run(late, 3.0, workers=[dest])
        with dask.config.set({"gear-flow.distributed.move-timeout": 1}):
            with pytest.raises(gf.SpecError, match="not moved"):
                t.move_shards([1], dest)
        assert t.placement == {0: src, 1: src}
        wait_for(lambda: client.run(_late_ended, workers=[dest])[dest] == 1, "the destination to get to it")
        wait_for(lambda: client.run(_sealed_by, t.name, workers=[src])[src] is None, "the source to unseal")
        assert client.run(_set_aside, t.name, workers=[dest])[dest] == ({}, [])
        t.insert(tagged([20, 21]))
        assert sorted(all_tags(client, t)) == list(range(22)) and t.info()["size"] == 22
        t.close()


def _own_lease(seconds, dask_worker=None):
    """This worker's own ``move-timeout`` is ``seconds`` and its seals' margin none: a lease it timed itself
    would end long before the coordinator's (whose ``move-timeout`` stays 600 s)."""
    from gear_flow.distributed import host_moves

    host_moves.LEASE_MARGIN_S = 0.0
    dask.config.set({"gear-flow.distributed.move-timeout": seconds})


def test_a_source_stays_sealed_for_the_coordinators_lease_not_its_own():
    """A worker configured with a shorter ``move-timeout`` than the scheduler's seals a moving shard for the
    lease the coordinator sends: an insert that reaches it while the copy is still being built waits, is
    refused as stale once the shard has moved, and lands at the destination.  Before: the source's seal ended
    after its own 1 s, the insert was applied to the copy it was about to let go, and was lost."""
    with own_cluster(n=2) as client:
        src, dest = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=1000, num_shards=2), workers=[src])
        t.insert(tagged(range(20)))
        client.run(_own_lease, 1.0, workers=[src])
        client.run(_slow_build, 3.0, workers=[dest])
        moving = threading.Thread(target=t.move_shards, args=([1], dest))
        moving.start()
        wait_for(lambda: client.run(_sealed_by, t.name, workers=[src])[src] is not None, "the source to seal")
        t.insert(tagged(range(20, 40)))
        moving.join()
        assert t.placement == {0: src, 1: dest}
        wait_for(lambda: client.run(_sealed_by, t.name, workers=[src])[src] is None, "the source to let go")
        assert sorted(all_tags(client, t)) == list(range(40)) and t.info()["size"] == 40
        t.close()


def _kill_when(step, dask_worker=None):
    """SIGKILL this worker when it reaches ``step`` of a move: ``building`` (the source has sealed and sent
    its snapshot) or ``installing`` (built, asked to install)."""
    from gear_flow.distributed import host_moves

    plugin = dask_worker.plugins["gear-flow"]
    if step == "building":
        host_moves.move_in = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    else:
        real = plugin.run

        async def run(op, **kw):
            if op == "move_commit":
                os.kill(os.getpid(), signal.SIGKILL)
            return await real(op, **kw)

        plugin.run = run


@pytest.mark.parametrize("step", ["building", "installing"])
def test_a_move_whose_destination_is_killed_leaves_the_shard_on_its_source(step):
    """The destination is SIGKILLed in the middle of a retirement's move (the source sealed and snapshotted
    its shard): the move is undone, the shard is still on its source, which is not retired, nothing is
    lost, and the writers and samplers that waited on the sealed shard go on."""
    with own_cluster(DIAL, n=3) as client:
        workers = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=50_000, num_shards=2), workers=workers[:2])
        t.insert(tagged(range(-200, 0)))
        dest = workers[2]
        client.run(_kill_when, step, workers=[dest])
        load = Traffic(client, t.name, learn=False)
        load.wait_for(50, 10)
        src = t.placement[0]
        assert client.retire_workers(workers=[src]) == {}
        wait_for(lambda: dest not in workers_of(client), "the destination to be gone")
        load.wait_for(len(load.ok) + 50, load.samples + 10)
        load.stop()
        assert not load.errors, load.errors
        assert src in workers_of(client)
        st = lookup(t)
        assert st["placement"][0] == src and st["lost"] == {}
        tags = all_tags(client, t)
        assert len(tags) == len(set(tags)) and set(tags) == set(load.ok) | set(range(-200, 0))
        t.close()


def test_a_retirement_with_no_room_anywhere_is_refused_and_logged(caplog):
    """Shards whose rings at capacity need more memory than any other worker has (memory_limit 1 GiB, a
    shard of ~1.1 GiB): ``retire_workers`` retires nothing, the worker stays with its shard, the log and
    the ``gear-flow`` event name the table and the shard; an adaptive policy that would move them is told
    that worker may not go."""
    obs = (gf.ColumnSpec("obs", (48,), np.float32),)
    import dask
    from distributed import Client, LocalCluster

    with (
        dask.config.set({"gear-flow.distributed.scale-down": "move"}),
        LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB", host="127.0.0.1", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        t = DistributedTable.create(client, gf.TableSpec(obs, capacity=1 << 22, num_shards=2), name="big")
        t.insert([{"obs": np.ones((10, 48), np.float32)}], shard=0)
        holder = t.placement[0]
        with caplog.at_level(logging.WARNING, logger="gear_flow.distributed.moves"):
            assert client.retire_workers(workers=[holder]) == {}
        assert holder in workers_of(client)
        assert any("table 'big'" in r.getMessage() and "shard 0" in r.getMessage() for r in caplog.records), caplog.text
        events = [e for _, e in client.get_events("gear-flow") if e.get("action") == "retirement-refused"]
        assert events and "table 'big'" in events[0]["detail"]
        may_go = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers_to_close())
        assert holder not in may_go
        assert lookup(t)["placement"][0] == holder and t.info()["size"] == 10
        t.close()


def _actor(name, stop):
    """A task: insert tags 0, 1, ... one call each into this worker's own shard (the caller's thread writes
    the rings while the shard is here) until the Dask event ``stop`` is set; the tags and shards reported."""
    from distributed import Event

    t = DistributedTable.attach(name)
    shard = t.local_shards[0]
    done = Event(stop)
    out = []
    while not done.is_set():
        for _ in range(20):
            k = len(out)
            out.append((k, int(t.insert(tagged([k]), shard=shard).shards[0])))
    return out, t.stats["insert_in_thread"]


def test_an_actor_writing_into_its_own_shard_goes_on_when_the_shard_moves_away():
    """A task on shard 0's worker inserts into shard 0 in its own thread while shard 0 moves to another
    worker and back: every insert returns, on shard 0, and shard 0 holds each tag once."""
    from distributed import Event

    with own_cluster(n=3) as client:
        workers = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=50_000, num_shards=2), workers=workers[:2])
        home = t.placement[0]
        fut = client.submit(_actor, t.name, "stop-actor", workers=[home], pure=False)
        for at, dest in ((50, workers[2]), (100, home)):  # each move while the actor writes
            wait_for(lambda at=at: lookup(t)["size"] >= at, "the actor's inserts")
            t.move_shards([0], dest)
        wait_for(lambda: lookup(t)["size"] >= 150, "inserts after the moves")
        Event("stop-actor", client=client).set()
        out, in_thread = fut.result(timeout=120)
        assert in_thread > 0 and all(s == 0 for _, s in out) and len(out) >= 150
        tags = client.run(_tags_on, t.name, workers=[home])[home][0]
        assert sorted(tags) == [k for k, _ in out]
        t.close()


def _hold_move_in(flag, dask_worker=None):
    """This worker's moves in wait (in its thread pool) until file ``flag`` exists: the test lets them go."""
    from gear_flow.distributed import host_moves

    real = host_moves.move_in

    def held(*a, **k):
        while not os.path.exists(flag):  # polling the test's release, a condition it sets
            time.sleep(0.01)
        return real(*a, **k)

    host_moves.move_in = held


def _move_lock(name, dask_scheduler=None) -> tuple[bool, int]:
    """Whether table ``name``'s move lock in the coordinator is held (a move in flight), and how many wait
    for it (a retirement behind the move)."""
    plugin = next(p for p in dask_scheduler.plugins.values() if hasattr(p, "moves"))
    lock = plugin.moves._locks.get(name)
    return (lock is not None and lock.locked(), len(getattr(lock, "_waiters", None) or ()))


def test_a_worker_retired_while_a_shard_moves_to_it_keeps_no_shard(tmp_path):
    """A shard is moving to worker C when C's retirement starts (it holds a shard of its own): the shard
    arriving after the retirement planned C's evacuation was retired with C and lost. The retirement now
    marks C as leaving before it plans, and the move in flight to C is undone before it installs: every
    shard ends on a worker that stays, nothing lost."""
    flag = str(tmp_path / "go")
    with own_cluster(DIAL, n=3) as client:
        a, b, c = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=4096, num_shards=3), workers=[a, b, c])
        t.insert(tagged(range(3000)))
        client.run(_hold_move_in, flag, workers=[c])
        moving = threading.Thread(target=lambda: _ignore_refusal(lambda: t.move_shards([0], c)))
        moving.start()
        wait_for(lambda: client.run_on_scheduler(_move_lock, t.name)[0], "the move to start")
        retired = {}
        retiring = threading.Thread(target=lambda: retired.update(client.retire_workers(workers=[c])))
        retiring.start()
        wait_for(lambda: client.run_on_scheduler(_move_lock, t.name)[1] > 0, "the retirement to wait for the move")
        open(flag, "w").close()
        moving.join(120)
        retiring.join(120)
        assert c in retired and c not in workers_of(client)
        st = lookup(t)
        assert st["lost"] == {} and c not in st["placement"].values()
        tags = all_tags(client, t)
        assert sorted(tags) == list(range(3000))  # each once
        t.close()


def _ignore_refusal(fn):
    """Run ``fn``; a GearFlowError (a move refused or undone) is one of the outcomes the test allows."""
    try:
        fn()
    except gf.GearFlowError:
        pass


async def _close_gracefully(dask_worker=None):
    await dask_worker.close_gracefully()


def test_two_workers_closing_gracefully_at_once_send_their_shards_to_the_one_that_stays():
    """B and C each hold a shard and close gracefully at the same time (a node drain): each retirement planned
    its shard onto the other leaving worker (it held the fewest), and one's move failed as the other closed:
    shards were lost. A retirement now leaves out the workers others are retiring: both shards go to A."""
    with own_cluster(DIAL, n=3) as client:
        a, b, c = sorted(workers_of(client))
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=4096, num_shards=4), workers=[a, a, b, c])
        t.insert(tagged(range(4000)))
        client.run(_close_gracefully, workers=[b, c], wait=False)
        wait_for(lambda: set(workers_of(client)) == {a}, "B and C to leave", deadline=120)
        st = lookup(t)
        assert st["lost"] == {} and set(st["placement"].values()) == {a}
        assert sorted(all_tags(client, t)) == list(range(4000))
        t.close()


def _refuse_samples(n, dask_worker=None):
    """This worker refuses its next ``n`` sample requests as a worker its shards had just left does
    (ShardMovedError): what a sample planned across a run of moves meets, one refusal a move."""
    from gear_flow.errors import ShardMovedError

    plugin = dask_worker.plugins["gear-flow"]
    real, left = plugin.run, [n]

    async def run(op, **kw):
        if op == "sample_part" and left[0] > 0:
            left[0] -= 1
            raise ShardMovedError(0, "refused by the test")
        return await real(op, **kw)

    plugin.run = run


def test_a_sample_refused_by_each_move_of_a_rebalance_is_redone_until_served(dist_client):
    """A rebalance moves a table's shards one after the other, and a sample planned across them may be refused
    once by each move: it was given up after 8 ("redone 8 times", 4-6 runs in 8 of a sampler beside an
    8-move rebalance). A refusal for a move is not one of the 8 attempts: the sample is redone where the
    shards are now, 10 refusals in a row here, and served."""
    t = DistributedTable.create(dist_client, gf.TableSpec(TAG, capacity=256, num_shards=2), sampler=gf.Fifo())
    try:
        t.insert(tagged(range(8)))
        dist_client.run(_refuse_samples, 10, workers=[t.placement[0]])
        b = t.sample(4)
        assert b["tag"].numpy()[:, 0].tolist() == [0, 1, 2, 3]
    finally:
        t.close()
