"""Processes that die while they use a distributed table leave nothing behind.

A client process is SIGKILLed while it waits for admission, or in the middle
of an insert (after staging on both workers, or after applying on one of
them); the coordinator hears of it from the scheduler (``remove_client``) and
releases or settles what it held.  A worker killed by SIGKILL has its shards
marked lost by the coordinator without any table call.  Waiting for those
reactions polls the table's state with a deadline (no fixed sleeps).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import dask
import numpy as np
import pytest
from dist_support import DIAL, coordinator, own_cluster, wait_for
from distributed import Client, LocalCluster

import gear_flow as gf
from gear_flow.distributed import DistributedTable

pytestmark = pytest.mark.timeout(240)

TAG = (gf.ColumnSpec("tag", (), np.int64),)


def tagged(tags):
    return [{"tag": np.array([t], np.int64)} for t in tags]


def spawn(scheduler: str, name: str, body: str) -> subprocess.Popen:
    """A separate client process attached to table ``name`` that runs ``body`` (t: the handle)."""
    code = textwrap.dedent(
        """
        import os, signal, sys
        import numpy as np
        from distributed import Client
        from gear_flow.distributed import DistributedTable
        from gear_flow.distributed.transport import Context, CoordinatorClient, call
        client = Client(sys.argv[1])
        t = DistributedTable.attach(sys.argv[2], client)
        def tagged(tags):
            return [{"tag": np.array([x], np.int64)} for x in tags]
        """
    ) + textwrap.dedent(body)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.Popen([sys.executable, "-c", code, scheduler, name], cwd=root, stdout=subprocess.PIPE, text=True)


def waiting(t, kind):
    return coordinator(t).lookup()["waiting"][kind]


@pytest.mark.parametrize("blocked", ["sample", "insert"])
def test_a_client_killed_while_blocked_leaves_nothing_behind(dist_client, blocked):
    t = DistributedTable.queue(dist_client, gf.TableSpec(TAG, capacity=64, num_shards=2), 2, timeout=30, seed=0)
    try:
        if blocked == "insert":
            t.insert(tagged([1, 2]))  # full: the other client's insert waits
            body = "t.insert(tagged([99]), timeout=120)\n"
        else:
            body = "t.sample(1, timeout=120)\n"
        p = spawn(dist_client.scheduler.address, t.name, body)
        wait_for(lambda: waiting(t, blocked + "s") == 1, f"the other client's {blocked} to wait")
        p.send_signal(signal.SIGKILL)
        p.wait()
        wait_for(lambda: waiting(t, blocked + "s") == 0, "the coordinator to drop the dead client's request")
        if blocked == "insert":
            assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [1, 2]  # 99 was never admitted
            t.insert(tagged([3, 4]))
            assert t.sample(2)["tag"].numpy()[:, 0].tolist() == [3, 4]
        else:
            t.insert(tagged([7]))
            assert t.sample(1)["tag"].numpy()[:, 0].tolist() == [7]  # not stranded with the dead consumer
        info = t.info()
        assert info["size"] == info["coordinator_size"] == 0 and info["inserts_in_flight"] == 0
        assert info["rate_limiter"]["inserts"] == info["totals"]["inserted"]
        assert info["rate_limiter"]["samples"] == info["totals"]["sampled"]
    finally:
        t.close()


# the dead client admits an insert of two episodes, one per shard, stages both parts, then dies
_MID_INSERT = """
ctx = Context(client=client)  # this client's own, not the handle's

async def go():
    adm = await CoordinatorClient(ctx, t.name).admit_insert(n=2, episodes=2, per_shard={0: 1, 1: 1}, owner=client.id, timeout=30)
    for s in (0, 1):
        part = {"shard": s, "chunks": tagged([100 + s]), "lengths": np.ones(1, np.int64),
                "episode_ids": np.array([adm["first_episode_id"] + s]), "stamps": np.array([adm["first_stamp"] + s]),
                "priorities": None}
        await call(ctx, t.placement[s], "stage", name=t.name, txn=adm["txn"], parts=[part])
    if APPLY_ONE:
        await call(ctx, t.placement[0], "apply", name=t.name, txn=adm["txn"])
client.sync(go)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _staged(name, dask_worker=None):
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    return 0 if t is None else len(t.staged)


