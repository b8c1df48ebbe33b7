"""The distributed table under concurrency: exact probabilities, global order, queues, atomic inserts.

Real worker processes (the session's 2-worker LocalCluster); writers, samplers,
producers and consumers run at the same time as threads of this process and
as tasks on the workers.  No sleeps: threads meet on events and counters.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import numpy as np
import pytest
from dist_support import assert_same, context, coordinator, snapshot
from helpers import chi2_critical, delete_race

import gear_flow as gf
from gear_flow.distributed import DistributedTable, ShardHost, edits, transactions
from gear_flow.keys import decode
from gear_flow.sample import SampleBuffers
from gear_flow.table import planner
from gear_flow.table.config import TableConfig

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("data_plane")]

X = (gf.ColumnSpec("x", (), np.float32),)
TAG = (gf.ColumnSpec("tag", (), np.int64),)


def ones(n, start=0.0):
    return [{"x": np.array([start + i], np.float32)} for i in range(n)]


def tagged(tags):
    return [{"tag": np.array([t], np.int64)} for t in tags]


# -- exact probabilities --------------------------------------------------------------------------------
def test_host_reports_the_probability_of_the_draw_made():
    """Mass 4 when planned, 16 when drawn: an old item's probability is 1/16, not 1/4."""
    cfg = TableConfig.build(gf.TableSpec(X, capacity=64), sampler=gf.Prioritized(1.0, 0.0))
    host = ShardHost()
    host.create("t", cfg.to_dict(), [0])

    def put(txn, n, first):
        part = {
            "shard": 0,
            "chunks": [{"x": np.zeros(1, np.float32)} for _ in range(n)],
            "lengths": np.ones(n, np.int64),
            "episode_ids": np.arange(first, first + n),
            "stamps": np.arange(first, first + n),
            "priorities": np.ones(n),
        }
        host.write("t", txn, [part])

    put("a", 4, 0)
    planned = host.summaries("t", ("sampler",))["sampler"][0]
    put("b", 12, 4)  # a writer lands between the plan and the draw
    res = host.sample_part("t", 1, "pad_tail", ("x",), seed=1, counts={0: 2000}, scale={0: planned / planned})
    p = res[0]["p"]
    assert planned == 4.0
    np.testing.assert_allclose(p, 1 / 16)
    assert len(np.unique(res[0]["seqs"])) == 16  # the new items were drawable too
    assert p[np.unique(res[0]["seqs"], return_index=True)[1]].sum() == pytest.approx(1.0)


