"""A reader on the workers' host draws its batches itself from the shards' published selection state
(:mod:`gear_flow.distributed.reader_draw`): no owner request per batch, the distribution and probabilities
of the owners' path (both are run here), while writers insert and wrap the ring; an owner's write during a
draw makes it draw again; its updates reach the owners in order and show in its later draws."""

from __future__ import annotations

import asyncio
import os
import threading

import dask
import numpy as np
import pytest
from dist_support import wait_for
from helpers import COLUMNS, Catalog, check_windows, chi2_critical

import gear_flow as gf
from gear_flow.distributed import DistributedTable, reader_draw
from gear_flow.keys import decode
from gear_flow.storage.shared import segment_owner

#: steps per episode; step k of every episode has priority k + 1
K = 8
ALPHA = 0.7


def table(client, reader: bool, capacity=256, item_unit="step", **kw):
    spec = gf.TableSpec(COLUMNS, capacity=capacity, num_shards=2, item_unit=item_unit)
    with dask.config.set({"gear-flow.distributed.reader-draw": reader}):
        return DistributedTable.create(client, spec, sampler=gf.Prioritized(ALPHA, 0.5), seed=1, **kw)


def check_rows(b, L):
    """Every window, from its data alone (writers may be inserting it): one episode's consecutive steps from
    the row's timestep, its tag the same in every column, padded past the episode's end only."""
    obs, ep, ts, mask = b["obs"].numpy(), b["ep"].numpy(), b["t"].numpy(), b.mask.numpy()
    for r in range(len(b)):
        v = np.flatnonzero(mask[r])
        t0, tag = int(b.timesteps[r]), int(ep[r, 0])
        assert len(v) == min(L, K - t0) and v[0] == 0, (r, mask[r])
        assert (ep[r, v] == tag).all() and np.array_equal(ts[r, v], t0 + np.arange(len(v)))
        assert np.array_equal(obs[r, v], np.stack([np.full(len(v), tag), ts[r, v], 1000 * tag + ts[r, v]], 1))
        assert not obs[r, ~mask[r]].any()


def same_batches(t, owners, seeds: int, B: int, L: int) -> list:
    """One seed, one batch: each seed's strict batch of the handle drawing itself and of ``owners``, row for
    row in order (every field and the ``x`` column); returns the handle's batches."""
    out = []
    for step in range(seeds):
        a = t.sample(B, L, boundary="strict", rng=np.random.default_rng(step))
        b = owners.sample(B, L, boundary="strict", rng=np.random.default_rng(step))
        for f in ("keys", "probabilities", "mask", "timesteps", "episode_ids"):
            assert np.array_equal(getattr(a, f).numpy(), getattr(b, f).numpy()), (step, f)
        assert np.array_equal(a["x"].numpy(), b["x"].numpy()), step
        out.append(a)
    return out


def fill(t, cat, tags):
    per = np.arange(1.0, K + 1) if t.spec.item_unit == "step" else np.array([2.0])
    return cat.insert(t, [(tag, K) for tag in tags], priorities=[per] * len(tags))