@pytest.mark.parametrize("applied_on_one", [False, True])
def test_a_client_killed_mid_insert_is_settled_by_the_coordinator(dist_client, applied_on_one):
    """Staged everywhere, applied nowhere: aborted everywhere.  Applied on one worker: the insert
    was decided, so the coordinator applies the other part and commits it (two-phase commit)."""
    t = DistributedTable.create(dist_client, gf.TableSpec(TAG, capacity=64, num_shards=2), seed=0)
    try:
        assert len(set(t.placement.values())) == 2
        t.insert(tagged([1, 2]))
        before = t.info()
        p = spawn(dist_client.scheduler.address, t.name, f"APPLY_ONE = {applied_on_one}\n" + _MID_INSERT)
        assert p.wait() == -signal.SIGKILL
        wait_for(lambda: t.info()["inserts_in_flight"] == 0, "the coordinator to settle the dead client's insert")
        info = t.info()
        assert sum(dist_client.run(_staged, t.name).values()) == 0  # nothing left staged on any worker
        assert info["size"] == info["coordinator_size"]
        assert info["rate_limiter"]["inserts"] == info["totals"]["inserted"]
        if applied_on_one:
            assert info["size"] == before["size"] + 2
            assert sorted(t.sample(64, boundary="pad_tail")["tag"].numpy()[:, 0].tolist()) != []
            tags = set()
            for _ in range(20):
                tags |= set(t.sample(32)["tag"].numpy()[:, 0].tolist())
            assert tags == {1, 2, 100, 101}
        else:
            assert info["size"] == before["size"]
            assert info["totals"]["inserted"] == before["totals"]["inserted"]
    finally:
        t.close()


async def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def test_the_coordinator_marks_a_killed_workers_shards_lost_without_a_table_call():
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c,
        Client(c) as client,
    ):
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), degraded=True, seed=0)
        t.insert(tagged(range(10)))
        victim = t.placement[1]
        client.run(_kill_self, workers=[victim], wait=False)
        st = lambda: coordinator(t).lookup()  # noqa: E731
        wait_for(lambda: 1 in {int(k) for k in st()["lost"]}, "shard 1 to be marked lost")
        lost = st()["lost"]
        assert victim in next(iter(lost.values()))["detail"]
        # the handle learns it from the next reply's version: no timeout, no stall on the dead address
        t0 = time.monotonic()
        b = t.sample(8)
        assert time.monotonic() - t0 < 5
        assert set(gf.keys.decode(b.keys.numpy())[0].tolist()) == {0}
        info = t.info()
        assert info["size"] == info["coordinator_size"] and 1 in info["lost"]


def test_calls_waiting_for_the_limiter_of_a_table_that_is_not_degraded_are_refused_when_a_shard_is_lost():
    """A sample waiting for a MinSize limiter and an insert waiting for a full Queue, on tables that are not
    degraded, were not told when a shard's worker died: each waited out its whole timeout and then raised
    RateLimitTimeout (with timeout None, the admission's hour), while a call made after the loss raised
    ShardLostError at once.  The coordinator now refuses the waiting calls with ShardLostError when it marks
    the shard lost; the insert's error says nothing of it was stored."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c,
        Client(c) as client,
    ):
        spec = gf.TableSpec(TAG, capacity=64, num_shards=2)
        few = DistributedTable.create(client, spec, rate_limiter=gf.MinSize(3), seed=0)
        full = DistributedTable.queue(client, spec, 1, seed=0)
        few.insert(tagged([1]))
        full.insert(tagged([2]))
        assert few.placement[1] == full.placement[1]
        got = {}

        def call(name, fn):
            t0 = time.monotonic()
            try:
                fn()
                got[name] = "returned"
            except Exception as e:  # noqa: BLE001 - what the waiting call raised is the result
                got[name] = (type(e).__name__, getattr(e, "stored", None), time.monotonic() - t0)

        threads = [
            threading.Thread(target=call, args=("sample", lambda: few.sample(1, timeout=60))),
            threading.Thread(target=call, args=("insert", lambda: full.insert(tagged([3]), timeout=60))),
        ]
        for th in threads:
            th.start()
        waiting = lambda: (few.info()["waiting"]["samples"], full.info()["waiting"]["inserts"])  # noqa: E731
        wait_for(lambda: waiting() == (1, 1), "the sample and the insert to wait for their limiters")
        client.run(_kill_self, workers=[few.placement[1]], wait=False)
        for th in threads:
            th.join(90)
        assert got["sample"][:2] == ("ShardLostError", None), got
        assert got["insert"][:2] == ("ShardLostError", False), got
        assert got["sample"][2] < 40 and got["insert"][2] < 40, got  # refused at the loss, not at their timeouts


def _priorities_here(name, dask_worker=None):
    """``{tag: priority}`` of this worker's live items of table ``name`` (``client.run``)."""
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    out = {}
    for s in t.shards.values() if t is not None else ():
        with s.lock:
            live = np.flatnonzero(s.active)
            out.update(zip(s.ring.columns["tag"][live].tolist(), s.priority[live].tolist()))
    return out


