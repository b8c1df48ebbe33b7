"""The gear_flow dashboard page: its rows without a browser, then the page in a real headless Chromium.

The browser test runs a ``LocalCluster`` (real processes) with the dashboard,
two tables with traffic (one with a lost shard, one with a sample blocked by
its limiter), a learner on the client (bytes over the comm) and a co-located
one in a task (bytes in-process), opens ``/gear-flow`` in headless Chromium,
asserts on what the page shows and saves a screenshot (in the test's tmp dir,
and in ``$GEAR_FLOW_SCREENSHOT_DIR`` when set: that is how ``docs/dashboard.png``
is made).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
import urllib.request

import dask
import numpy as np
import pytest
from browser import Browser, find_chromium
from dist_support import wait_for
from helpers import episode, make_spec

import gear_flow as gf
from gear_flow.dashboard import DASHBOARD_NAME as DASHBOARD
from gear_flow.dashboard import GearFlowDashboard, report_stats
from gear_flow.dashboard.model import rates, snapshot
from gear_flow.distributed import DistributedTable
from gear_flow.resources import advertised


def _public(size=5, lost=(), waiting=(0, 0), kind="SampleToInsertRatio", inserts=10, samples=20):
    spec = make_spec(capacity=16, num_shards=2).to_dict()
    return {
        "config": {"spec": spec},
        "placement": {0: "tcp://a", 1: "tcp://b"},
        # as the coordinator keeps a lost shard: its count gone to 0, its size at the loss kept
        "lost": {s: {"size_at_loss": 2, "inserted_at_loss": 4} for s in lost},
        "shard_size": {0: 3, 1: 0 if 1 in lost else 2},
        "size": size,
        "rate_limiter": {"kind": kind, "samples_per_insert": 2.0, "inserts": inserts, "samples": samples},
        "waiting": {"inserts": waiting[0], "samples": waiting[1]},
        "inserts_in_flight": 0,
    }


def _info(shard, worker, inserted, sampled, size=3):
    return {
        "shard": shard,
        "worker": worker,
        "size": size,
        "capacity": 16,
        "steps_stored": size,
        "inserted": inserted,
        "sampled": sampled,
        "evicted": 1,
        "removed": 2,
        "expired": 0,
        "stale_updates": 4,
    }


def test_rows_and_rates_from_snapshots():
    res = {"tcp://a": {"data": 100, "overhead": 10}}
    a = snapshot({"t": _public(lost=(1,), waiting=(2, 1))}, {"t": [_info(0, "tcp://a", 10, 5)]}, {"t": res}, {}, now=0)
    b = snapshot({"t": _public(lost=(1,), waiting=(2, 1))}, {"t": [_info(0, "tcp://a", 30, 25)]}, {"t": res}, {}, now=2)
    row = b.tables["t"]
    step = sum(c.nbytes for c in make_spec().columns)
    assert row["bytes"] == 3 * step and row["resident_bytes"] == 110
    assert (row["blocked_inserts"], row["blocked_samples"], row["lost"]) == (2, 1, 1)
    assert row["samples_per_insert"] == 2.0 and row["target_spi"] == 2.0
    assert row["evicted"] == 3 and row["stale_updates"] == 4
    # the lost shard keeps a row, with the size the coordinator counted at its loss (it showed 0)
    assert [(r["shard"], r["state"], r["size"]) for r in b.shards] == [(0, "ok", 3), (1, "lost", 2)]
    r = rates(a, b)
    assert r["shards"][("t", 0)] == (10.0, 10.0) and r["tables"]["t"] == (10.0, 10.0)
    assert rates(None, a)["tables"]["t"] == (0.0, 0.0)
    # a limiter without a ratio has no target
    assert snapshot({"t": _public(kind="MinSize")}, {}, {}, {}).tables["t"]["target_spi"] is None


def test_disk_shards_show_their_bytes_on_disk_and_the_page_in_rate_once_per_worker():
    from gear_flow.dashboard.page import table_data

    def info(shard, worker, page_in):
        return {**_info(shard, worker, 10, 5), "disk": {"bytes_on_disk": 1000 + shard, "page_in_bytes": page_in}}

    pub = {**_public(), "placement": {0: "tcp://a", 1: "tcp://a", 2: "tcp://b"}}
    a = snapshot({"t": pub}, {"t": [info(0, "tcp://a", 100), info(1, "tcp://a", 100), info(2, "tcp://b", 0)]},
                 {}, {}, now=0)  # fmt: skip
    b = snapshot({"t": pub}, {"t": [info(0, "tcp://a", 4196), info(1, "tcp://a", 4196), info(2, "tcp://b", 2048)]},
                 {}, {}, now=2)  # fmt: skip
    assert b.tables["t"]["disk_bytes"] == 3003
    assert [r["disk_bytes"] for r in b.shards] == [1000, 1001, 1002]
    r = rates(a, b)
    assert r["page_in"]["t"] == (4096 + 2048) / 2  # worker a's counter once, not once per shard
    cols = table_data(b, r)
    assert cols["disk_s"] == ["2.93 kiB"] and cols["page_in_s"] == ["3.00 kiB/s"]
    # memory tiers: nothing on disk, no page-ins
    m = snapshot({"t": _public()}, {"t": [_info(0, "tcp://a", 1, 1)]}, {}, {}, now=0)
    assert m.tables["t"]["disk_bytes"] == 0 and rates(m, m)["page_in"]["t"] == 0.0


def test_no_route_without_dashboard(dist_client):
    """A scheduler without the dashboard gets no page and no polling; transport reports still work."""
    spec = make_spec(capacity=64, num_shards=2)
    t = DistributedTable.create(dist_client, spec)
    try:
        dist_client.register_plugin(GearFlowDashboard())
        t.insert([episode(1, 10)])
        t.sample(4, 2)
        report_stats(t)

        def state(dask_scheduler=None):
            p = dask_scheduler.plugins["gear-flow-dashboard"]
            return p.served, len(p.history), [(k, v["batches"]) for k, v in p.reports.items()]

        served, polls, reports = dist_client.run_on_scheduler(state)
        assert not served and polls == 0
        assert [b for k, b in reports if k[0] == t.name] == [1]  # (other tables' handles may report too)
    finally:
        t.close()


def _reports_seen(dask_scheduler=None, calls=()) -> list:
    """Each call's answer from the scheduler's stats handler, then the tables its reports are of."""
    p = dask_scheduler.plugins["gear-flow-dashboard"]
    answers = [p.handle_stats(**c) for c in calls]
    return [a["status"] for a in answers], sorted({k[0] for k in p.reports})


def _age_reports(dask_scheduler=None, by=0.0) -> int:
    p = dask_scheduler.plugins["gear-flow-dashboard"]
    for row in p.reports.values():
        row["time"] -= by
    p.handle_stats(table="nowhere", learner="x", stats={})  # a report: the ones past their age go
    return len(p.reports)


def test_learner_reports_are_checked_and_do_not_outlive_their_table_or_their_age(dist_client):
    """Without a served dashboard nothing pruned the learners' reports: 200 short-lived handles left 200
    entries on the scheduler, a dropped table's stayed for good; and counters of None, text or NaN raised out
    of the handler where its docstring promises an error reply.  Bad counters are answered with an error, a
    report of a table the coordinator does not hold is not kept, a dropped table's go, and so do those not
    renewed for REPORT_TTL_S."""
    dist_client.register_plugin(GearFlowDashboard())
    t = DistributedTable.create(dist_client, make_spec(capacity=64, num_shards=2))
    try:
        calls = [dict(table=t.name, learner=f"h{i}", stats={"batches": i, "remote_bytes": 8.0}) for i in range(3)]
        calls += [
            dict(table=t.name, learner="bad", stats={"batches": v}) for v in (None, "abc", float("nan"), -1, 2.5, True)
        ]
        calls += [dict(table="no-such-table", learner="h", stats={"batches": 1})]
        answers, tables = dist_client.run_on_scheduler(_reports_seen, calls=calls)
        assert answers == ["OK"] * 3 + ["error"] * 6 + ["OK"]
        assert t.name in tables and "no-such-table" not in tables
        from gear_flow.dashboard.plugin import REPORT_TTL_S

        assert dist_client.run_on_scheduler(_age_reports, by=REPORT_TTL_S + 1) == 0
        report_stats(t)
        assert t.name in dist_client.run_on_scheduler(_reports_seen)[1]
    finally:
        t.close()
    assert t.name not in dist_client.run_on_scheduler(_reports_seen, calls=[dict(table="x", learner="y", stats={})])[1]


async def _poll_row(dask_scheduler=None, name=None):
    """One poll of the dashboard: ``name``'s table row and its row as the page shows it (None: not shown)."""
    from gear_flow.dashboard.page import table_data

    p = dask_scheduler.plugins["gear-flow-dashboard"]
    snap = await p.poll()
    if name not in snap.tables:
        return None, None
    shown = table_data(snap, p.series[-1])
    i = shown["table"].index(name)
    return snap.tables[name], {k: v[i] for k, v in shown.items()}