def test_a_request_sent_again_after_its_reply_was_lost_is_applied_once():
    """A handle that lost a reply sends the same stage or write again (over the comm): the worker stages and
    writes it once and answers as the first time; the same transaction with other parts is refused."""
    from gear_flow.errors import SpecError

    cfg = TableConfig.build(gf.TableSpec(X, capacity=64), sampler=gf.Uniform())
    host = ShardHost()
    host.create("t", cfg.to_dict(), [0])

    def part(n, first):
        return {
            "shard": 0,
            "chunks": [{"x": np.full(1, first + i, np.float32)} for i in range(n)],
            "lengths": np.ones(n, np.int64),
            "episode_ids": np.arange(first, first + n),
            "stamps": np.arange(first, first + n),
            "priorities": None,
        }

    first = host.write("t", "w", [part(3, 0)])
    again = host.write("t", "w", [part(3, 0)])
    assert again is first and host.table("t").shards[0].size == 3
    assert host.stage("t", "s", [part(2, 3)]) == 2
    assert host.stage("t", "s", [part(2, 3)]) == 2  # staged once
    with pytest.raises(SpecError, match="already staged"):
        host.stage("t", "s", [part(4, 3)])  # other parts under the same transaction
    res = host.apply("t", "s")
    assert res["items"] == {0: 2} and host.table("t").shards[0].size == 5
    with pytest.raises(SpecError, match="already staged"):
        host.stage("t", "s", [part(2, 3)])  # applied: never staged again
    host.close()


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_probabilities_stay_exact_while_writers_insert(dist_client, tier, tmp_path):
    """Writers insert and delete heavy items on both shards while a learner samples (in memory, and on disk).

    For the 40 fixed items, the reported probabilities say how often each
    should appear in every batch (``p_i = w_i * c_s`` with ``c_s`` read from the
    batch); the counts over all batches must match that (chi-square, p=1e-4).
    Reporting the planned mass instead of the mass at the draw fails this.
    """
    disk = {"tier": "disk", "path": tmp_path / "d"} if tier == "disk" else {}
    t = DistributedTable.create(
        dist_client, gf.TableSpec(X, capacity=100_000, num_shards=2), sampler=gf.Prioritized(1.0, 0.0), seed=3, **disk
    )
    try:
        rng = np.random.default_rng(0)
        w = rng.uniform(1.0, 5.0, 40)
        fixed = {}
        for s in (0, 1):
            r = t.insert(ones(20), priorities=w[20 * s : 20 * s + 20], shard=s)
            fixed.update({int(k): (s, float(p)) for k, p in zip(r.first_keys, w[20 * s : 20 * s + 20])})
        stop = threading.Event()
        churn = Counter()
        errors = []

        def writer(s):
            try:
                while not stop.is_set():
                    r = t.insert(ones(10, 100.0), priorities=25.0, shard=s)
                    churn[s] += 1
                    t.delete(r.first_keys)
            except Exception as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(s,)) for s in (0, 1)]
        for th in threads:
            th.start()
        keys = sorted(fixed)
        index = {k: i for i, k in enumerate(keys)}
        observed = np.zeros(len(keys))
        expected = np.zeros(len(keys))
        scales = {0: set(), 1: set()}
        B = 256
        try:
            # At least 150 batches, and on until both writers' churn showed in the masses: a reader draws
            # without waiting on the owners, so on a loaded machine 150 batches may see only a few masses.
            # The stop looks at the masses only, never at which fixed items came, so the counts stay fair.
            n = 0
            while n < 150 or (n < 1500 and (min(churn.values(), default=0) < 5 or min(map(len, scales.values())) <= 5)):
                n += 1
                b = t.sample(B)
                k = b.keys.numpy()
                p = b.probabilities.numpy()
                assert np.all((p > 0) & (p <= 1))
                shard = decode(k)[0]
                c = {}
                for s in (0, 1):
                    mine = [(kk, pp) for kk, pp in zip(k, p) if kk in fixed and fixed[kk][0] == s]
                    assert mine, "a batch without fixed items of a shard: the test cannot estimate its scale"
                    ratios = np.array([pp / fixed[kk][1] for kk, pp in mine])
                    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-9)  # one draw, one mass per shard
                    c[s] = float(ratios[0])
                    scales[s].add(round(c[s], 12))
                    uniq = {kk: pp for kk, pp in zip(k, p) if shard[list(k).index(kk)] == s}
                    assert sum(uniq.values()) <= 1.0 + 1e-12
                for kk in k:
                    if kk in fixed:
                        observed[index[kk]] += 1
                for kk, (s, wi) in fixed.items():
                    expected[index[kk]] += B * wi * c[s]
        finally:
            stop.set()
            for th in threads:
                th.join()
        assert not errors, errors
        assert min(churn.values()) >= 5 and min(len(v) for v in scales.values()) > 5  # masses really moved
        stat = float(((observed - expected) ** 2 / expected).sum())
        assert stat < chi2_critical(len(keys) - 1), (stat, observed[:5], expected[:5])
    finally:
        t.close()


# -- ordered selectors, eviction --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sampler, prio, expect",
    [
        (gf.Fifo(), None, lambda tags, pr: tags),
        (gf.Lifo(), None, lambda tags, pr: tags[::-1]),
        (gf.MaxHeap(), "p", lambda tags, pr: [t for _, t in sorted(zip(-pr, tags))]),
        (gf.MinHeap(), "p", lambda tags, pr: [t for _, t in sorted(zip(pr, tags))]),
    ],
)
def test_ordered_batches_come_in_global_order(dist_client, sampler, prio, expect):
    t = DistributedTable.create(dist_client, gf.TableSpec(TAG, capacity=64, num_shards=2), sampler=sampler, seed=1)
    try:
        tags = list(range(1, 13))
        pr = np.random.default_rng(5).permutation(12).astype(float) + 1.0
        for i, tag in enumerate(tags):  # alternate shards, one insert each: insertion order interleaves them
            t.insert(tagged([tag]), priorities=None if prio is None else pr[i : i + 1], shard=i % 2)
        b = t.sample(8)
        got = b["tag"].numpy()[:, 0].tolist()
        assert got == expect(tags, pr)[:8]  # in order, not sorted
        assert sorted(set(decode(b.keys.numpy())[0].tolist())) == [0, 1]
    finally:
        t.close()