def test_an_update_that_meets_a_lost_shard_may_be_sent_again_once_it_is_restored(tmp_path):
    """A table that is not degraded, a priority update whose keys span a shard whose worker was killed:
    ShardLostError, the shards that answered may have applied their part (docs/deployment.md). Sent again
    once the shard is restored, it applies to every item, the restored shard's included."""
    with own_cluster() as c:
        t = DistributedTable.create(c, gf.TableSpec(TAG, capacity=64, num_shards=2), sampler=gf.Prioritized(), seed=0)
        keys = t.insert(tagged(range(8))).first_keys
        t.checkpoint(tmp_path / "ck")
        assert t.placement[0] != t.placement[1]
        os.kill(c.run(os.getpid, workers=[t.placement[1]])[t.placement[1]], signal.SIGKILL)
        wait_for(lambda: 1 in coordinator(t).lookup()["lost"], "the coordinator to count shard 1 lost")
        with pytest.raises(gf.ShardLostError, match="shard 1"):
            t.update_priorities(keys, 5.0)
        alive = c.run(_priorities_here, t.name, workers=[t.placement[0]])[t.placement[0]]
        assert sorted(alive) == [0, 2, 4, 6] and set(alive.values()) <= {1.0, 5.0}
        t.restore_shard(1, tmp_path / "ck")
        assert t.update_priorities(keys, 5.0).applied == 8
        every = {k: v for per in c.run(_priorities_here, t.name).values() for k, v in per.items()}
        assert every == {i: 5.0 for i in range(8)}


def test_ride_along_updates_of_a_killed_workers_shard_are_dropped_not_retried_forever():
    """Updates stored with wait=False for a shard whose worker then dies (degraded table): the samples
    that follow serve from the live shard, the lost shard's updates are dropped (never put back after
    the loss was noticed), and flush, a waited update and close all work."""
    with (
        dask.config.set({"gear-flow.distributed.shared-memory": False}),
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c,
        Client(c) as client,
    ):
        spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=2)
        t = DistributedTable.create(client, spec, sampler=gf.Prioritized(1.0, 0.4), seed=0, degraded=True)
        t.insert([{"x": np.arange(20, dtype=np.float32) + 100 * i} for i in range(2)], priorities=1.0)
        keys = t.sample(64, 1).keys.numpy()
        assert set(gf.keys.decode(keys)[0].tolist()) == {0, 1}
        assert t.update_priorities(keys, np.full(len(keys), 2.0), wait=False) is None
        client.run(_kill_self, workers=[t.placement[1]], wait=False)
        for _ in range(4):
            b = t.sample(8, 1)
            assert set(gf.keys.decode(b.keys.numpy())[0].tolist()) == {0}
        assert 1 not in t._pending.stored() and not t._pending.inflight
        t.flush()
        b = t.sample(8, 1)
        assert np.allclose(b.priorities.numpy(), 2.0)  # the live shard's updates were applied
        r = t.update_priorities(b.keys.numpy(), np.ones(8))
        assert r.applied == 8
        t.close()


def test_an_insert_to_a_killed_worker_on_this_machine_is_refused_and_given_back():
    """Same machine, shared memory on: the insert first asks the shard's worker where its segments are;
    that worker was killed, so the insert fails as a ShardLostError (never an internal WorkerLost) and its
    admission is given back (nothing in flight blocks later inserts)."""
    with (
        dask.config.set({"gear-flow.distributed.shared-memory": True}),
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None) as c,
        Client(c) as client,
    ):
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), degraded=True, seed=0)
        t.insert(tagged(range(4)))
        client.run(_kill_self, workers=[t.placement[1]], wait=False)
        wait_for(lambda: 1 in {int(k) for k in coordinator(t).lookup()["lost"]}, "shard 1 to be marked lost")
        t._routes.clear()  # as after a placement change: the next insert there probes the worker again
        with pytest.raises(gf.ShardLostError):
            t.insert(tagged([99]), shard=1)
        info = t.info()
        assert info["inserts_in_flight"] == 0 and 1 in info["lost"]
        t.insert(tagged([7]), shard=0)  # the live shard still takes inserts
        t.close()


