"""The control plane of a distributed table: what a learner's step costs in requests, and that the
shortcuts taken to save them keep the answers exact and all-or-nothing.

A steady prioritized step (sample, then update the sampled priorities) on two
workers sends one ``sample_part`` per worker drawn from and one ``update`` per
worker updated: no masses request (the plan reuses masses kept from earlier
replies, the update's reply included) and no key check (every key was seen
issued).  ``pipelines/bench_control_plane.py`` measures the same with up to 8
workers.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.coordinator import COORDINATOR_NAME
from gear_flow.keys import decode, encode


@pytest.fixture
def table(dist_client):
    with dask.config.set(
        {"gear-flow.distributed.mass-max-age": 600, "gear-flow.distributed.shared-memory": False}
    ):  # masses kept for the whole test: only the code under test refreshes them
        spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=2)
        t = DistributedTable.create(dist_client, spec, sampler=gf.Prioritized(1.0, 0.4), seed=0)
        try:
            t.insert([{"x": np.arange(20, dtype=np.float32) + 100 * i} for i in range(2)], priorities=1.0)
            assert sorted(t.info()["shards"][i]["size"] for i in range(2)) == [20, 20]
            yield t
        finally:
            t.close()


def _step(t, rng, B=16):
    b = t.sample(B, 1)
    t.update_priorities(b.keys.numpy(), rng.random(B) + 0.5)
    return b


def test_a_steady_step_is_one_request_per_worker_and_phase(table):
    rng = np.random.default_rng(0)
    for _ in range(3):  # warm: masses fetched once, keys seen
        _step(table, rng)
    table.requests.clear()
    for _ in range(5):
        _step(table, rng)
    got = dict(table.requests)
    assert set(got) <= {"sample_part", "update"}, got  # no summaries, no check_keys
    assert got["sample_part"] <= 10 and got["update"] <= 10, got


def test_an_update_shows_in_the_next_plan_without_asking_for_masses(table):
    rng = np.random.default_rng(1)
    seen = set()
    while len(seen) < 40:  # every key, from samples (so they count as seen issued)
        seen.update(table.sample(64, 1).keys.numpy().tolist())
    keys = np.array(sorted(seen))
    shard, _ = decode(keys)
    table.update_priorities(keys, np.where(shard == 0, 0.0, 1.0))  # shard 0 keeps no weight
    table.requests.clear()
    for _ in range(5):
        b = table.sample(32, 1)
        assert set(decode(b.keys.numpy())[0].tolist()) == {1}  # with the masses before the update: shard 0 drawn
        assert np.allclose(b.probabilities.numpy(), 1 / 20)
    assert "summaries" not in table.requests
    _step(table, rng)


def test_masses_older_than_their_maximum_age_are_asked_for_before_the_plan(dist_client, data_plane):
    """A handle planned with every mass it kept, however old, and asked for the stale ones only alongside
    its draw: its first batch after a pause chose shards by their sizes at its last batch (another handle
    had filled them unevenly since), so a uniform table's items were drawn with 1/600 * 2/3, 6/7, 6/5 and
    2 instead of 1/600.  A mass older than ``distributed.mass-max-age`` is now asked for before the plan
    (the shared-memory plane reads the published masses, current already)."""
    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.int64),), capacity=4096, num_shards=4)
    t = DistributedTable.create(dist_client, spec, seed=0)
    other = DistributedTable.attach(t.name, dist_client)
    try:
        t.insert([{"x": np.array([i])} for i in range(100)])
        n = 100
        for rnd in range(2):
            t.sample(64)  # this handle keeps the masses of this batch's replies
            for s in range(4):  # another handle fills the shards unevenly
                k = 50 * (rnd + 1) * (s + 1)
                other.insert([{"x": np.arange(n, n + k)}], shard=s)
                n += k
            # every mass kept is older than the maximum age (set here to a microsecond, so no wait is needed)
            here, asked = t.stats["in_thread"], t.requests["summaries"]
            with dask.config.set({"gear-flow.distributed.mass-max-age": 1e-6}):
                b = t.sample(512)
            assert np.allclose(b.probabilities.numpy(), 1 / n, rtol=1e-12, atol=0), (rnd, n)
            if data_plane != "shared-memory":  # (there the published masses are read: no request)
                assert t.requests["summaries"] - asked == 2  # one per worker, before the plan
            if data_plane == "tcp-lane":  # asked over the lanes by the learner's thread, as its draws go
                assert t.stats["in_thread"] - here == 1
    finally:
        other.close()
        t.close()


def test_a_key_never_seen_issued_is_checked_everywhere_first(table):
    seen = table.sample(64, 1).keys.numpy()
    ok = seen[decode(seen)[0] == 0][:4]
    bogus = encode(1, np.array([10_000]))  # shard 1 never issued seq 10000
    before = table.info()["totals"]["stale_updates"]
    prio_before = table.sample(64, 1)
    with pytest.raises(gf.UnknownKeyError):
        table.update_priorities(np.concatenate([ok, bogus]), np.full(5, 50.0))
    assert table.info()["totals"]["stale_updates"] == before
    # nothing applied on shard 0 either: no item there carries priority 50
    for _ in range(5):
        b = table.sample(64, 1)
        assert not np.any(b.priorities.numpy() == 50.0)
    assert prio_before.priorities.numpy().max() < 50


def test_insert_batch_on_a_distributed_table_is_insert_of_its_rows(dist_client):
    spec = gf.TableSpec((gf.ColumnSpec("x", (2,), np.float32),), capacity=64, num_shards=2)
    x = np.arange(4 * 5 * 2, dtype=np.float32).reshape(4, 5, 2)
    a = DistributedTable.create(dist_client, spec, seed=2)
    b = DistributedTable.create(dist_client, spec, seed=2)
    try:
        r1 = a.insert([{"x": x[i]} for i in range(4)])
        r2 = b.insert_batch({"x": x})
        assert r1.first_keys.tolist() == r2.first_keys.tolist()
        s1, s2 = a.sample(8, 2), b.sample(8, 2)
        assert s1.keys.tolist() == s2.keys.tolist() and np.array_equal(s1["x"].numpy(), s2["x"].numpy())
        with pytest.raises(gf.InvalidDataError, match=r"shape \(4, 5\) must be \(B, T, 2\)"):
            b.insert_batch({"x": x[..., 0]})
        assert b.info()["size"] == 20
    finally:
        a.close()
        b.close()


# -- small requests skip the worker's thread pool -----------------------------------------------------------------
def _ran(dask_worker):
    return dict(dask_worker.plugins["gear-flow"].ran)


def _hold_locks(name, dask_worker):
    """Take every shard lock of ``name`` in another thread of the worker (as a long write would)."""
    import threading

    t = dask_worker.plugins["gear-flow"].host.table(name)
    held, done = threading.Event(), threading.Event()

    def hold():
        locks = t.locked()
        held.set()
        done.wait(60)
        for lk in reversed(locks):
            lk.release()

    threading.Thread(target=hold, daemon=True).start()
    held.wait(10)
    dask_worker._gear_flow_test_release = done


def _let_go(dask_worker):
    dask_worker._gear_flow_test_release.set()


def test_small_requests_run_on_the_event_loop_unless_a_lock_is_held(dist_client):
    """A draw with free shard locks runs right on the worker's event loop (no thread hop); with a lock
    held by another thread it goes to the pool and waits there, never blocking the loop."""
    import threading
    import time

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=1)
    with dask.config.set({"gear-flow.distributed.reader-draw": False}):  # the owner draws: its requests are tested
        t = DistributedTable.create(dist_client, spec, sampler=gf.Uniform(), seed=0)
    try:
        t.insert([{"x": np.arange(20, dtype=np.float32)}])
        addr = t.placement[0]
        t.sample(4, 1)  # first contact (maps the shared segments, if any)
        before = dist_client.run(_ran, workers=[addr])[addr]
        for _ in range(5):
            b = t.sample(4, 1)
            assert np.array_equal(b["x"].numpy()[:, 0], b.timesteps.numpy())  # x[i] = i
        mid = dist_client.run(_ran, workers=[addr])[addr]
        assert mid["loop"] - before["loop"] >= 5 and mid["pool"] == before["pool"], (before, mid)

        dist_client.run(_hold_locks, t.name, workers=[addr])
        got = []
        th = threading.Thread(target=lambda: got.append(t.sample(4, 1)))
        th.start()
        deadline = time.monotonic() + 30
        while dist_client.run(_ran, workers=[addr])[addr]["pool"] == mid["pool"]:  # the loop still answers
            assert time.monotonic() < deadline, "the draw never reached the pool"
        assert not got  # waiting for the lock, in the pool
        dist_client.run(_let_go, workers=[addr])
        th.join(30)
        assert len(got) == 1 and np.array_equal(got[0]["x"].numpy()[:, 0], got[0].timesteps.numpy())
    finally:
        t.close()


# -- priority updates riding on the next sample -------------------------------------------------------------------
def _deferred_step(t, rng, B=64):
    b = t.sample(B, 1)
    assert t.update_priorities(b.keys.numpy(), rng.random(B) + 0.5, wait=False) is None
    return b


def test_a_deferred_update_rides_on_the_next_sample(table):
    """wait=False: a steady step is one phase: the sample's requests carry the previous step's updates."""
    rng = np.random.default_rng(2)
    for _ in range(3):
        _deferred_step(table, rng)
    table.requests.clear()
    for _ in range(5):
        _deferred_step(table, rng)  # B=64 over two equal shards: both drawn from every time
    got = dict(table.requests)
    assert got == {"sample_part": 10}, got  # no update, no summaries, no check_keys request
    table.flush()
    assert dict(table.requests) == {"sample_part": 10, "update": 2}  # what was left: sent by flush
    table.flush()
    assert table.requests["update"] == 2  # nothing left


def test_the_next_sample_draws_with_the_deferred_priorities(table):
    """All priorities but one set to 0 without waiting: the very next sample, planned with masses
    from before the update, draws only that item and reports probability 1."""
    seen = set()
    while len(seen) < 40:
        seen.update(table.sample(64, 1).keys.numpy().tolist())
    keys = np.array(sorted(seen), dtype=np.int64)
    pr = np.zeros(len(keys))
    pr[7] = 3.0
    table.requests.clear()
    assert table.update_priorities(keys, pr, wait=False) is None
    assert not table.requests  # nothing sent yet
    b = table.sample(8, 1)
    assert b.keys.numpy().tolist() == [int(keys[7])] * 8
    assert np.allclose(b.probabilities.numpy(), 1.0)
    assert np.allclose(b.priorities.numpy(), 3.0)


def test_another_handle_sees_deferred_updates_once_flushed(table, dist_client):
    seen = set()
    while len(seen) < 40:
        seen.update(table.sample(64, 1).keys.numpy().tolist())
    keys = np.array(sorted(seen), dtype=np.int64)
    other = DistributedTable.attach(table.name, dist_client)
    pr = np.full(len(keys), 1.0)
    pr[:39] = 0.0  # only the last key keeps weight
    table.update_priorities(keys, pr, wait=False)
    assert len(set(other.sample(32, 1).keys.numpy().tolist())) > 1  # not sent yet: old priorities
    table.flush()
    assert set(other.sample(32, 1).keys.numpy().tolist()) == {int(keys[-1])}


def test_deferred_updates_go_into_a_checkpoint(table, tmp_path, dist_client):
    seen = set()
    while len(seen) < 40:
        seen.update(table.sample(64, 1).keys.numpy().tolist())
    keys = np.array(sorted(seen), dtype=np.int64)
    pr = np.zeros(len(keys))
    pr[3] = 2.0
    table.update_priorities(keys, pr, wait=False)
    table.checkpoint(tmp_path / "ck")
    other = DistributedTable.attach(table.name, dist_client)
    assert set(other.sample(16, 1).keys.numpy().tolist()) == {int(keys[3])}


def test_a_deferred_update_with_an_unknown_key_waits_and_is_refused(table):
    """Keys never seen issued cannot ride along: the call checks them everywhere first (nothing applied)."""
    b = table.sample(8, 1)
    k = b.keys.numpy()
    shard, seq = decode(k)
    bad = np.concatenate([k, encode(np.array([1 - shard[0]]), np.array([10**6]))])
    with pytest.raises(gf.UnknownKeyError):
        table.update_priorities(bad, 5.0, wait=False)
    assert len(table._pending) == 0
    assert not np.allclose(table.sample(64, 1).priorities.numpy(), 5.0)  # nothing applied anywhere


def test_a_waited_update_goes_after_one_riding_on_a_sample_in_flight(dist_client):
    """Thread A's sample carries a stored update (key x to 5.0) and is held at the worker by a lock;
    thread B then sets x to 2.0 with wait=True.  B must not send before A's update is applied (both
    would wait for the same lock, in no defined order): B waits, then x ends at 2.0."""
    import threading
    import time

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=1)
    with dask.config.set({"gear-flow.distributed.shared-memory": False}):
        t = DistributedTable.create(dist_client, spec, sampler=gf.Prioritized(1.0, 0.4), seed=0)
    try:
        t.insert([{"x": np.arange(20, dtype=np.float32)}], priorities=1.0)
        seen = set()
        while len(seen) < 20:
            seen.update(t.sample(16, 1).keys.numpy().tolist())
        keys = np.array(sorted(seen), dtype=np.int64)
        old = np.zeros(20)
        old[0] = 5.0  # only x = keys[0] keeps weight
        assert t.update_priorities(keys, old, wait=False) is None
        addr = t.placement[0]
        before = dist_client.run(_ran, workers=[addr])[addr]
        dist_client.run(_hold_locks, t.name, workers=[addr])
        got = {}
        a = threading.Thread(target=lambda: got.update(a=t.sample(4, 1)))
        a.start()
        deadline = time.monotonic() + 30
        while dist_client.run(_ran, workers=[addr])[addr]["pool"] == before["pool"]:  # A waits at the worker
            assert time.monotonic() < deadline, "the sample never reached the worker's pool"
        t.requests.clear()
        b = threading.Thread(target=lambda: got.update(b=t.update_priorities(keys[:1], 2.0)))
        b.start()
        while not getattr(t._pending, "waiters", None):  # B waits for A's update to settle, nothing sent
            assert time.monotonic() < deadline, "the waited update did not wait for the one in flight"
        assert not t.requests
        dist_client.run(_let_go, workers=[addr])
        a.join(30)
        b.join(30)
        assert got["b"].applied == 1 and dict(t.requests) == {"update": 1}
        assert set(got["a"].keys.numpy().tolist()) == {int(keys[0])}  # drawn with A's update applied
        last = t.sample(8, 1)
        assert last.keys.numpy().tolist() == [int(keys[0])] * 8
        assert np.allclose(last.priorities.numpy(), 2.0)  # B's value, applied after A's
    finally:
        t.close()


def test_a_stream_s_priority_updates_ride_on_its_samples(table, dist_client):
    """Stream.update_priorities on a weighted distributed table sends no request of its own: the
    stream's next sample carries the update; closing the stream sends what no sample carried."""
    import torch

    seen = set()
    with gf.Stream(table, 64, 1, prefetch=1, num_batches=10, seed=0) as st:
        for i, b in enumerate(st):
            if i == 3:
                table.requests.clear()
            if i == 9:  # the last batch: 6 steps since, all carried by samples (5 or 6 sampled since the clear)
                assert set(table.requests) == {"sample_part"} and table.requests["sample_part"] >= 10, table.requests
            seen.update(b.keys.numpy().tolist())
            st.update_priorities(b.keys, torch.rand(64, dtype=torch.float64) + 0.5)
        keys = torch.tensor(sorted(seen))
        pr = torch.zeros(len(keys), dtype=torch.float64)
        pr[5] = 1.0
        st.update_priorities(keys, pr)  # after the last batch: sent when the stream closes
        assert st.priority_writes == {"applied": 0, "stale": 0, "pending": 0, "deferred": 11}
    other = DistributedTable.attach(table.name, dist_client)
    assert set(other.sample(16, 1).keys.numpy().tolist()) == {int(keys[5])}