@pytest.mark.parametrize("reader", [True, False], ids=["reader-draw", "owner-draw"])
def test_the_step_of_the_episode_follows_its_priority_while_writers_wrap_the_ring(dist_client, reader):
    """Evictions drop whole episodes, so whichever episodes are live, step k of its episode is drawn with
    probability w_k / sum_j w_j: a chi-square over the steps drawn while two writers keep the rings wrapping.
    Within a batch, the rows of one shard report probabilities in the ratio of their weights."""
    t = table(dist_client, reader)
    cat = Catalog()
    try:
        fill(t, cat, range(1, 41))  # 320 steps over 2 x 256: the rings are full and wrap from here
        stop = threading.Event()
        errors = []

        def write(first):
            tag = first
            try:
                while not stop.is_set():
                    fill(t, cat, [tag, tag + 1])
                    tag += 2
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        writers = [threading.Thread(target=write, args=(1000 * (i + 1),)) for i in range(2)]
        for w in writers:
            w.start()
        counts = np.zeros(K)
        w = np.arange(1.0, K + 1) ** ALPHA
        try:
            for _ in range(150):
                torn = t.stats["shared_conflicts"]
                b = t.sample(64, 1, boundary="pad_tail")
                torn = t.stats["shared_conflicts"] - torn
                check_rows(b, 1)
                ts = b.timesteps.numpy()
                np.add.at(counts, ts, 1)
                shards = decode(b.keys.numpy())[0]
                p = b.probabilities.numpy()
                off = 0  # rows whose window was overwritten while copied are drawn again at the mass then
                for s in np.unique(shards):
                    rows = np.flatnonzero(shards == s)
                    ratio = p[rows] / w[ts[rows]]
                    vals, n = np.unique(np.round(ratio / ratio.max(), 9), return_counts=True)
                    common = ratio[np.isclose(ratio / ratio.max(), vals[n.argmax()], rtol=1e-9)][0]
                    off += int((~np.isclose(ratio, common, rtol=1e-9)).sum())
                assert off <= torn, (off, torn)  # a reader draws a part again whole, from one published state
        finally:
            stop.set()
            for th in writers:
                th.join()
        assert not errors, errors
        assert t.info()["totals"]["evicted"] > 0  # the rings wrapped while the batches were drawn
        expected = counts.sum() * w / w.sum()
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < chi2_critical(K - 1), (chi2, counts.tolist())
        if reader:
            assert t.stats["reader_draws"] > 0.9 * counts.sum(), t.stats
        else:
            assert t.stats["reader_draws"] == 0
    finally:
        t.close()


def test_batches_need_no_owner_request_and_report_the_true_probabilities(dist_client):
    t = table(dist_client, True)
    cat = Catalog()
    try:
        fill(t, cat, range(1, 21))
        t.sample(8, 2, boundary="pad_tail")  # the routes learnt, the shards mapped
        before = dict(t.requests)
        w = np.arange(1.0, K + 1) ** ALPHA
        total = 20 * w.sum()  # every item of the table's weight
        for _ in range(20):
            b = t.sample(32, 2, boundary="pad_tail")
            check_windows(b, cat, 2, "pad_tail")
            np.testing.assert_allclose(b.probabilities.numpy(), w[b.timesteps.numpy()] / total, rtol=1e-9)
            np.testing.assert_allclose(b.priorities.numpy(), b.timesteps.numpy() + 1.0)
        sent = {op: n - before.get(op, 0) for op, n in t.requests.items() if n != before.get(op, 0)}
        # no draw, mass or update request: only the samples drawn, counted to the owners in the background
        # (one request per owner per distributed.reader-flush at most)
        assert set(sent) <= {"count_drawn"}, sent
        assert t.stats["reader_draws"] >= 20 * 32 and t.stats["reader_fallbacks"] == 0, t.stats
        info = t.info()  # the owners count the draws (reported by the flush info makes first)
        assert info["totals"]["sampled"] == info["rate_limiter"]["samples"] == 8 + 20 * 32, info
        r = info["reader"]
        assert r["enabled"] and r["draws"] >= 20 * 32 and r["fallbacks"] == 0, r
        assert r["updates_waiting"] == 0 and r["draws_uncounted"] == 0 and r["flush_s"] > 0, r
    finally:
        t.close()


def test_an_owner_writing_during_draws_makes_the_reader_draw_again(dist_client):
    """A writer that never stops: some draws see the owner's version move and are drawn again, and every
    window handed out is whole and its episode's."""
    t = table(dist_client, True, capacity=64)
    cat = Catalog()
    try:
        fill(t, cat, range(1, 9))
        stop = threading.Event()

        def write():
            tag = 100
            while not stop.is_set():
                fill(t, cat, [tag])
                tag += 1

        th = threading.Thread(target=write)
        th.start()
        try:
            deadline_batches = 4000
            n = 0
            while t.stats["reader_redraws"] == 0 and n < deadline_batches:
                check_rows(t.sample(128, 4, boundary="pad_tail"), 4)
                n += 1
        finally:
            stop.set()
            th.join()
        assert t.stats["reader_redraws"] > 0, (n, t.stats)
    finally:
        t.close()