def test_a_degraded_queue_that_loses_a_shard_forgets_its_items_and_keeps_its_room():
    """A queue of 8 over two shards loses one (its worker killed, no call in flight): the items left come
    out once each, in order, and then a sample waits (never the last one again and again); the lost items'
    room is free again (8 inserts admitted, not 8 minus the lost), and a restored shard's items wait again."""
    with own_cluster(DIAL) as client:
        t = DistributedTable.queue(client, gf.TableSpec(TAG, capacity=64, num_shards=2), 8, seed=0, degraded=True)
        on = t.insert(tagged(range(1, 9))).shards.tolist()
        import tempfile

        with tempfile.TemporaryDirectory() as ck:
            t.checkpoint(ck)
            client.run(_kill_self, workers=[t.placement[1]], wait=False)
            wait_for(lambda: 1 in {int(k) for k in coordinator(t).lookup()["lost"]}, "shard 1 marked lost")
            live = [k for k, s in zip(range(1, 9), on) if s == 0]
            assert 0 < len(live) < 8
            with pytest.raises(gf.RateLimitTimeout):  # more than are left: waits (no item handed out twice)
                t.sample(len(live) + 1, timeout=0.5)
            assert t.sample(len(live), timeout=10)["tag"].numpy()[:, 0].tolist() == live
            with pytest.raises(gf.RateLimitTimeout):
                t.sample(1, timeout=0.5)
            t.insert(tagged(range(11, 19)), shard=0, timeout=10)  # the whole room: nothing waits, nothing was lost
            assert t.info()["rate_limiter"]["inserts"] - t.info()["rate_limiter"]["samples"] == 8
            assert t.sample(8, timeout=10)["tag"].numpy()[:, 0].tolist() == list(range(11, 19))
            rep = t.restore_shard(1, ck)
            back = sorted(k for k, s in zip(range(1, 9), on) if s == 1)
            assert rep["items_restored"] == len(back)
            assert t.sample(len(back), timeout=10)["tag"].numpy()[:, 0].tolist() == back
        t.close()


@pytest.mark.parametrize("degraded", [True, False])
def test_the_first_insert_after_a_loss_the_handle_has_not_seen_is_routed_over_the_shards_left(degraded):
    """A worker is killed and its shard marked lost by the coordinator; this handle has not noticed yet, so
    it routes its next insert over both shards.  Its admission tells it (the placement's version moved):
    a degraded table gives the admission back and routes the insert again over the shard left, at once
    (never waiting out the dead worker's connect timeout); one that is not raises ShardLostError, as does
    an insert pinned to the lost shard, with nothing left in flight."""
    # own_cluster's 5 s connect timeout: the 4 s bounds below tell an insert that waited it out
    with own_cluster() as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), degraded=degraded, seed=0)
        t.insert(tagged(range(10)))
        client.run(_kill_self, workers=[t.placement[1]], wait=False)
        st = lambda: coordinator(t).lookup()  # noqa: E731
        wait_for(lambda: 1 in {int(k) for k in st()["lost"]}, "shard 1 to be marked lost")
        assert not t.lost  # the handle has not seen it
        t0 = time.monotonic()
        if degraded:
            r = t.insert(tagged([20, 21, 22]))
            assert r.shards.tolist() == [0, 0, 0] and time.monotonic() - t0 < 4
            info = t.info()
            assert info["size"] == info["coordinator_size"] == 8, info  # 5 of the first 10 were on shard 0
        else:
            with pytest.raises(gf.ShardLostError):
                t.insert(tagged([20, 21, 22]))
            assert time.monotonic() - t0 < 4
        with pytest.raises(gf.ShardLostError):
            t.insert(tagged([30]), shard=1)
        assert st()["inserts_in_flight"] == 0
        t.close()