def test_eviction_continues_until_within_max_size(dist_client):
    """The oldest items sit on one shard: the global Fifo remover takes them all there first, then
    the rest from the other shard (tables accept only Fifo removers: ring storage)."""
    spec = gf.TableSpec(X, capacity=200, num_shards=2, max_size=30)
    t = DistributedTable.create(dist_client, spec, remover=gf.Fifo(), seed=2)
    try:
        t.insert(ones(3), priorities=1000.0, shard=0)
        t.insert(ones(27), priorities=0.0, shard=1)
        assert t.size == 30
        t.insert(ones(20), priorities=0.0, shard=1)
        info = t.info()
        assert info["size"] == 30 == info["coordinator_size"]
        assert info["totals"]["removed"] == 20
        assert info["shards"][0]["size"] == 0  # the heavy items went first
    finally:
        t.close()


# -- all or nothing ----------------------------------------------------------------------------------------
def _drop_on(name, dask_worker=None):
    return dask_worker.plugins["gear-flow"].host.drop(name)


def test_an_insert_failing_on_one_worker_leaves_no_trace(dist_client):
    t = DistributedTable.create(dist_client, gf.TableSpec(X, capacity=64, num_shards=2), seed=0)
    try:
        t.insert(ones(6))
        before = snapshot(t)
        # the first shard's worker loses the table (as a worker restarted by its nanny would)
        bad = t.placement[1]
        assert dist_client.run(_drop_on, t.name, workers=[bad])[bad]
        with pytest.raises(gf.GearFlowError, match="not on this worker|no table"):
            t.insert(ones(10))  # routed to both shards: staged on one, refused by the other
        after = snapshot(t)
        # the good worker's shard is unchanged: nothing of the insert is sampleable there
        good = [x for x in after[1][1] if x[0] == 0]
        assert good and all(np.array_equal(a[3], b[3]) for a, b in zip(before[1][1][:1], good))
        glob = lambda snap: {k: v for k, v in snap[1][0].items() if k not in ("next_episode_id", "next_stamp")}  # noqa: E731
        assert glob(after) == glob(before)  # size, admitted, limiter counts unchanged (ids are never reused)
        info = t.info()
        assert info["inserts_in_flight"] == 0
    finally:
        t.close()


def test_a_rejected_insert_changes_nothing_anywhere(dist_client):
    t = DistributedTable.create(dist_client, gf.TableSpec(X, capacity=8, num_shards=2), seed=0)
    try:
        t.insert(ones(4))
        before = snapshot(t)
        with pytest.raises(gf.GearFlowError):
            t.insert([{"x": np.zeros(9, np.float32)}])  # longer than a shard: refused before anything is sent
        assert_same(before, snapshot(t))
    finally:
        t.close()


# -- queues and stacks --------------------------------------------------------------------------------------
def _produce(name, pid, n, client=None):
    """Insert ``n`` tagged items; how many were inserted in this thread (a task's, into its worker's shards)."""
    t = DistributedTable.attach(name, client)  # in a task: the worker's own handle (its shards first)
    for i in range(n):
        t.insert(tagged([pid * 10_000 + i]))
    return n, t.stats["insert_in_thread"]


OBS = (gf.ColumnSpec("obs", (2,), np.float32),)


def steps(tag, n):
    """An episode of ``n`` steps whose obs are ``(tag, step)``."""
    return {"obs": np.stack([np.full(n, tag), np.arange(n)], axis=1).astype(np.float32)}


def _produce_episodes(name, pid, n, client=None):
    """Insert ``n`` episodes of 3..9 steps tagged ``pid * 10_000 + i``, one call each; calls made in this thread."""
    t = DistributedTable.attach(name, client)
    for i in range(n):
        t.insert([steps(pid * 10_000 + i, 3 + i % 7)])
    return t.stats["insert_in_thread"]