def test_a_stream_queues_updates_that_may_not_ride_along(table):
    """Keys the stream never sampled (a new insert's) go to its background writer, and later updates
    queue behind them (call order), until the writer has caught up."""
    new = table.insert([{"x": np.arange(4, dtype=np.float32)}], priorities=1.0).first_keys[0] + np.arange(4)
    with gf.Stream(table, 8, 1, prefetch=1, num_batches=2, seed=0) as st:
        b = next(iter(st)).keys.numpy().copy()
        st.update_priorities(new, np.full(len(new), 2.0))  # never seen issued: the writer checks them
        st.update_priorities(b, np.full(8, 3.0))  # queued behind it, unless the writer is done already
    w = st.priority_writes
    assert w["pending"] == 0 and (w["applied"], w["deferred"]) in ((4, 1), (12, 0)), w
    got = table.sample(256, 1)
    p = dict(zip(got.keys.numpy().tolist(), got.priorities.numpy().tolist()))
    assert {p[k] for k in new.tolist() if k in p} == {2.0} and {p[k] for k in b.tolist() if k in p} == {3.0}, p


# -- a slow worker is waited for, a silent one reported -----------------------------------------------------------
def test_a_slow_reply_is_waited_for_and_a_silent_worker_is_reported(dist_client):
    """A request stuck behind a lock is not a lost worker: the handle asks the scheduler, waits again while
    the worker is alive, and reports a timeout (not a loss) once ``rpc-retries`` waits have passed."""
    import threading
    import time

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=1)
    with dask.config.set({"gear-flow.distributed.reader-draw": False}):  # the owner draws: its requests are tested
        t = DistributedTable.create(dist_client, spec, sampler=gf.Uniform(), seed=0)
    try:
        t.insert([{"x": np.arange(20, dtype=np.float32)}])
        t.sample(2, 1)
        addr = t.placement[0]
        with dask.config.set({"gear-flow.distributed.rpc-timeout": 0.2, "gear-flow.distributed.rpc-retries": 1}):
            dist_client.run(_hold_locks, t.name, workers=[addr])
            t0 = time.monotonic()
            with pytest.raises(gf.GearFlowError, match="did not answer .* within 0.4 s although the scheduler"):
                t.sample(2, 1)
            assert time.monotonic() - t0 >= 0.4
            assert not t.lost  # slow is not lost
            dist_client.run(_let_go, workers=[addr])
            assert len(t.sample(2, 1)) == 2  # the worker still answers
        with dask.config.set({"gear-flow.distributed.rpc-timeout": 0.2, "gear-flow.distributed.rpc-retries": 100}):
            dist_client.run(_hold_locks, t.name, workers=[addr])
            got = []
            th = threading.Thread(target=lambda: got.append(t.sample(2, 1)))
            t0 = time.monotonic()
            th.start()
            while time.monotonic() - t0 < 0.7:  # several timeouts pass while the request waits for the lock
                assert th.is_alive()
            dist_client.run(_let_go, workers=[addr])
            th.join(30)
            assert len(got) == 1 and len(got[0]) == 2 and not t.lost
    finally:
        t.close()