def test_updates_reach_the_owners_in_order_and_show_in_the_readers_draws(dist_client):
    t = table(dist_client, True)
    cat = Catalog()
    try:
        r = fill(t, cat, range(1, 11))
        keys = np.concatenate([fk + np.arange(K) for fk in r.first_keys])
        for p in (5.0, 0.0, 3.0):  # the last one wins
            t.update_priorities(keys[:K], np.full(K, p), wait=False)  # episode 1: stored, in order
        assert t.sample(16, 1).probabilities.numpy().min() > 0  # drawn while they wait to be sent
        wait_for(lambda: not len(t._pending) and not t._drawn.scheduled, "the stored updates sent in the background")
        b = t.sample(2000, 1, boundary="pad_tail")
        w = np.arange(1.0, K + 1) ** ALPHA
        total = 9 * w.sum() + K * 3.0**ALPHA
        ep1 = b.episode_ids.numpy() == int(r.episode_ids[0])
        assert ep1.any()
        np.testing.assert_allclose(b.probabilities.numpy()[ep1], 3.0**ALPHA / total, rtol=1e-9)
        np.testing.assert_allclose(b.priorities.numpy()[ep1], 3.0)
        t.update_priorities(keys[:K], np.zeros(K))  # waited for: the next draw sees it
        b = t.sample(2000, 1, boundary="pad_tail")
        assert not (b.episode_ids.numpy() == int(r.episode_ids[0])).any()
        drawn = t.sample(32, 1).keys.numpy()  # keys this handle was handed: their updates may wait
        t.update_priorities(drawn, np.full(32, 2.0), wait=False)
        assert reader_draw.state(t)["updates_waiting"] == 32  # the lag, readable (info() flushes first)
        assert t.info()["reader"]["updates_waiting"] == 0
    finally:
        t.close()


@pytest.mark.parametrize("item_unit", ["step", "episode"])
@pytest.mark.parametrize("boundary", ["strict", "pad_tail", "pad_head"])
def test_a_seed_gives_the_same_batch_whoever_draws_it(dist_client, boundary, item_unit):
    """The handle draws each worker's part with the seed and in the order its owner would: one seed, one
    batch, row for row, whether the handle or the owners drew it (the first batch of a window length is
    the owners', until they publish its tail mass: the same batch still)."""
    t = table(dist_client, True, item_unit=item_unit)
    cat = Catalog()
    try:
        lengths = [3 + tag % 7 for tag in range(1, 31)]
        n = sum(lengths) if item_unit == "step" else len(lengths)
        cat.insert(t, [(tag, n_) for tag, n_ in zip(range(1, 31), lengths)], priorities=np.linspace(0.5, 4.0, n))
        with dask.config.set({"gear-flow.distributed.reader-draw": False}):
            owners = DistributedTable.attach(t.name, client=dist_client)
        for step in range(8):
            a = t.sample(48, 4, boundary=boundary, rng=np.random.default_rng(step))
            b = owners.sample(48, 4, boundary=boundary, rng=np.random.default_rng(step))
            check_windows(a, cat, 4, boundary, item_unit)
            for f in ("keys", "probabilities", "weights", "mask", "timesteps", "episode_ids", "priorities"):
                assert np.array_equal(getattr(a, f).numpy(), getattr(b, f).numpy()), (step, f)
            for c in ("obs", "ep", "t", "done"):
                assert np.array_equal(a[c].numpy(), b[c].numpy()), (step, c)
        assert t.stats["reader_draws"] > 0 and owners.stats["reader_draws"] == 0, (t.stats, owners.stats)
    finally:
        t.close()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_a_part_left_to_its_owner_is_drawn_with_the_seed_from_the_start(dist_client, sampler):
    """A strict draw whose windows seldom fit gives up here after its rejection rounds and leaves the part to
    the owner: the owner draws its worker's whole part (two shards here) with the seed, from the start, as it
    would have drawn it; the batch is the owners', row for row.  The owner had drawn it with a fresh seed, and
    the worker's other shard stayed drawn here: the batch of the first seed already differed."""
    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=4)
    kind = gf.Uniform() if sampler == "uniform" else gf.Prioritized(1.0, 0.5)
    with dask.config.set({"gear-flow.distributed.reader-draw": True, "gear-flow.distributed.mass-max-age": 0}):
        t = DistributedTable.create(dist_client, spec, sampler=kind, seed=0)
    try:
        with dask.config.set({"gear-flow.distributed.reader-draw": False}):
            owners = DistributedTable.attach(t.name, client=dist_client)
        for s in range(4):  # a window of 5 steps fits 3 items in 45 of each shard (above the listed draw's share)
            eps = [{"x": 100 * s + 10 * e + np.arange(5, dtype=np.float32)} for e in range(3)]
            t.insert(eps + [{"x": np.full(1, -1.0, np.float32)}] * 30, priorities=1.0, shard=s)
        t.sample(8, 5, boundary="strict")  # the owners publish this length's tail mass
        left = t.stats["reader_fallbacks"]
        for a in same_batches(t, owners, 10, 6, 5):
            assert (a["x"].numpy() >= 0).all()  # every window fits: one episode's 5 steps
        assert t.stats["reader_fallbacks"] > left and t.stats["reader_draws"] > 0, t.stats  # both paths ran
    finally:
        t.close()