def test_a_full_table_under_actor_and_client_writers_stays_at_max_size(dist_client):
    """Two actor tasks (each into its own worker's shards) and a client thread insert episodes into a table
    held at max_size 300 (every insert evicts), while a client thread samples strict windows of 4 steps:
    every window holds consecutive steps of one episode, the table ends at exactly max_size on the workers
    and the coordinator, and every item inserted is accounted for (evicted by a ring, removed, or there)."""
    t = DistributedTable.create(dist_client, gf.TableSpec(OBS, capacity=250, num_shards=2, max_size=300), seed=0)
    try:
        for i in range(40):
            t.insert([steps(i, 10)])
        assert t.size == 300
        stop, errors, windows = threading.Event(), [], Counter()

        def read():
            try:
                while not stop.is_set():
                    o = t.sample(32, 4, boundary="strict")["obs"].numpy()
                    ok = (o[..., 0] == o[:, :1, 0]).all(1) & (np.diff(o[..., 1], axis=1) == 1).all(1)
                    windows["ok"] += int(ok.sum())
                    windows["bad"] += int((~ok).sum())
            except Exception as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        def write():
            try:
                _produce_episodes(t.name, 3, 60, dist_client)
            except Exception as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=read), threading.Thread(target=write)]
        for th in threads:
            th.start()
        workers = sorted(set(t.placement.values()))
        tasks = [dist_client.submit(_produce_episodes, t.name, pid, 60, workers=[w], pure=False) for pid, w in
                 zip((1, 2), workers)]  # fmt: skip
        dist_client.gather(tasks)
        threads[1].join()
        stop.set()
        threads[0].join()
        assert not errors, errors
        assert windows["bad"] == 0 and windows["ok"] > 0, windows
        info = t.info()
        tot = info["totals"]
        assert info["size"] == info["coordinator_size"] == sum(s["size"] for s in info["shards"]) == 300
        assert tot["inserted"] == 400 + 3 * sum(3 + i % 7 for i in range(60))
        assert tot["inserted"] == tot["evicted"] + tot["removed"] + info["size"]
    finally:
        t.close()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["queue", "stack"])