def test_a_table_closed_but_not_dropped_shows_as_closed_until_it_is_dropped(dist_client):
    """A table closed with drop=False vanished from the page, though its name stays taken, its data stays on
    its workers and those workers are not retired while it holds them: the one place an operator looks did not
    show what held them.  It shows, with its size and resident bytes, as closed; once dropped it goes."""
    dist_client.register_plugin(GearFlowDashboard())
    t = DistributedTable.create(dist_client, make_spec(capacity=64, num_shards=2))
    name = t.name
    try:
        t.insert([episode(1, 6), episode(2, 4)])
        row, shown = dist_client.run_on_scheduler(_poll_row, name=name)
        assert not row["closed"] and shown["state"] == "open"
    finally:
        t.close(drop=False)
    row, shown = dist_client.run_on_scheduler(_poll_row, name=name)
    assert row is not None, "a closed table that is not dropped is shown"
    assert row["closed"] and shown["state"] == "closed, not dropped"
    assert row["size"] == 10 and row["resident_bytes"] > 0 and row["shards"] == 2
    DistributedTable.attach(name, client=dist_client).close()  # dropped
    assert dist_client.run_on_scheduler(_poll_row, name=name) == (None, None)


def _pace(dask_scheduler=None) -> tuple:
    p = dask_scheduler.plugins["gear-flow-dashboard"]
    return p.interval, p.history_len, p.history.maxlen