def test_a_shard_whose_strict_windows_hold_a_billionth_of_its_weight_is_planned_as_its_owner_plans_it(dist_client):
    """Shard 0's fitting items hold 4e-10 of its weight: the cached tail mass cannot tell that from nothing, so
    its owner sums them, and the handle drawing from published state leaves that shard's mass to the owner
    too: one seed, one batch, whoever draws it (the first level's multinomial draws differently for a share
    of 0 and a tiny one)."""
    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=2)
    with dask.config.set({"gear-flow.distributed.reader-draw": True}):
        t = DistributedTable.create(dist_client, spec, sampler=gf.Prioritized(1.0, 0.0), seed=0)
    try:
        with dask.config.set({"gear-flow.distributed.reader-draw": False}):
            owners = DistributedTable.attach(t.name, client=dist_client)
        t.insert({"x": np.arange(3, dtype=np.float32)}, priorities=[1e-6, 3e-6, 1e4], shard=0)
        t.insert([{"x": 10 + np.arange(4, dtype=np.float32)}] * 4, priorities=1e-6, shard=1)
        t.sample(8, 2, boundary="strict")  # the owners publish this length's tail mass
        same_batches(t, owners, 8, 64, 2)
        assert t.stats["reader_draws"] > 0, t.stats  # shard 1's parts drawn from its published state
    finally:
        t.close()


def test_a_strict_draw_whose_items_hold_almost_no_weight_is_the_owners_listed_draw(dist_client):
    """Strict windows whose items hold just under ``LISTED_BELOW`` of the weight: the owners list those items
    and draw among them, so the handle leaves every such part to its owner (a rejection draw here, which
    would often succeed in its rounds of one item, would give another batch for the seed), and the batch is
    the one the owners draw for the seed."""
    from gear_flow.tails import LISTED_BELOW

    t = table(dist_client, True)
    cat = Catalog()
    try:
        lengths = [1 + tag % 4 for tag in range(1, 41)]  # windows of 4 fit only the first step of 4-step episodes
        pr = [np.where(np.arange(n) == 0, 1.0, 40.0) if n == 4 else np.full(n, 40.0) for n in lengths]
        share = sum(float(p[0] ** ALPHA) for p, n in zip(pr, lengths) if n == 4) / sum((p**ALPHA).sum() for p in pr)
        assert 0.5 * LISTED_BELOW < share < LISTED_BELOW
        cat.insert(t, list(zip(range(1, 41), lengths)), priorities=pr)
        with dask.config.set({"gear-flow.distributed.reader-draw": False}):
            owners = DistributedTable.attach(t.name, client=dist_client)
        t.sample(1, 4)  # the owners publish the tail mass of this length
        for step in range(40):
            a = t.sample(1, 4, rng=np.random.default_rng(step))
            b = owners.sample(1, 4, rng=np.random.default_rng(step))
            check_windows(a, cat, 4, "strict", "step")
            for f in ("keys", "probabilities", "timesteps", "episode_ids"):
                assert np.array_equal(getattr(a, f).numpy(), getattr(b, f).numpy()), (step, f)
        assert t.stats["reader_draws"] == 0 and t.stats["reader_fallbacks"] >= 40, t.stats
    finally:
        t.close()