def test_a_handle_that_missed_a_shards_move_does_not_mark_it_lost_with_its_old_worker(tmp_path):
    """Handle A moves shard 1 to a spare worker (``restore_shard(replace=True)``); handle B, which has not
    heard of the move, then finds the shard's old worker dead.  B asks the coordinator where the shards are
    before it reports losses: shard 1 lives on, for both handles."""
    with own_cluster(DIAL, n=3) as client:
        a = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), degraded=True, seed=0)
        a.insert(tagged(range(1, 11)), shard=0)
        a.insert(tagged(range(101, 111)), shard=1)
        b = DistributedTable.attach(a.name, client=client)
        old = b.placement[1]
        a.checkpoint(tmp_path / "ck")
        spare = next(w for w in sorted(client.nthreads()) if w not in a.placement.values())
        a.restore_shard(1, tmp_path / "ck", worker=spare, replace=True)
        assert b.placement[1] == old  # b has not heard
        client.run(_kill_self, workers=[old], wait=False)
        wait_for(lambda: old not in client.nthreads(), "the old worker to be gone")
        assert b.nbytes() == a.nbytes()  # b reaches the dead worker first, then the shard where it is now
        assert not b.lost and not coordinator(a).lookup()["lost"]
        assert set(a.sample(256)["tag"].numpy()[:, 0].tolist()) == set(range(1, 11)) | set(range(101, 111))
        a.close()


def test_a_loss_the_coordinator_marked_first_names_the_shard_to_a_table_that_is_not_degraded():
    """The scheduler heard of the killed worker and the coordinator marked its shard lost before this handle
    reached the worker: the ShardLostError still names that shard (what ``restore_shard`` needs)."""
    with own_cluster(DIAL) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=64, num_shards=2), seed=0)
        t.insert(tagged(range(10)))
        client.run(_kill_self, workers=[t.placement[1]], wait=False)
        wait_for(lambda: 1 in {int(k) for k in coordinator(t).lookup()["lost"]}, "shard 1 to be marked lost")
        with pytest.raises(gf.ShardLostError) as e:
            t.nbytes()  # no admission first: the handle finds the dead worker itself
        assert e.value.shard == 1
        t.close()


# -- a worker killed while writers and samplers run -----------------------------------------------------


def _tags_on(name, dask_worker=None):
    """``{shard: tags of its live items}`` of this worker's shards, read from the shards themselves."""
    t = dask_worker.plugins["gear-flow"].host.tables[name]
    out = {}
    for i, s in t.shards.items():
        with s.lock:
            out[i] = s.ring.columns["tag"][s.active == 1].tolist()
    return out


class _Load:
    """Writer and reader threads on their own handles of table ``t``: every tag is inserted once (2 or 3 per
    call), and each insert's outcome is kept: the shard of each stored tag, or the ShardLostError."""

    def __init__(self, t, client, per_insert, read, learn=False, readers=2):
        self.t, self.client, self.per_insert, self.read, self.learn = t, client, per_insert, read, learn
        self.tags, self.lock = itertools.count(1), threading.Lock()
        self.ok, self.failed, self.errors, self.got = {}, {}, [], []
        self.stop_writing, self.stop_reading = threading.Event(), threading.Event()
        self.writers = [threading.Thread(target=self._write) for _ in range(2)]
        self.readers = [threading.Thread(target=self._read) for _ in range(readers)]
        for th in self.writers + self.readers:
            th.start()

    def _write(self):
        h = DistributedTable.attach(self.t.name, self.client)
        while not self.stop_writing.is_set():
            with self.lock:
                mine = [next(self.tags) for _ in range(self.per_insert)]
            try:
                r = h.insert(tagged(mine), timeout=0.5)
                self.ok.update(zip(mine, r.shards.tolist()))
            except gf.RateLimitTimeout:  # a full queue: these tags were never admitted
                pass
            except gf.ShardLostError as e:
                self.failed[tuple(mine)] = e
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(("insert", repr(e)))
                return

    def _read(self):
        h = DistributedTable.attach(self.t.name, self.client)
        rng = np.random.default_rng(len(self.readers))
        while not self.stop_reading.is_set():
            try:
                b = h.sample(self.read, timeout=0.5)
                self.got.extend(b["tag"].numpy()[:, 0].tolist())
                if self.learn:  # a learner: new priorities for what it sampled, sent now or with its next sample
                    h.update_priorities(b.keys.numpy(), rng.uniform(0.1, 2.0, self.read), wait=bool(rng.integers(2)))
            except gf.RateLimitTimeout:
                pass
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(("sample", repr(e)))
                return

    def kill_shard_1_midway(self, n=60):
        """``n`` stored tags, then shard 1's worker killed; ``n`` more calls' worth of outcomes after the
        coordinator marked it lost, then the writers stopped."""
        wait_for(lambda: len(self.ok) >= n or self.errors, "the first inserts")
        self.client.run(_kill_self, workers=[self.t.placement[1]], wait=False)
        wait_for(lambda: 1 in {int(k) for k in coordinator(self.t).lookup()["lost"]}, "shard 1 lost")
        done = len(self.ok) + len(self.failed) * self.per_insert
        wait_for(lambda: len(self.ok) + len(self.failed) * self.per_insert >= done + n or self.errors, "more inserts")
        self.stop_writing.set()
        for th in self.writers:
            th.join()

    def stop(self):
        self.stop_reading.set()
        for th in self.readers:
            th.join()

    def check_stored(self, on: list):
        """What live shard 0 holds, or what a queue handed out (``on``), against what the inserts reported."""
        assert not self.errors, self.errors
        assert len(on) == len(set(on)), "a tag twice"
        assert {k for k, s in self.ok.items() if s == 0} <= set(on)  # nothing reported stored is missing
        attempted = set(self.ok) | {x for k in self.failed for x in k}
        assert set(on) <= attempted and set(self.got) <= attempted
        for k, e in self.failed.items():
            assert e.shard == 1 and e.stored in (False, True), (k, e, e.stored)
            if e.stored is False:  # nothing of it was stored: none of its tags anywhere
                assert not set(k) & set(on), (k, e)