def test_the_pages_pace_is_the_schedulers_configuration():
    """GearFlowDashboard(interval=5, history=10) registered as docs/dashboard.md shows changed nothing: the
    preload's plugin, added first, stays (1 s, 600 polls).  The pace is configuration read where the
    scheduler runs, which the preload's plugin takes; the docstring says a later registration changes nothing."""
    from distributed import Client

    from gear_flow.deploy.local import local_cluster

    with dask.config.set({"gear-flow.dashboard.interval": 5.0, "gear-flow.dashboard.history": 10}):
        with local_cluster(1, 1, dashboard_address="127.0.0.1:0", memory_limit="1GB") as cluster, Client(cluster) as c:
            assert c.run_on_scheduler(_pace) == (5.0, 10, 10)
            c.register_plugin(GearFlowDashboard(interval=3.0))
            assert c.run_on_scheduler(_pace) == (5.0, 10, 10)


def _colocated_learner(name: str) -> dict:
    t = DistributedTable.attach(name)
    for _ in range(3):
        t.sample(8, 4)
    report_stats(t)
    return dict(t.stats)


async def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def _lost(name: str, dask_scheduler=None) -> dict:
    return dask_scheduler.plugins["gear-flow-coordinator"].tables[name].lost


def _polls(dask_scheduler=None) -> int:
    return len(dask_scheduler.plugins["gear-flow-dashboard"].history)


