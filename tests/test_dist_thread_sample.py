"""Samples served in the learner's thread (:mod:`gear_flow.distributed.thread_sample`).

A handle whose shards are all its own worker's or behind a lane (on its
machine: mapped shared rings and a fast lane; elsewhere: a TCP lane) draws
over blocking lane sockets and copies the windows in its own thread.  It must answer exactly as the event loop's path
does (same plan, same draws, same rows, in order), count every draw once, and
hand a sample it cannot finish to the event loop with nothing left behind.  A
priority update that waits takes the same road (:mod:`gear_flow.distributed.thread_update`)
and must set exactly what it was given, after any update stored before it.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from dist_support import handed

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.keys import decode


def _spec(num_shards=2):
    return gf.TableSpec((gf.ColumnSpec("x", (2,), np.float32),), capacity=512, num_shards=num_shards)


def _episode(tag: int, n: int) -> dict:
    t = np.arange(n, dtype=np.float32)
    return {"x": np.stack([np.full(n, tag, np.float32), t], axis=1)}


def _check(b) -> None:
    """Every valid step of every window: its episode's tag and consecutive timesteps from the row's own."""
    x, mask, ts = b["x"].numpy(), b.mask.numpy(), b.timesteps.numpy()
    for r in range(len(x)):
        v = x[r][mask[r]]
        assert np.all(v[:, 0] == v[0, 0]) and v[0, 0] >= 1, v
        assert np.array_equal(v[:, 1], ts[r] + np.arange(len(v))), (v, ts[r])


@pytest.fixture(params=["shared-memory", "reader-draw", "tcp-lane"])
def handed_table(dist_client, request):
    """Shards on both workers, read from shared memory with draws over the fast lanes (the owners draw) or
    drawn by the handle itself from their published selection state, or with shared memory off (as from
    another machine) drawn over the workers' TCP lanes, their windows in the replies: a handle on the table
    and the transport context it is handed (:func:`dist_support.handed`), where the test reads and breaks
    its lanes."""
    shared = request.param != "tcp-lane"
    with dask.config.set(
        {
            "gear-flow.distributed.shared-memory": shared,
            "gear-flow.distributed.reader-draw": request.param == "reader-draw",
            "gear-flow.distributed.fast-lane": True,
            "gear-flow.distributed.tcp-lane": True,
        }
    ):
        t = DistributedTable.create(dist_client, _spec(), sampler=gf.Prioritized(0.8, 0.5), seed=0)
        h, ctx = handed(t, seed=0)
    h.plane = request.param
    try:
        h.insert([_episode(i + 1, 40 + 7 * i) for i in range(6)], priorities=np.linspace(0.5, 3.0, 345))  # one per step
        yield h, ctx
    finally:
        t.close()


@pytest.fixture
def table(handed_table):
    """The handle of :func:`handed_table`."""
    return handed_table[0]


@pytest.fixture
def ctx(handed_table):
    """The transport context :func:`table` is handed."""
    return handed_table[1]


@pytest.mark.parametrize(("B", "L"), [(32, 4), (1024, 128)])  # 1 KB; 1 MB of windows (read from both at once)
def test_a_learner_samples_in_its_thread_exactly_as_the_event_loop_does(table, ctx, dist_client, B, L):
    with dask.config.set({"gear-flow.distributed.fast-lane": False}):  # this handle: Dask's comm only
        loop, loop_ctx = handed(table.name, client=dist_client, seed=0)  # attached, on a context of the test's own
        loop.reader_draw = table.reader_draw  # the same draws, by the owners or by the handle itself
        loop.sample(8, L, boundary="pad_tail")  # shared rings mapped (shared-memory plane), no lane learnt
    table.sample(8, L, boundary="pad_tail")  # the lanes learnt, the masses of L-step windows kept
    assert not loop_ctx.lanes.paths and set(ctx.lanes.paths) == set(table.placement.values())
    here0, loop0 = table.stats["in_thread"], loop.stats["in_thread"]
    for step in range(12):
        a = table.sample(B, L, boundary="pad_tail", rng=np.random.default_rng(step))
        b = loop.sample(B, L, boundary="pad_tail", rng=np.random.default_rng(step))
        _check(a)
        for f in ("keys", "probabilities", "weights", "mask", "timesteps", "episode_ids"):
            assert np.array_equal(getattr(a, f).numpy(), getattr(b, f).numpy()), (step, f)
        assert np.array_equal(a["x"].numpy(), b["x"].numpy()), step
    assert table.stats["in_thread"] - here0 == 12  # every one of them in the caller's thread ...
    assert loop.stats["in_thread"] == loop0 == 0  # ... and none of the other handle's
    if table.plane != "tcp-lane":
        assert table.stats["remote_bytes"] == 0 and table.stats["shared_bytes"] > 0
    else:
        assert table.stats["remote_bytes"] > 0 and table.stats["shared_bytes"] == 0
        assert all(p.startswith("tcp://") for p in ctx.lanes.paths.values())


def owner_draws(table):
    if table.plane == "reader-draw":
        pytest.skip("no lane carries a draw: the handle draws from the shards' published state")


def test_every_draw_is_counted_once_when_a_lane_fails_mid_sample(table, ctx):
    owner_draws(table)
    table.sample(16, 1)
    sampled = table.info()["totals"]["sampled"]
    addr = sorted(ctx.lanes.paths)[0]
    ctx.lanes.paths[addr] = "/nonexistent/gear-flow-lane"  # that worker's lane gone: the other's draw ran
    here = table.stats["in_thread"]
    b = table.sample(64, 1)  # undone in the thread, served by the event loop (over the comm for that worker)
    _check(b)
    assert table.stats["in_thread"] == here and addr not in ctx.lanes.paths
    table.flush()
    assert table.info()["totals"]["sampled"] == sampled + 64  # the abandoned draws were given back


def test_a_draw_whose_lane_reply_is_lost_is_not_drawn_again(table, ctx, dist_client):
    """The event loop's path: a worker drew and its lane broke before the reply.  The sample fails (the
    worker may have drawn, so drawing again would count twice), the draws that arrived are given back, and
    the next sample goes over the comm to that worker."""
    from lane_support import break_lane_after

    from gear_flow.distributed.plugin import PLUGIN_NAME

    owner_draws(table)
    table.sample(8, 1)  # the lanes learnt
    addr = sorted(ctx.lanes.paths)[0]
    table.flush()
    sampled = table.info()["totals"]["sampled"]
    dist_client.run(break_lane_after, "sample_part", workers=[addr])
    table._masses.clear()  # the plan asks the workers first: the event loop's path
    with pytest.raises(gf.GearFlowError, match=r"reply to 'sample_part' over its lane was lost.*not sent again"):
        table.sample(256, 1)
    [[(op, ok)]] = dist_client.run(lambda dask_worker: dask_worker.plugins[PLUGIN_NAME].broke, workers=[addr]).values()
    assert (op, ok) == ("sample_part", True) and addr not in ctx.lanes.paths
    table.flush()
    lost = table.info()["totals"]["sampled"] - sampled  # that worker's draw, counted there once
    assert 0 < lost < 256
    _check(table.sample(64, 1))  # over the comm to that worker
    table.flush()
    assert table.info()["totals"]["sampled"] == sampled + lost + 64


def _colocated(name: str, n: int) -> dict:
    from gear_flow.distributed import DistributedTable as DT

    t = DT.attach(name, seed=3)
    t.sample(16, 4, boundary="pad_tail")  # the other worker's rings mapped, its lane learnt
    here = t.stats["in_thread"]
    for _ in range(n):
        _check(t.sample(16, 4, boundary="pad_tail"))
    return {**t.stats, "here": t.stats["in_thread"] - here}


def test_a_colocated_learner_reads_its_own_shard_in_place_and_the_other_through_its_lane(table, dist_client):
    w0 = table.placement[0]
    st = dist_client.submit(_colocated, table.name, 10, workers=[w0], pure=False).result(timeout=60)
    assert st["here"] == 10, st
    other = ("shared_bytes", "remote_bytes") if table.plane != "tcp-lane" else ("remote_bytes", "shared_bytes")
    assert st["local_bytes"] > 0 and st[other[0]] > 0 and st[other[1]] == 0, st


def _ratios(b, prio: dict, alpha: float = 0.8) -> None:
    """Rows of ``b`` whose priorities ``prio`` knows: their probabilities stand as those priorities ** alpha."""
    keys, p = b.keys.numpy(), b.probabilities.numpy()
    rows = [r for r in range(len(keys)) if int(keys[r]) in prio]
    assert len(rows) >= 2
    w = np.array([prio[int(keys[r])] ** alpha for r in rows])
    np.testing.assert_allclose(p[rows] / p[rows[0]], w / w[0], rtol=1e-9)


def test_a_waiting_update_goes_from_the_learners_thread_and_sets_exactly_what_it_was_given(table):
    """An update that waits is sent over the lanes from the caller's thread (no event loop), to both
    workers; its result counts the keys gone as stale; the next samples draw by the new priorities."""
    table.sample(8, 1)  # the lanes learnt, the masses kept
    rng = np.random.default_rng(5)
    prio: dict[int, float] = {}
    here, sent = table.stats["updates_in_thread"], table.requests["update"]
    for step in range(6):
        keys = np.unique(table.sample(64, 1, rng=np.random.default_rng(step)).keys.numpy())
        assert set(decode(keys)[0].tolist()) == {0, 1}, step  # both workers' shards
        gone = keys[:2] if step == 3 else keys[:0]
        if len(gone):
            assert table.delete(gone).applied == 2
        p = rng.uniform(0.1, 20.0, len(keys))
        r = table.update_priorities(keys, p)
        assert (r.applied, r.stale) == (len(keys) - len(gone), len(gone)), step
        prio.update({int(k): float(v) for k, v in zip(keys, p) if k not in set(gone.tolist())})
        for k in gone:
            prio.pop(int(k), None)
        _ratios(table.sample(512, 1, rng=np.random.default_rng(100 + step)), prio)
    assert table.stats["updates_in_thread"] - here == 6  # every one of them from this thread ...
    assert table.requests["update"] - sent >= 6  # ... as one request per worker holding its keys


def test_a_waiting_update_after_stored_ones_keeps_their_order(table):
    """Updates stored to ride along are sent first (the event loop's path), then the waiting one: a key
    updated in both ends with the waiting update's priority."""
    table.sample(8, 1)
    keys = np.unique(table.sample(64, 1, rng=np.random.default_rng(1)).keys.numpy())
    assert table.update_priorities(keys, 0.5, wait=False) is None  # stored
    here = table.stats["updates_in_thread"]
    p = np.linspace(1.0, 9.0, len(keys))
    r = table.update_priorities(keys, p)
    assert (r.applied, r.stale) == (len(keys), 0)
    assert table.stats["updates_in_thread"] == here  # the stored ones first: through the event loop
    _ratios(table.sample(512, 1, rng=np.random.default_rng(2)), {int(k): float(v) for k, v in zip(keys, p)})
    r = table.update_priorities(keys, p[::-1])  # nothing stored now: from this thread
    assert table.stats["updates_in_thread"] == here + 1 and r.applied == len(keys)
    _ratios(table.sample(512, 1, rng=np.random.default_rng(3)), {int(k): float(v) for k, v in zip(keys, p[::-1])})


def test_a_waiting_update_whose_lane_breaks_is_sent_again_through_the_event_loop(table, dist_client):
    """The worker applied its part and the lane broke before the reply: the update is sent again (setting a
    priority twice sets it once) through the event loop, and the caller gets its result, not an error."""
    from lane_support import break_lane_after

    from gear_flow.distributed.plugin import PLUGIN_NAME

    table.sample(8, 1)
    keys = np.unique(table.sample(64, 1, rng=np.random.default_rng(7)).keys.numpy())
    addr = table.placement[int(decode(keys[:1])[0][0])]
    dist_client.run(break_lane_after, "update", workers=[addr])
    here = table.stats["updates_in_thread"]
    p = np.linspace(0.2, 7.0, len(keys))
    r = table.update_priorities(keys, p)
    assert (r.applied, r.stale) == (len(keys), 0)
    [[(op, ok)]] = dist_client.run(lambda dask_worker: dask_worker.plugins[PLUGIN_NAME].broke, workers=[addr]).values()
    assert (op, ok) == ("update", True)  # it had been applied there before the lane broke
    assert table.stats["updates_in_thread"] == here  # finished by the event loop's path
    _ratios(table.sample(512, 1, rng=np.random.default_rng(8)), {int(k): float(v) for k, v in zip(keys, p)})