@pytest.mark.parametrize("degraded", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_a_worker_killed_while_writers_and_samplers_run_loses_only_its_shard(shared, degraded):
    """Two writer threads and two sampler threads run while shard 1's worker is SIGKILLed.  Degraded: no
    call fails but an insert the dead worker was applying (``stored=True``; its rest is stored), inserts
    the loss interrupted before anything was stored are routed again over shard 0, the samplers go on.
    Not degraded: every failure is a ShardLostError naming shard 1 and saying whether the insert was
    stored.  Either way shard 0 holds every tag reported stored there, each once, and nothing else; the
    table's size is the shard's on the workers and at the coordinator."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": shared}) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=100_000, num_shards=2), degraded=degraded)
        load = _Load(t, client, per_insert=3, read=16)
        load.kill_shard_1_midway()
        load.stop()
        if degraded:
            assert not [e for e in load.failed.values() if e.stored is not True], load.failed
            assert not load.errors, load.errors
            assert len(load.ok) >= 120
        else:
            load.errors = [e for e in load.errors if "ShardLostError" not in e[1]]  # samples fail too
            assert load.failed
        on = client.run(_tags_on, t.name, workers=[t.placement[0]])[t.placement[0]][0]
        load.check_stored(on)
        if degraded:
            info = t.info()
            assert info["size"] == info["coordinator_size"] == len(on) and list(info["lost"]) == [1]
        else:
            st = coordinator(t).lookup()
            assert st["shard_size"][0] == len(on) and st["inserts_in_flight"] == 0
        t.close()


@pytest.mark.parametrize("shared", [True, False])
def test_a_prioritized_table_at_max_size_that_loses_a_worker_under_writers_and_learners_ends_at_max_size(shared):
    """A degraded prioritized table held at max_size 300 (every insert evicts); two writer threads and two
    learner threads (sample, then update the priorities, waited for or not) run while shard 1's worker is
    SIGKILLed.  No call fails but an insert the dead worker was applying (stored: it still evicts); the
    table ends at exactly max_size on the worker and the coordinator, every item accounted for."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": shared}) as client:
        spec = gf.TableSpec(TAG, capacity=5000, num_shards=2, max_size=300)
        t = DistributedTable.create(client, spec, sampler=gf.Prioritized(0.8, 0.4), degraded=True, seed=0)
        for i in range(30):
            t.insert([{"tag": np.full(10, -1 - i, np.int64)}], priorities=1.0)
        load = _Load(t, client, per_insert=3, read=32, learn=True)
        load.kill_shard_1_midway(n=240)  # enough after the loss to fill the shard left past max_size
        load.stop()
        assert not load.errors, load.errors
        assert all(e.stored is True and e.shard == 1 for e in load.failed.values()), load.failed
        t.flush()
        on = client.run(_tags_on, t.name, workers=[t.placement[0]])[t.placement[0]][0]
        info = t.info()
        assert info["size"] == info["coordinator_size"] == len(on) == 300, info
        tot = info["totals"]
        assert tot["inserted"] == tot["evicted"] + tot["removed"] + info["size"]
        t.close()