def test_a_scheduler_that_does_not_say_whether_a_worker_lives_does_not_stop_the_wait_from_ending(dist_client):
    """The liveness question is bounded too: with the scheduler silent about it (its handler held here)
    and the worker silent (a lock held), the request still ends after its retries, saying it is unknown."""
    import threading

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=1)
    with dask.config.set({"gear-flow.distributed.reader-draw": False}):  # the owner draws: its requests are tested
        t = DistributedTable.create(dist_client, spec, sampler=gf.Uniform(), seed=0)
    plugin = dist_client.cluster.scheduler.plugins[COORDINATOR_NAME]
    release = []

    async def silent_on_liveness(name, address):  # the operation itself, whichever way the question came
        import asyncio

        ev = asyncio.Event()
        release.append(ev)
        await ev.wait()
        return True

    try:
        t.insert([{"x": np.arange(20, dtype=np.float32)}])
        t.sample(2, 1)
        addr = t.placement[0]
        got = []

        def sample():
            try:
                got.append(t.sample(2, 1))
            except gf.GearFlowError as e:
                got.append(e)

        with dask.config.set({"gear-flow.distributed.rpc-timeout": 0.2, "gear-flow.distributed.rpc-retries": 1}):
            dist_client.run(_hold_locks, t.name, workers=[addr])
            plugin._worker_alive = silent_on_liveness
            th = threading.Thread(target=sample)
            th.start()
            th.join(20)
            assert not th.is_alive(), "the request waited for the scheduler's answer for ever"
        assert len(got) == 1 and isinstance(got[0], gf.GearFlowError), got
        msg = str(got[0])
        assert "did not answer 'sample_" in msg and "within 0.4 s although the scheduler did not say" in msg, msg
        assert not t.lost
    finally:
        del plugin._worker_alive
        for ev in release:
            dist_client.loop.add_callback(ev.set)
        dist_client.run(_let_go, workers=[addr])
        t.close()