def test_dashboard_page_in_a_browser(tmp_path):
    chromium = find_chromium()
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (apt-get install chromium) for the dashboard test")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_plugin(GearFlowDashboard(interval=0.25))
        workers = sorted(advertised(client))
        limiter = gf.SampleToInsertRatio(samples_per_insert=0.5, min_size_to_sample=8, error_buffer=400)
        # the client's learner reads over the comm (as from another host): shared memory off for this table
        with dask.config.set({"gear-flow.distributed.shared-memory": False}):
            replay = DistributedTable.create(
                client,
                make_spec(capacity=96, num_shards=3),
                name="replay",
                sampler=gf.Prioritized(),
                rate_limiter=limiter,
                workers=workers,
                degraded=True,
            )
        queue = DistributedTable.queue(client, make_spec(capacity=64, num_shards=2), 16, name="handoff")

        # traffic while the page polls: inserts, samples, priority updates; some keys go stale
        old = None
        start = client.run_on_scheduler(_polls)
        tag = 1
        # at least 30 rounds (720 steps, 2.5 laps of the 3 shards of 96 steps: the first keys are gone
        # whatever the machine's speed), and until the page has polled 8 times meanwhile
        while tag < 61 or client.run_on_scheduler(_polls) < start + 8:
            replay.insert([episode(tag, 12), episode(tag + 1, 12)])
            tag += 2
            b = replay.sample(12, 2)  # 24 items in at 0.5 samples per insert, 12 out: the limiter never blocks
            replay.update_priorities(b.keys.numpy(), np.full(12, 2.0))
            old = b.keys.numpy().copy() if old is None else old
        r = replay.update_priorities(old, np.ones(len(old)))  # ring wrapped since: these items are gone
        assert r.stale > 0
        co = client.submit(_colocated_learner, "replay", workers=[workers[0]], pure=False).result()
        assert co["local_bytes"] > 0
        report_stats(replay)  # this client's learner: bytes over the comm
        assert replay.stats["remote_bytes"] > 0

        # a sample the queue's limiter blocks (the queue is empty), and a lost shard (a killed worker: a
        # retired one would hand its shard over first)
        blocked = threading.Thread(target=lambda: queue.sample(1, 1, timeout=60), daemon=True)
        blocked.start()
        client.run(_kill_self, workers=[workers[2]], wait=False)
        wait_for(lambda: 2 in {int(k) for k in client.run_on_scheduler(_lost, name="replay")}, "shard 2 lost")

        url = client.dashboard_link.replace("/status", "/gear-flow")
        assert urllib.request.urlopen(url).status == 200

        async def look():
            async with Browser(chromium, width=1500, height=1120) as br:
                await br.goto(url)
                text = await br.wait_for(
                    lambda s: (
                        "handoff" in s
                        and "lost" in s.split("Learners")[0]
                        and s.count("Client-") >= 1
                        and workers[0] in s.split("Learners")[-1]
                    )
                )
                await asyncio.sleep(0)  # the text is there; let the last render finish before the shot
                shot = await br.screenshot(tmp_path / "dashboard.png")
                return text, shot

        text, shot = asyncio.run(look())
        queue.insert([episode(99, 1)])  # unblocks the waiting sample
        blocked.join(30)

    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    (tmp_path / "dashboard.txt").write_text(text)
    if os.environ.get("GEAR_FLOW_SCREENSHOT_DIR"):
        shutil.copy(tmp_path / "dashboard.png", os.environ["GEAR_FLOW_SCREENSHOT_DIR"])
        shutil.copy(tmp_path / "dashboard.txt", os.environ["GEAR_FLOW_SCREENSHOT_DIR"])
    lines = text.splitlines()
    assert "gear_flow replay tables" in text
    for header in (
        "inserts/s",
        "samples/s",
        "blocked samples",
        "samples/insert (target)",
        "stale updates",
        "lost shards",
    ):
        assert header in lines, header
    assert "SampleToInsertRatio" in lines and "Queue" in lines
    # the tables' rows: the queue's blocked sample, the replay table's lost shard and target ratio
    tables_part = text.split("Shards")[0]
    assert "handoff" in tables_part and "replay" in tables_part
    assert any(line.endswith("(0.5)") for line in lines), "samples/insert against the target 0.5"
    shards_part = text.split("Shards")[1].split("Learners")[0]
    assert "lost" in shards_part.splitlines() and workers[2] in shards_part
    learners = text.split("Learners")[1].split("Time series")[0].splitlines()
    client_row = learners[[i for i, s in enumerate(learners) if s.startswith("Client-")][0] :][:5]
    task_row = learners[[i for i, s in enumerate(learners) if s.startswith(workers[0])][0] :][:5]
    assert client_row[1:4:2] == ["0 B", "0%"], client_row  # an external learner: every byte over the comm
    assert task_row[1] != "0 B" and task_row[3] != "0%", task_row  # co-located: its own shard read in-process


def test_page_from_a_scheduler_preload():
    """Added while the scheduler is set up (a preload), the page is served once the scheduler runs."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"preload": ["dashboard_preload"]},
        ) as cluster,
        Client(cluster) as client,
    ):
        assert client.run_on_scheduler(lambda dask_scheduler=None: dask_scheduler.plugins[DASHBOARD].served)
        page = urllib.request.urlopen(client.dashboard_link.replace("/status", "/gear-flow"))
        assert page.status == 200 and b"bokeh" in page.read().lower()
        # Dask's own pages link to it in their navigation bar
        status = urllib.request.urlopen(client.dashboard_link).read().decode()
        assert 'href="gear-flow"' in status, [ln for ln in status.splitlines() if "href" in ln][:20]