def test_a_queue_that_loses_a_worker_under_producers_and_consumers_hands_out_each_item_once():
    """A degraded queue of 16 over two workers; two producer and two consumer threads run while shard 1's
    worker is SIGKILLed.  No item is handed out twice, every item stored on shard 0 is handed out, the
    queue ends empty at the coordinator and on the worker with its whole room free (the lost items' too),
    nothing evicted (``test_dist_queue_loss``: a sample given back after the loss left the queue over
    ``max_size``, and the eviction dropped its oldest items)."""
    with own_cluster(DIAL) as client:
        t = DistributedTable.queue(client, gf.TableSpec(TAG, capacity=100_000, num_shards=2), 16, degraded=True)
        load = _Load(t, client, per_insert=2, read=2)
        load.kill_shard_1_midway()
        size = lambda: coordinator(t).lookup()["size"]  # noqa: E731
        wait_for(lambda: size() < 2 or load.errors, "the consumers to drain it")  # they take 2 at a time
        load.stop()
        if size():
            load.got.extend(t.sample(1, timeout=10)["tag"].numpy()[:, 0].tolist())
        assert client.run(_tags_on, t.name, workers=[t.placement[0]])[t.placement[0]][0] == []
        load.check_stored(load.got)  # each handed out once, every one stored on shard 0 among them
        info = t.info()
        rl = info["rate_limiter"]
        assert info["size"] == info["coordinator_size"] == 0 and rl["inserts"] == rl["samples"]
        assert info["totals"]["removed"] == 0  # never evicted to max_size (also none of the tags not reported stored)
        t.insert(tagged(range(10**6, 10**6 + 16)), timeout=10)  # the whole room is free
        assert t.sample(16, timeout=10)["tag"].numpy()[:, 0].tolist() == list(range(10**6, 10**6 + 16))
        t.close()


@pytest.mark.parametrize("shared", [True, False])
def test_a_stream_and_an_episode_writer_go_on_through_a_lost_worker(shared):
    """A learner iterates a Stream (3 requests in flight, priorities written back) and an actor writes
    episodes step by step (EpisodeWriter) while shard 1's worker is SIGKILLed: both go on from the shard
    left without an error, every window holds consecutive steps of one episode, and the sizes agree."""
    obs = (gf.ColumnSpec("obs", (2,), np.float32),)

    def episode(e, n):
        return {"obs": np.stack([np.full(n, e), np.arange(n)], 1).astype(np.float32)}

    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": shared}) as client:
        spec = gf.TableSpec(obs, capacity=20_000, num_shards=2)
        t = DistributedTable.create(client, spec, sampler=gf.Prioritized(0.8, 0.4), degraded=True, seed=0)
        t.insert([episode(e, 10) for e in range(20)])
        errors, windows, written, stop = [], {"ok": 0, "bad": 0}, [], threading.Event()

        def write():
            w = DistributedTable.attach(t.name, client).writer()
            try:
                for e in itertools.count(100):
                    if stop.is_set():
                        return
                    for i in range(7):
                        w.append({"obs": np.array([e, i], np.float32)})
                    w.end_episode()
                    written.append(e)
            except Exception as ex:  # noqa: BLE001 - reported by the test
                errors.append(("write", repr(ex)))

        def learn():
            try:
                with gf.Stream(DistributedTable.attach(t.name, client), 16, 4, prefetch=3, seed=0) as s:
                    for b in s:
                        o = b["obs"].numpy()
                        ok = (o[..., 0] == o[:, :1, 0]).all(1) & (np.diff(o[..., 1], axis=1) == 1).all(1)
                        windows["ok"] += int(ok.sum())
                        windows["bad"] += int((~ok).sum())
                        s.update_priorities(b.keys.numpy(), np.linspace(0.1, 1.0, 16))
                        if stop.is_set():
                            return
            except Exception as ex:  # noqa: BLE001 - reported by the test
                errors.append(("learn", repr(ex)))

        threads = [threading.Thread(target=write), threading.Thread(target=learn)]
        for th in threads:
            th.start()
        wait_for(lambda: len(written) >= 30 or errors, "the first episodes")
        client.run(_kill_self, workers=[t.placement[1]], wait=False)
        wait_for(lambda: 1 in {int(k) for k in coordinator(t).lookup()["lost"]}, "shard 1 lost")
        n, w0 = len(written), windows["ok"]
        wait_for(lambda: (len(written) >= n + 30 and windows["ok"] >= w0 + 200) or errors, "more after the loss")
        stop.set()
        for th in threads:
            th.join()
        assert not errors, errors
        assert windows["bad"] == 0
        info = t.info()
        assert info["size"] == info["coordinator_size"] and list(info["lost"]) == [1]
        t.close()