def test_deferred_updates_sample_the_same_distribution_as_waited_ones(table):
    """Chi-square: priorities set with wait=False are drawn in proportion (alpha=1 here: p_i = w_i / sum w)
    and every reported probability is that p_i, over many steps.  The one sample that carries an update
    splits its rows over the shards with the masses planned before it (its rows report the probability
    of the draw made: shard share planned x w_i / shard mass at the draw), so the check starts after it."""
    from helpers import chi2_critical

    t = table  # Prioritized(1.0, 0.4), 40 items on 2 shards
    seen = set()
    while len(seen) < 40:
        seen.update(t.sample(64, 1).keys.numpy().tolist())
    keys = np.array(sorted(seen), dtype=np.int64)
    where = {int(k): i for i, k in enumerate(keys)}
    shard_of = decode(keys)[0]
    rng = np.random.default_rng(7)
    for _ in range(3):  # new priorities, all without waiting
        w = rng.random(40) * 4 + 0.25
        t.update_priorities(keys, w, wait=False)
        carrier = t.sample(64, 1)  # applies the update before its draws
        idx = np.array([where[int(k)] for k in carrier.keys.numpy()])
        p = carrier.probabilities.numpy()
        for s in (0, 1):  # within a shard: w_i over the shard's new mass, times one planned share
            m = shard_of[idx] == s
            if m.any():
                share = p[m] / (w[idx[m]] / w[shard_of == s].sum())
                assert np.allclose(share, share[0])
        counts = np.zeros(40)
        for _ in range(60):
            b = t.sample(64, 1)
            i = np.array([where[int(k)] for k in b.keys.numpy()])
            assert np.allclose(b.probabilities.numpy(), w[i] / w.sum())  # exact again: masses came back
            counts += np.bincount(i, minlength=40)
        expected = counts.sum() * w / w.sum()
        stat = float(((counts - expected) ** 2 / expected).sum())
        assert stat < chi2_critical(39), stat