READER = """
import sys
import numpy as np
from distributed import Client
from gear_flow.distributed import DistributedTable

client = Client(sys.argv[1])
t = DistributedTable.attach(sys.argv[2], client=client)
first = [int(k) for k in sys.argv[3].split(",")]
for e in range(10_000):
    k = e % len(first)
    t.sample(16, 1)  # drawn here, from the owners' published state
    t.update_priorities(np.arange(first[k], first[k] + 8), np.full(8, 1.0 + e))  # waited for: acknowledged
    print(k, 1.0 + e, flush=True)
"""


def test_a_reader_killed_while_it_updates_loses_nothing_acknowledged(dist_client, tmp_path):
    """A learner process drawing for itself and updating priorities is killed mid-stream: every update it
    was told was applied is at the owners, the last one of each episode wins."""
    import subprocess
    import sys

    t = table(dist_client, True)
    cat = Catalog()
    try:
        r = fill(t, cat, range(1, 5))
        script = tmp_path / "reader.py"
        script.write_text(READER)
        first = ",".join(str(int(k)) for k in r.first_keys)
        p = subprocess.Popen(
            [sys.executable, str(script), dist_client.scheduler.address, t.name, first],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        acked = {}
        try:
            for line in p.stdout:
                k, prio = line.split()
                acked[int(k)] = float(prio)
                if len(acked) == 4 and min(acked.values()) > 8:  # each episode updated twice at least
                    break
        finally:
            p.kill()
            p.wait()
        b = t.sample(3000, 1, boundary="pad_tail")
        eids = b.episode_ids.numpy()
        for k, prio in acked.items():
            rows = eids == int(r.episode_ids[k])
            assert rows.any()
            # the owner holds the last acknowledged update, or one sent after it that came through too
            got = set(b.priorities.numpy()[rows].tolist())
            assert len(got) == 1 and got.pop() >= prio, (k, prio)
    finally:
        t.close()


def test_a_closed_handle_keeps_no_owner_segment_mapped_and_leaves_no_draw_uncounted(dist_client):
    """close() sends what the owners have not learnt (stored updates, samples drawn here) and drops the
    shards' mappings then, not when the handle is collected."""
    t = table(dist_client, True)
    cat = Catalog()
    owners = set(dist_client.run(os.getpid).values())

    def mapped() -> list[str]:
        with open("/proc/self/maps") as f:
            return [ln for ln in f if segment_owner(os.path.basename(ln.split()[-1])) in owners]

    with dask.config.set({"gear-flow.distributed.reader-flush": 600}):  # only close() sends them
        fill(t, cat, range(1, 11))
        b = t.sample(16, 1, boundary="pad_tail")
        t.update_priorities(b.keys.numpy(), np.full(16, 2.0), wait=False)
        assert mapped()  # the reader draws from the owners' segments
        assert t.info()["reader"]["draws"] > 0
        drawn = t.stats["reader_draws"]
        t.sample(16, 1, boundary="pad_tail")
        t.update_priorities(b.keys.numpy(), np.full(16, 3.0), wait=False)
        assert t.stats["reader_draws"] == drawn + 16
        assert reader_draw.state(t)["draws_uncounted"] == 16  # not sent yet: read without the flush info() makes
        t.close(drop=False)
        assert not mapped()
        r = reader_draw.state(t)
        assert r["draws_uncounted"] == 0 and r["updates_waiting"] == 0, r


def test_a_flush_returns_only_once_an_earlier_flush_in_flight_has_reached_the_owners(dist_client):
    """A background flush may have taken the counts when ``flush()`` is called: ``flush()`` waits for it, so
    what it returns to (``info()``, a snapshot of the owners) counts every draw."""
    t = table(dist_client, True)
    cat = Catalog()
    try:
        with dask.config.set({"gear-flow.distributed.reader-flush": 600}):
            fill(t, cat, range(1, 11))
            t.sample(16, 1, boundary="pad_tail")
            assert reader_draw.state(t)["draws_uncounted"] == 16

            async def both():
                first = asyncio.ensure_future(reader_draw.flush(t))
                await asyncio.sleep(0)  # the first has taken the counts and waits for the owners' answers
                assert reader_draw.state(t)["draws_uncounted"] == 0
                await reader_draw.flush(t)
                return first.done()

            assert t.client.sync(both)
        info = t.info()
        assert info["totals"]["sampled"] == 16, info["totals"]
    finally:
        t.close()


def test_a_sample_given_up_says_why_its_last_attempt_was_redone(dist_client):
    """An owner's stale selection (or a reader's torn windows) redoes the sample; given up, the error names
    the last attempt's reason in the owner's words, not a guess at lost workers."""
    from gear_flow.distributed.host_sampling import StaleSelectionError
    from gear_flow.distributed.sampling import RemoteSample, redone_too_often
    from gear_flow.distributed.transport import Retry

    t = table(dist_client, False)
    try:
        out = gf.SampleBuffers(t.spec, t.spec.names, 4, 1)
        part = RemoteSample(t, out, 1, "strict", tuple(t.spec.names), np.random.default_rng(0), None, True, None)
        part.raise_errors([])  # no error: nothing raised
        why = "shard 1: a chosen item was removed before the gather"
        with pytest.raises(Retry) as redo:
            part.raise_errors([StaleSelectionError(why)])
        assert str(redo.value) == why
        assert str(redone_too_often(t, redo.value)).endswith(f"was redone 8 times and given up; the last time: {why}")
        assert str(redone_too_often(t, Retry())).endswith("the last time: workers lost or shards moved meanwhile")
        with pytest.raises(ValueError, match="not a stale one"):  # any other error as it came
            part.raise_errors([ValueError("not a stale one")])
    finally:
        t.close()


def test_a_batch_after_an_update_that_waited_draws_with_it_and_reports_it(dist_client):
    """docs/distributed.md: a handle drawing itself sends nothing per sample, so an update with wait=False
    reaches the owners in the background; one with wait=True is applied before it returns, and the very next
    batch drawn from the published state reports the new priority and draws the item by it (K items of one
    episode on each shard, one raised to 1000: its probability is its weight over the table's)."""
    t = table(dist_client, True)
    cat = Catalog()
    try:
        fill(t, cat, range(1, 3))
        first = t.sample(4, 1)  # the routes learnt, the shards mapped: the batches below are the handle's own
        key = int(first.keys.numpy()[0])
        t.update_priorities(np.array([key]), [1000.0], wait=True)
        before = t.stats["reader_draws"]
        b = t.sample(64, 1)
        assert t.stats["reader_draws"] - before == 64, t.stats  # drawn by the handle, from the published state
        hit = b.keys.numpy() == key
        w = np.arange(1.0, K + 1) ** ALPHA
        mass = 2 * w.sum() - w[int(first.timesteps.numpy().ravel()[0])] + 1000.0**ALPHA
        assert hit.sum() > 32, hit.sum()  # p = 1000**0.7 / mass ~ 0.94
        np.testing.assert_allclose(b.probabilities.numpy()[hit], 1000.0**ALPHA / mass, rtol=1e-9)
        assert (b.priorities.numpy()[hit] == 1000.0).all()
    finally:
        t.close()