@pytest.mark.parametrize("shared", [True, False])
def test_checkpoints_taken_while_writers_run_and_a_worker_is_killed_restore_what_was_stored(shared, tmp_path):
    """A thread checkpoints the table again and again while two writers insert and shard 1's worker is
    SIGKILLed.  Every checkpoint is written (the one the loss interrupts again, of the shard left); the last
    one restores as a table with shard 1 lost, holding every tag stored on shard 0 before that checkpoint
    began and nothing never inserted."""
    with own_cluster({**DIAL, "gear-flow.distributed.shared-memory": shared}) as client:
        t = DistributedTable.create(client, gf.TableSpec(TAG, capacity=100_000, num_shards=2), degraded=True)
        load = _Load(t, client, per_insert=3, read=0, readers=0)
        done, errors, stop = [], [], threading.Event()

        def checkpoint():
            h = DistributedTable.attach(t.name, client)
            for i in itertools.count():
                if stop.is_set():
                    return
                before = {k for k, s in load.ok.items() if s == 0}
                try:
                    h.checkpoint(tmp_path / f"ck{i}")
                except Exception as e:  # noqa: BLE001 - reported by the test
                    errors.append(repr(e))
                    return
                done.append((tmp_path / f"ck{i}", before))

        th = threading.Thread(target=checkpoint)
        th.start()
        load.kill_shard_1_midway()
        n = len(done)
        wait_for(lambda: len(done) >= n + 1 or errors, "a checkpoint after the writers stopped")
        stop.set()
        th.join()
        assert not errors and not load.errors, (errors, load.errors)
        assert all(e.stored is True for e in load.failed.values()), load.failed
        path, before = done[-1]
        r = DistributedTable.restore(client, path, name="restored")
        assert list(r.info()["lost"]) == [1]
        on = client.run(_tags_on, "restored", workers=[r.placement[0]])[r.placement[0]][0]
        assert before <= set(on) and len(on) == len(set(on))
        assert set(on) <= set(load.ok) | {x for k in load.failed for x in k}
        r.close()
        t.close()


@pytest.mark.parametrize("kind", ["uniform", "queue"])
def test_a_shard_restored_while_writers_and_samplers_run_rejoins_the_table(kind, tmp_path):
    """Shard 1's worker is SIGKILLed under two writers and two samplers; its shard is restored from a
    checkpoint taken before the writers started while the writers and samplers go on.  It rejoins: no call
    fails but an insert the dead worker was applying, the sizes agree on the workers and the coordinator,
    nothing is lost any more, and the restored shard holds its items of the checkpoint.  A queue hands out
    again only what shard 1 held at the checkpoint (the shard comes back as it was: at least once across
    a restore), every other item once."""
    with own_cluster(DIAL) as client:
        spec = gf.TableSpec(TAG, capacity=100_000, num_shards=2)
        if kind == "queue":
            t = DistributedTable.queue(client, spec, 16, degraded=True)
        else:
            t = DistributedTable.create(client, spec, degraded=True)
        first = t.insert(tagged(range(-10, 0))).shards.tolist()
        at_checkpoint = {k for k, s in zip(range(-10, 0), first) if s == 1}
        t.checkpoint(tmp_path / "ck")
        load = _Load(t, client, per_insert=2, read=2)
        load.kill_shard_1_midway()
        load.stop_writing.clear()
        load.writers = [threading.Thread(target=load._write) for _ in range(2)]
        for th in load.writers:
            th.start()
        rep = t.restore_shard(1, tmp_path / "ck")
        assert rep["items_restored"] == len(at_checkpoint) > 0
        n = len(load.ok)
        wait_for(lambda: len(load.ok) >= n + 60 or load.errors, "inserts after the restore")
        load.stop_writing.set()
        for th in load.writers:
            th.join()
        if kind == "queue":
            wait_for(lambda: coordinator(t).lookup()["size"] < 2 or load.errors, "the consumers to drain it")
        load.stop()
        assert not load.errors, load.errors
        assert all(e.stored is True for e in load.failed.values()), load.failed
        info = t.info()
        assert info["size"] == info["coordinator_size"] == sum(s["size"] for s in info["shards"]) and not info["lost"]
        if kind == "queue":
            twice = {k for k in load.got if load.got.count(k) > 1}
            assert twice <= at_checkpoint, twice
            assert all(load.got.count(k) <= 2 for k in twice)
        else:
            on = client.run(_tags_on, t.name, workers=[t.placement[1]])[t.placement[1]][1]
            assert at_checkpoint <= set(on) and len(on) == len(set(on))
        t.close()