def test_queue_and_stack_hand_out_every_item_once(dist_client, kind, batch):
    """3 producers (2 worker tasks, 1 client thread), 2 consumer threads taking ``batch`` items a call, a
    queue of 8 over 2 workers (a batch of 3 is admitted only once 3 items are stored: the limiter counts
    the inserts in flight too)."""
    make = DistributedTable.queue if kind == "queue" else DistributedTable.stack
    # capacity: a stack keeps its oldest items longest; the ring must not wrap over them
    t = make(dist_client, gf.TableSpec(TAG, capacity=256, num_shards=2), 8, timeout=60, seed=0)
    n = 60
    try:
        tasks = [dist_client.submit(_produce, t.name, pid, n, pure=False) for pid in (1, 2)]
        got = {0: [], 1: []}
        ids = {0: [], 1: []}
        total = 3 * n
        taken = Counter()
        lock = threading.Lock()
        errors = []

        def consume(c):
            try:
                while True:
                    with lock:
                        if taken["n"] >= total:
                            return
                        taken["n"] += batch
                    b = t.sample(batch)
                    got[c].extend(b["tag"].numpy()[:, 0].tolist())
                    ids[c].extend(b.episode_ids.tolist())
            except Exception as e:
                errors.append(e)

        consumers = [threading.Thread(target=consume, args=(c,)) for c in (0, 1)]
        for th in consumers:
            th.start()
        _produce(t.name, 3, n, dist_client)
        for th in consumers:
            th.join()
        # the tasks' inserts waited for the limiter in their own threads (none went through the event loop)
        assert [f.result() for f in tasks] == [(n, n), (n, n)]
        assert not errors, errors
        every = got[0] + got[1]
        assert sorted(every) == sorted(pid * 10_000 + i for pid in (1, 2, 3) for i in range(n))  # each exactly once
        if kind == "queue":
            for c in (0, 1):
                assert ids[c] == sorted(ids[c])  # oldest first, across producers and workers
                for pid in (1, 2, 3):
                    mine = [x for x in got[c] if x // 10_000 == pid]
                    assert mine == sorted(mine)
        info = t.info()
        assert info["size"] == info["coordinator_size"] == 0
        assert info["totals"]["expired"] == total and info["totals"]["removed"] == 0
    finally:
        t.close()


@pytest.mark.parametrize("kind", ["queue", "stack"])
def test_inserts_written_out_of_admission_order_are_handed_out_in_stamp_order(dist_client, kind):
    """Two inserts admitted 10 then 11, both for shard 0, reach the shard 11 first (two producers racing
    between admission and the write): the ring holds them out of stamp order.  A Queue still hands out
    10 before 11 (a Stack 11 before 10): the order is the table-wide stamp, never the ring position."""
    from gear_flow.distributed.transport import call

    make = DistributedTable.queue if kind == "queue" else DistributedTable.stack
    t = make(dist_client, gf.TableSpec(TAG, capacity=64, num_shards=2), 8, timeout=10, seed=0)
    try:

        async def admit(tag):
            adm = await coordinator(t, blocking=False).admit_insert(
                n=1, episodes=1, per_shard={0: 1}, owner=t.client.id, timeout=5
            )
            part = {
                "shard": 0,
                "chunks": tagged([tag]),
                "lengths": np.ones(1, np.int64),
                "episode_ids": np.array([adm["first_episode_id"]]),
                "stamps": np.array([adm["first_stamp"]]),
                "priorities": None,
            }
            return adm["txn"], part

        async def write(txn, part):
            a = t.placement[0]
            res = await call(context(t), a, "write", table=t.name, name=t.name, txn=txn, parts=[part])
            await transactions.commit(t, txn, {a: res})

        async def race():
            older, newer = await admit(10), await admit(11)
            await write(*newer)  # the later admission is written first
            await write(*older)

        t.client.sync(race)
        t.insert(tagged([12]), shard=1)  # and one on the other shard: the merge across shards too
        got = [int(t.sample(1)["tag"].numpy()[0, 0]) for _ in range(3)]
        assert got == ([10, 11, 12] if kind == "queue" else [12, 11, 10])
        assert t.info()["size"] == 0
    finally:
        t.close()


async def _planned_up_to_the_take(t, n):
    """An ordered sample of ``n`` one-step ``tag`` rows, admitted and planned up to its take (not sent):
    ``(admission, executor, take)``; the caller sends the take, undoes and finishes the sample."""
    from gear_flow.distributed.sampling import RemoteSample

    exclusive = t._cfg.exclusive
    adm = await coordinator(t, blocking=False).admit_sample(n=n, exclusive=exclusive, owner=t.client.id, timeout=5)
    out = SampleBuffers(t.spec, ("tag",), n, 1)
    ex = RemoteSample(t, out, 1, "pad_tail", ("tag",), t.rng, adm["txn"], not exclusive, adm["horizon"])
    plan = planner.sample("ordered", n, t.rng)
    take = plan.send(await ex(next(plan)))
    assert isinstance(take, planner.Take)
    return adm, ex, take


def _six_in_two_rings_of_8(client):
    """A Fifo table over two shards of 8 slots, tags 0..5 inserted one by one, even tags on shard 0."""
    t = DistributedTable.create(
        client, gf.TableSpec(TAG, capacity=8, num_shards=2), sampler=gf.Fifo(), remover=gf.Fifo(), seed=0
    )
    for i in range(6):
        t.insert(tagged([i]), shard=i % 2)
    return t


def test_a_take_of_a_slot_overwritten_since_its_candidates_is_stale(dist_client):
    """The merge chose shard 1's oldest item; before the take, an insert wraps that shard's ring over it, so
    the slot is live again with an item inserted after the sample was admitted.  The take is refused as
    stale (it would hand out the newer item in the older one's place, its window unchecked), and the
    sample after it hands out the oldest items in order."""
    from gear_flow.distributed.transport import Retry

    t = _six_in_two_rings_of_8(dist_client)
    try:

        async def attempt():
            adm, ex, take = await _planned_up_to_the_take(t, 4)
            try:
                assert take.slots[1].tolist()[:1] == [0]  # shard 1's oldest (tag 1) chosen
                await t.insert_async(tagged(range(100, 108)), shard=1)  # its 8 slots written over: slot 0 by tag 105
                try:
                    await ex(take)
                except Retry:
                    return "stale"
                return ex.out.arrays["tag"][:, 0].tolist()  # what the take served instead (pytest's failures hang here)
            finally:
                await ex.undo()
                await coordinator(t, blocking=False).sample_finished(adm["txn"], rollback=4)

        assert t.client.sync(attempt) == "stale"
        assert t.info()["totals"]["sampled"] == 0
        assert t.sample(4)["tag"].numpy()[:, 0].tolist() == [0, 2, 4, 100]
    finally:
        t.close()


def test_an_eviction_spares_a_slot_written_over_since_its_candidates(dist_client):
    """The remover's merge chose shard 0's oldest item (tag 0, slot 0); before the removal, an insert
    wraps that shard's ring over it (slot 0 now holds tag 105).  The removal spares the newer item
    (before: it evicted tag 105, an item that was never the oldest, and nothing said so)."""
    t = _six_in_two_rings_of_8(dist_client)
    try:

        async def attempt():
            seqs = {}
            cands = await edits.answer_evict(t, planner.Candidates(1, "remover"), seqs)
            chosen = cands[0][0].tolist()[:1]  # shard 0's oldest: slot 0 (tag 0)
            await t.insert_async(tagged(range(100, 108)), shard=0)  # its 8 slots: 100 at slot 3, 105 over slot 0
            removed = await edits.answer_evict(t, planner.Evict(slots={0: np.array(chosen)}), seqs)
            return chosen, removed

        assert t.client.sync(attempt) == ([0], 0)
        info = t.info()
        assert info["size"] == info["coordinator_size"] == 11
        assert info["totals"]["removed"] == 0
        assert t.sample(11)["tag"].numpy()[:, 0].tolist() == [1, 3, 5, *range(100, 108)]
    finally:
        t.close()


def test_concurrent_inserts_past_max_size_evict_the_excess_once(dist_client):
    """Twenty one-item inserts into a full table (max_size 50), all in flight at once: each commit finds
    the table past max_size, but evictions run one at a time by the size of the moment, so together they
    remove 20 items, the 20 oldest (before: each evicted the excess it had seen, and the table emptied).
    The table's timeout of 0 is the rate limiter's: an insert waiting for another's eviction does not
    time out after it has committed."""
    spec = gf.TableSpec(TAG, capacity=400, num_shards=2, max_size=50)
    t = DistributedTable.create(dist_client, spec, sampler=gf.Fifo(), remover=gf.Fifo(), seed=0, timeout=0)
    try:
        t.insert(tagged(range(50)))

        async def together():
            return await asyncio.gather(*[t.insert_async(tagged([100 + i])) for i in range(20)])

        res = t.client.sync(together)
        info = t.info()
        assert info["size"] == info["coordinator_size"] == 50
        assert info["totals"]["removed"] == 20
        by_admission = [100 + int(i) for i in np.argsort([int(r.episode_ids[0]) for r in res], kind="stable")]
        assert t.sample(50)["tag"].numpy()[:, 0].tolist() == list(range(20, 50)) + by_admission
    finally:
        t.close()


def test_a_stale_selection_is_retried_without_losing_items(dist_client):
    """An item chosen by the merge is deleted before the take: the attempt is undone on every
    worker (nothing counted, nothing expired) and the queue still hands out the rest in order."""
    from gear_flow.distributed.transport import Retry

    t = DistributedTable.queue(dist_client, gf.TableSpec(TAG, capacity=64, num_shards=2), 16, timeout=10, seed=0)
    try:
        for i in range(6):
            t.insert(tagged([i]), shard=i % 2)

        async def attempt():
            adm, ex, take = await _planned_up_to_the_take(t, 4)
            victim = next(s for s in sorted(take.slots) if s == 1)  # shard 1's oldest, chosen
            seq = int(take.slots[victim][0])  # slot == seq before the ring wraps
            await t.delete_async([int(gf.keys.encode(victim, np.array([seq]))[0])])
            with pytest.raises(Retry):
                await ex(take)
            await ex.undo()
            await coordinator(t, blocking=False).sample_finished(adm["txn"], rollback=4)

        t.client.sync(attempt)
        tot = t.info()["totals"]
        assert (tot["sampled"], tot["expired"], tot["deleted"], tot["size"]) == (0, 0, 1, 5)
        b = t.sample(5)
        assert b["tag"].numpy()[:, 0].tolist() == [0, 2, 3, 4, 5]
        assert t.info()["totals"]["expired"] == 5
    finally:
        t.close()


@pytest.mark.parametrize("tier", ["host", "disk"])
@pytest.mark.parametrize("kind", ["local", "distributed"])
def test_uniform_batches_stay_exact_while_a_writer_wraps_the_ring(kind, tier, request, tmp_path):
    """A Uniform table without deletes draws by arithmetic over its rings (Uniform.draw) while a writer keeps
    overwriting them: every row is the step its episode id and timestep name, and the rows a shard gave a batch
    report one probability (one draw, at the shard's size then).  In memory, and on disk."""
    spec = gf.TableSpec(X, capacity=600, num_shards=2)
    disk = {"tier": "disk", "path": tmp_path / "d"} if tier == "disk" else {}
    if kind == "local":
        t = gf.LocalTable(spec, sampler=gf.Uniform(), seed=1, **disk)
    else:
        t = DistributedTable.create(request.getfixturevalue("dist_client"), spec, sampler=gf.Uniform(), seed=1, **disk)
    try:
        made = {}  # episode id -> the writer's number for it (its steps hold 1000 * number + timestep)
        stop, errors, inserts = threading.Event(), [], [0]

        def insert(g0):
            eps = [{"x": (1000.0 * (g0 + j) + np.arange(50)).astype(np.float32)} for j in range(3)]
            made.update(zip(t.insert(eps).episode_ids.tolist(), range(g0, g0 + 3)))

        insert(0)
        insert(3)

        def writer():
            try:
                g = 6
                while not stop.is_set():
                    insert(g)
                    g, inserts[0] = g + 3, inserts[0] + 1
            except Exception as e:  # surfaced below
                errors.append(e)

        th = threading.Thread(target=writer)
        th.start()
        rows = []
        try:
            n = 0
            while n < 60 or (n < 2000 and inserts[0] < 40):  # until the rings went round several times
                n += 1
                b = t.sample(64, 1)
                p, shard = b.probabilities.numpy(), decode(b.keys.numpy())[0]
                for s in np.unique(shard):
                    mine = p[shard == s]
                    np.testing.assert_allclose(mine, mine[0], rtol=1e-12)  # uniform within the shard at its draw
                    # (m_s / M planned) * (1 / m'_s at the draw): each mass between one insert (150) and the ring
                    assert 150 / 1200 / 600 <= mine[0] <= 600 / 300 / 150
                rows.append((b.episode_ids.numpy(), b.timesteps.numpy(), b["x"].numpy()[:, 0]))
        finally:
            stop.set()
            th.join()
        assert not errors, errors
        assert inserts[0] >= 40  # the rings were overwritten many times while batches were drawn
        for eid, ts, x in rows:
            expect = np.array([1000.0 * made[int(e)] for e in eid]) + ts
            np.testing.assert_array_equal(x, expect.astype(np.float32))  # in order: row by row
    finally:
        t.close()


@pytest.mark.parametrize("kind", ["queue", "fifo"])
def test_a_sample_whose_items_a_delete_took_after_its_admission_waits_and_never_finds_the_table_empty(
    dist_client, kind
):
    """A producer, a consumer and a deleter (on a second handle) deleting each item as it is stored: a
    sample admitted with an item there whose item is gone by its draw gives its admission back and waits,
    as a batch short of items does, as a LocalTable's does; it never raises EmptyTableError, nor gives up
    when the item it drew is deleted before its gather every time it is planned again."""
    spec = gf.TableSpec(X, capacity=64)
    if kind == "queue":
        t = DistributedTable.queue(dist_client, spec, 8, seed=0, name="del-race")
    else:
        t = DistributedTable.create(dist_client, spec, sampler=gf.Fifo(), max_times_sampled=1, seed=0,
                                    rate_limiter=gf.SampleToInsertRatio(1.0, 1, 2.0), name="del-race")  # fmt: skip
    other = DistributedTable.attach("del-race", client=dist_client, seed=1)
    try:
        got, deleted, errors = delete_race(t, other, items=60)
        assert errors == [] and len(got) + len(deleted) > 0
        assert sorted(set(got) & set(deleted)) == []  # each item handed out or deleted, never both
    finally:
        t.close()
