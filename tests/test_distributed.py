"""The distributed table on real Dask processes (LocalCluster, 2 worker processes)."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import torch
from dist_support import coordinator, own_cluster, wait_for
from distributed import Client, LocalCluster
from helpers import COLUMNS, Catalog, check_windows, chi2_critical, episode

import gear_flow as gf
from gear_flow.distributed import DistributedTable, sampling
from gear_flow.keys import decode

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("data_plane")]


@pytest.fixture(scope="module")
def client():
    with dask.config.set({"distributed.comm.timeouts.connect": "5s"}):
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster:
            with Client(cluster) as c:
                yield c


def spec(capacity=2000, num_shards=2, **kw):
    return gf.TableSpec(COLUMNS, capacity=capacity, num_shards=num_shards, **kw)


class DCatalog(Catalog):
    """Catalog for a distributed table (same bookkeeping)."""


def dreconcile(table: DistributedTable) -> dict:
    info = table.info()
    tot = info["totals"]
    assert tot["inserted"] == tot["size"] + tot["evicted"] + tot["removed"] + tot["deleted"] + tot["expired"], tot
    assert info["size"] == info["coordinator_size"], info
    return tot


def test_shards_on_both_workers_and_windows_are_real(client):
    t = DistributedTable.create(client, spec(), seed=0)
    try:
        assert len(set(t.placement.values())) == 2
        cat = DCatalog()
        cat.insert(t, [(i + 1, 20 + 7 * i) for i in range(10)])
        for boundary in ("strict", "pad_tail", "pad_head"):
            b = t.sample(64, 8, boundary=boundary)
            check_windows(b, cat, 8, boundary)
        shards = decode(t.sample(256, 4).keys.numpy())[0]
        assert set(shards.tolist()) == {0, 1}  # both shards contribute
        dreconcile(t)
    finally:
        t.close()


def test_prioritized_global_distribution_matches_chi_square(client):
    alpha = 0.7
    t = DistributedTable.create(client, spec(), sampler=gf.Prioritized(alpha=alpha, beta=0.5), seed=1)
    try:
        rng = np.random.default_rng(5)
        eps = [episode(i + 1, n) for i, n in enumerate([5, 9, 3, 12, 7, 6])]
        prios = [rng.uniform(0.1, 3.0, len(e["t"])) for e in eps]
        res = t.insert(eps, prios)
        L = 3  # strict: starts in the last L-1 steps of each episode are excluded
        expected = {}
        for e, p, fk in zip(eps, prios, res.first_keys):
            n = len(e["t"])
            for j in range(n - L + 1):
                expected[int(fk) + j] = p[j] ** alpha
        total = sum(expected.values())
        counts = dict.fromkeys(expected, 0)
        draws = 0
        for _ in range(60):
            b = t.sample(200, L)
            k = b.keys.numpy()
            p = b.probabilities.numpy()
            for key, prob in zip(k, p):
                assert int(key) in expected, "an invalid (too short) window was sampled"
                assert prob == pytest.approx(expected[int(key)] / total, rel=1e-9)
                counts[int(key)] += 1
            w = b.weights.numpy()
            ref = p**-0.5
            np.testing.assert_allclose(w, ref / ref.max(), rtol=1e-5)
            draws += len(k)
        exp = np.array([expected[k] / total * draws for k in expected])
        obs = np.array([counts[k] for k in expected])
        chi2 = float(((obs - exp) ** 2 / exp).sum())
        assert chi2 < chi2_critical(len(exp) - 1), chi2
    finally:
        t.close()


def test_inserts_from_client_threads_and_worker_tasks_reconcile(client):
    t = DistributedTable.create(client, spec(capacity=3000), seed=2, name="concurrent")
    try:

        def client_writer(k):
            for j in range(5):
                t.insert([episode(100 * k + j + 1, 30 + j)])

        threads = [threading.Thread(target=client_writer, args=(k,)) for k in range(3)]
        for th in threads:
            th.start()

        def task_writer(name, e1, e2):
            from gear_flow.distributed import DistributedTable as DT

            table = DT.attach(name)
            with table.writer() as w:
                for i in range(len(e1["t"])):
                    w.append({k: v[i] for k, v in e1.items()})
                w.end_episode()
            res = table.insert([e2])
            return table.local_shards, [int(s) for s in res.shards]

        futs = [
            client.submit(task_writer, "concurrent", episode(1000 + 10 * i, 25), episode(1001 + 10 * i, 10), pure=False)
            for i in range(4)
        ]
        results = client.gather(futs)
        for th in threads:
            th.join()
        for local, dest in results:  # writer affinity: worker tasks write to their own shards
            assert local and set(dest) <= set(local)
        tot = dreconcile(t)
        assert tot["inserted_episodes"] == 15 + 8
        assert tot["inserted"] == sum(30 + j for j in range(5)) * 3 + 4 * (25 + 10)
        # keys of one shard never alias another's
        b = t.sample(128, 1)
        shard, _ = decode(b.keys.numpy())
        info = t.info()
        for s in info["shards"]:
            assert s["worker"] == t.placement[s["shard"]]
        assert set(shard.tolist()) <= {0, 1}
    finally:
        t.close()


def test_updates_stale_and_unknown_keys(client):
    t = DistributedTable.create(client, spec(capacity=100), sampler=gf.Prioritized(1.0, 0.0), seed=3)
    try:
        r1 = t.insert([episode(1, 60), episode(2, 60)])
        b = t.sample(32, 1)
        old = b.keys.numpy().copy()
        t.insert([episode(3, 60), episode(4, 60)])  # overwrites both shards' rings: old keys go stale
        res = t.update_priorities(old, np.full(len(old), 7.0))
        assert res.stale == len(old) and res.applied == 0
        bogus = np.array([int(r1.first_keys[0]) + 10_000])
        before = t.info()["totals"]["stale_updates"]
        with pytest.raises(gf.UnknownKeyError):
            t.update_priorities(np.concatenate([t.sample(4, 1).keys.numpy(), bogus]), np.ones(5))
        assert t.info()["totals"]["stale_updates"] == before
        with pytest.raises(gf.InvalidPriorityError):
            t.update_priorities(t.sample(2, 1).keys, [1.0, float("nan")])
        dreconcile(t)
    finally:
        t.close()


def test_closing_a_dropped_table_again_does_nothing(client):
    """A second close() of the handle that dropped the table raised SpecError ("no distributed table"),
    where closing a file, or a LocalTable, twice does nothing; a with-block around a table closed inside it
    raised on exit.  Other calls still say the table is gone."""
    with DistributedTable.create(client, spec(capacity=100), seed=3) as t:
        t.insert([episode(1, 5)])
        t.close()
        t.close()
        with pytest.raises(gf.errors.SpecError, match="no distributed table"):
            t.insert([episode(2, 5)])
    t.close()
    t = DistributedTable.create(client, spec(capacity=100), seed=3)  # the cluster serves a new one
    assert t.size == 0
    t.close()


def _shard_state(name, dask_worker=None):
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    if t is None:
        return {}
    return {i: (s.active.copy(), s.priority.copy()) for i, s in t.shards.items()}


def test_close_without_drop_refuses_every_handles_reads_and_changes_and_keeps_the_data(client):
    """After ``close(drop=False)`` another handle's sample (served by its admission lease, without asking the
    coordinator), priority update and delete raised nothing and changed the shards; the docstring promises
    TableClosedError to every handle, as a closed LocalTable refuses them.  Every call of either handle is
    refused now, the shards' items and priorities are those before the close, and the data stays until a
    close that drops it."""
    t = DistributedTable.create(client, spec(capacity=1000), sampler=gf.Prioritized(), rate_limiter=gf.MinSize(1),
                                seed=0)  # fmt: skip
    h = None
    try:
        r = t.insert([episode(e + 1, 10) for e in range(10)])
        keys = np.asarray(r.first_keys)
        h = DistributedTable.attach(t.name, client=client, seed=1, timeout=3)
        for _ in range(3):
            h.sample(8, 1)  # admitted once, with a lease
        before = {k: v for d in client.run(_shard_state, t.name).values() for k, v in d.items()}
        assert sorted(before) == [0, 1] and sum(int(a.sum()) for a, _ in before.values()) == 100
        t.close(drop=False)
        for handle in (h, t):
            calls = {
                "sample": lambda x: x.sample(8, 1),
                "update_priorities": lambda x: x.update_priorities(keys, np.full(len(keys), 7.0)),
                "delete": lambda x: x.delete(keys[:2]),
                "insert": lambda x: x.insert([episode(99, 3)]),
            }
            for what, call in calls.items():
                with pytest.raises(gf.TableClosedError):
                    call(handle)
                    pytest.fail(f"{what} was not refused")
        after = {k: v for d in client.run(_shard_state, t.name).values() for k, v in d.items()}
        assert sorted(after) == [0, 1]
        for s in before:
            np.testing.assert_array_equal(after[s][0], before[s][0])
            np.testing.assert_array_equal(after[s][1], before[s][1])
    finally:
        if h is not None:
            h.close(drop=False)
        t.close()
    assert all(
        t.name not in d
        for d in client.run(lambda dask_worker=None: list(dask_worker.plugins["gear-flow"].host.tables)).values()
    )


def test_a_closed_tables_name_is_taken_until_a_close_drops_it(client):
    """After ``close(drop=False)`` the coordinator accepted the name again while every worker still hosted the
    closed table, and took the new table's create for a repeat of the old one's: the "new" table refused its
    inserts as closed.  The name is refused with one line saying how to drop the kept table; a handle attached
    to it drops it, and then the name makes a new, empty table."""
    t = DistributedTable.create(client, spec(capacity=100), name="kept-name", seed=0)
    t.insert([episode(1, 5)])
    t.close(drop=False)
    with pytest.raises(gf.errors.SpecError, match=r"'kept-name' already exists, closed but not dropped") as e:
        DistributedTable.create(client, spec(capacity=100), name="kept-name", seed=0)
    assert "\n" not in str(e.value)
    h = DistributedTable.attach("kept-name", client=client)
    assert h.info()["size"] == 5  # the data kept
    h.close()
    t = DistributedTable.create(client, spec(capacity=100), name="kept-name", seed=0)
    try:
        assert t.size == 0
        t.insert([episode(2, 3)])
        assert t.sample(3, 1)["ep"].numpy().ravel().tolist() == [2, 2, 2]
    finally:
        t.close()


def test_an_old_handles_close_leaves_a_new_table_of_its_name_alone(client):
    """A learner's handle on "reused" outlived the table: the driver dropped it and created a new "reused",
    and the old handle's close() (a with-block's exit) dropped the new table on every worker and on the
    coordinator, its data gone.  A handle is on one creation of its table: once that is gone, closing the
    handle touches nothing, and the new table keeps its items."""
    t = DistributedTable.create(client, spec(capacity=100), name="reused", seed=0)
    t.insert([episode(1, 5)])
    old = DistributedTable.attach("reused", client=client)
    assert len(old.sample(4, 1)) == 4
    t.close()
    new = DistributedTable.create(client, spec(capacity=100), name="reused", seed=0)
    try:
        new.insert([episode(3, 8)])
        old.close()
        old.close()
        assert new.size == 8
        assert new.sample(8, 1)["ep"].numpy().ravel().tolist() == [3] * 8
    finally:
        new.close()
    gone = DistributedTable.create(client, spec(capacity=100), name="reused", seed=0)
    other = DistributedTable.attach("reused", client=client)
    gone.close()
    other.close()  # its table dropped by another handle, none made since: nothing to do, no error


def test_closing_at_once_from_several_handles_raises_nothing(client):
    """Handles closing a closed table at once from threads (some dropping it) met SpecError "no distributed
    table" now and then: one checked that the table was there, another dropped it, then the first closed it.
    None raises; the table is gone after."""
    for r in range(4):
        t = DistributedTable.create(client, spec(capacity=100), name=f"racing-{r}", seed=0)
        t.insert([episode(1, 5)])
        t.close(drop=False)
        handles = [DistributedTable.attach(t.name, client=client) for _ in range(4)]
        errors = []

        def close(h, drop, errors):
            try:
                h.close(drop=drop)
            except Exception as e:  # noqa: BLE001 - collected: the assertion names it
                errors.append(e)

        threads = [threading.Thread(target=close, args=(h, i % 2 == 0, errors)) for i, h in enumerate(handles)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert errors == []
        assert t.name not in client.run_on_scheduler(lambda dask_scheduler=None: list(
            dask_scheduler.plugins["gear-flow-coordinator"].tables))  # fmt: skip


def test_a_closed_tables_shard_is_not_restored_open(client, tmp_path):
    """restore_shard onto another worker of a table closed with drop=False was accepted, and the new copy
    served updates and deletes (size 40 to 39) where every handle must meet TableClosedError."""
    t = DistributedTable.create(client, spec(capacity=100), seed=0)
    try:
        t.insert([episode(k + 1, 10) for k in range(4)])
        t.checkpoint(tmp_path / "ck")
        t.close(drop=False)
        with pytest.raises(gf.TableClosedError, match="restore_shard is refused"):
            t.restore_shard(0, tmp_path / "ck", replace=True)
        assert t.info()["size"] == 40
    finally:
        t.close()


def _size_in_task(table):
    return table.size


def test_a_handle_sent_to_a_task_attaches_there_and_not_to_a_table_made_since(client):
    """The handle's docstring: sent to a task, it attaches there.  The scheduler now reads a task's graph, and
    unpickling the handle there (no worker) failed the submit.  And a handle on a table dropped and made again
    under its name attached to the new one in the task, where its close dropped that one.  The handle
    attaches where its task runs, and refuses a table made since it was sent."""
    t = DistributedTable.create(client, spec(capacity=100), name="sent", seed=0)
    t.insert([episode(1, 5)])
    assert client.submit(_size_in_task, t, pure=False).result() == 5
    old = pickle.dumps(t)
    t.close()
    new = DistributedTable.create(client, spec(capacity=100), name="sent", seed=0)
    try:
        new.insert([episode(2, 8)])
        with pytest.raises(gf.errors.SpecError, match="'sent' was dropped since this handle was sent"):
            client.submit(_size_in_task, pickle.loads(old), pure=False).result()
        assert new.size == 8
    finally:
        new.close()


def test_global_rate_limiter_and_timeout(client):
    t = DistributedTable.create(client, spec(), rate_limiter=gf.MinSize(50), seed=4, timeout=0.5)
    try:
        t.insert([episode(1, 20)])
        with pytest.raises(gf.RateLimitTimeout):
            t.sample(4, 1)
        t.insert([episode(2, 40)])  # lands on the other shard: the limiter counts the whole table
        assert len(t.sample(4, 1)) == 4
    finally:
        t.close()


def test_fifo_merges_shards_and_epochs_are_global(client):
    t = DistributedTable.create(client, spec(), sampler=gf.Fifo(), seed=5)
    try:
        t.insert([episode(1, 3), episode(2, 3), episode(3, 3)])
        b = t.sample(4, 1)
        got = sorted(zip(b["ep"][:, 0].tolist(), b["t"][:, 0].tolist()))
        assert got == [(1, 0), (1, 1), (1, 2), (2, 0)]
    finally:
        t.close()
    t = DistributedTable.create(client, spec(), sampler=gf.WithoutReplacement(), seed=6)
    try:
        t.insert([episode(i + 1, 5) for i in range(4)])  # 20 items over two shards
        seen = []
        for _ in range(5):
            b = t.sample(4, 1)
            seen += list(zip(b["ep"][:, 0].tolist(), b["t"][:, 0].tolist()))
        assert len(set(seen)) == 20  # one epoch: every item exactly once
    finally:
        t.close()


def test_stream_dataloader_and_colocated_learner(client):
    t = DistributedTable.create(client, spec(), seed=7, name="stream")
    try:
        cat = DCatalog()
        cat.insert(t, [(i + 1, 40) for i in range(6)])
        dl = torch.utils.data.DataLoader(
            gf.Stream(t, 16, 5, prefetch=3, num_batches=12, seed=0).dataset(), batch_size=None
        )
        n = 0
        for b in dl:
            check_windows(b, cat, 5, "strict")
            n += 1
        assert n == 12

        def learner(name):
            import gear_flow as gf2
            from gear_flow.distributed import DistributedTable as DT

            table = DT.attach(name, seed=1)
            model = torch.nn.Linear(3, 1)
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)
            losses = []
            for b in gf2.Stream(table, 32, 4, num_batches=20, seed=1):
                loss = (model(b["obs"]).squeeze(-1) - b["t"].float()).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return table.local_shards, table.stats, losses

        local, stats, losses = client.submit(learner, "stream", pure=False).result()
        assert local, "the learner's worker hosts a shard"
        # whole table: the local part without a copy, the other worker's from shared memory (same machine)
        # or over the comm (shared memory off)
        other = "shared_bytes" if t._config["shared_memory"] else "remote_bytes"
        assert stats["local_bytes"] > 0 and stats[other] > 0, stats
        assert len(losses) == 20
    finally:
        t.close()


def test_ddp_two_ranks_with_gloo(client, tmp_path):
    t = DistributedTable.create(client, spec(), seed=8, name="ddp")
    try:
        t.insert([episode(i + 1, 30) for i in range(6)])
        script = Path(__file__).with_name("ddp_rank.py")
        addr = client.scheduler.address
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), addr, "ddp", str(r), "2", f"file://{tmp_path}/store"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(2)
        ]
        outs = [p.communicate(timeout=180)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        lines = [next(line for line in o.splitlines() if line.startswith("RESULT")) for o in outs]
        keysets = [set(map(int, line.split()[2].split(","))) for line in lines]
        sums = {line.split()[1] for line in lines}
        assert len(sums) == 1  # all_reduce gave both ranks the same total
        assert keysets[0] != keysets[1]  # ranks draw independent batches
    finally:
        t.close()


@pytest.mark.slow
# the cluster and its client run in a process of their own, with the default data plane: the one set here
# does not reach them, so one run, not three
@pytest.mark.parametrize("data_plane", ["shared-memory"], indirect=True)
def test_ucx_transport_over_tcp():
    pytest.importorskip("distributed_ucxx")
    env = {**os.environ, "UCX_TLS": "tcp,sm,self", "UCXPY_IFNAME": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    code = (
        "import numpy as np, gear_flow as gf\n"
        "from distributed import Client, LocalCluster\n"
        "from gear_flow.distributed import DistributedTable\n"
        "if __name__ == '__main__':\n"
        "    with LocalCluster(n_workers=2, threads_per_worker=1, protocol='ucx', host='127.0.0.1', dashboard_address=None) as c, Client(c) as cl:\n"
        "        assert cl.scheduler.address.startswith('ucx://')\n"
        "        spec = gf.TableSpec((gf.ColumnSpec('x', (4,), np.float32),), capacity=500, num_shards=2)\n"
        "        t = DistributedTable.create(cl, spec, sampler=gf.Prioritized(), seed=0)\n"
        "        t.insert([{'x': np.full((40, 4), i, np.float32)} for i in range(6)])\n"
        "        b = t.sample(64, 8)\n"
        "        t.update_priorities(b.keys, np.ones(64))\n"
        "        assert t.info()['size'] == 240 and b['x'].shape == (64, 8, 4)\n"
        "        print('UCX-OK', sorted(set(t.placement.values())))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=200)
    assert "UCX-OK" in r.stdout, r.stdout + r.stderr
    assert "ucx://" in r.stdout


def test_lost_worker_error_and_degraded_mode(tmp_path):
    with own_cluster({"distributed.comm.timeouts.connect": "3s"}) as c:
        strict = DistributedTable.create(c, spec(), seed=9, name="strict", rate_limiter=gf.MinSize(60))
        soft = DistributedTable.create(c, spec(), seed=9, name="soft", degraded=True)
        for t in (strict, soft):
            t.insert([episode(i + 1, 20) for i in range(4)])
        stale = DistributedTable.attach("strict", c)  # a handle that will not have heard of the loss
        victim = strict.placement[1]
        assert soft.placement[1] == victim
        pid = c.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: 1 in coordinator(strict).lookup()["lost"], "the coordinator to count shard 1 lost")
        # its first call reaches the coordinator, where the 40 items left no longer satisfy MinSize(60): it is
        # refused for the loss, as the calls waiting when it happened were, not left to wait out its timeout
        t0 = time.monotonic()
        with pytest.raises(gf.ShardLostError, match="shard"):
            stale.sample(8, 2, timeout=20)
        assert time.monotonic() - t0 < 10
        with pytest.raises(gf.ShardLostError, match="shard"):
            strict.sample(8, 2)
        with pytest.raises(gf.ShardLostError):
            strict.insert([episode(9, 5)])
        # a checkpoint without the lost shard could never be restored (restore needs every shard of a table
        # that is not degraded): refused, nothing left behind
        with pytest.raises(gf.ShardLostError, match="every shard"):
            strict.checkpoint(tmp_path / "strict")
        assert list(tmp_path.iterdir()) == []
        b = soft.sample(8, 2)  # degraded: keeps serving from shard 0
        assert set(decode(b.keys.numpy())[0].tolist()) == {0}
        info = soft.info()
        assert 1 in info["lost"] and info["lost"][1]["size_at_loss"] == 40
        res = soft.insert([episode(10, 5)])
        assert set(res.shards.tolist()) == {0}


def test_cli_info_and_list(client):
    t = DistributedTable.create(client, spec(), seed=10, name="cli-table")
    try:
        t.insert([episode(1, 12), episode(2, 8)])
        addr = client.scheduler.address
        r = subprocess.run(
            [sys.executable, "-m", "gear_flow", "list", "--scheduler", addr], capture_output=True, text=True, timeout=60
        )
        assert "cli-table" in r.stdout, r.stderr
        r = subprocess.run(
            [sys.executable, "-m", "gear_flow", "info", "--scheduler", addr, "--table", "cli-table"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert "cli-table: 20 items" in r.stdout
        assert len([line for line in r.stdout.splitlines() if "tcp://" in line]) == 2  # one line per shard
    finally:
        t.close()


def test_a_leased_batch_that_fails_is_never_reported_as_served(client):
    """A batch served under the lease that fails after another thread's admission reported the lease's
    batches (the interleaving a learner and a stream's thread hit when a worker was lost): it was not
    served, so it is not counted, and no report of a negative count reaches the coordinator."""
    t = DistributedTable.create(client, spec(), seed=12, name="lease-fail")
    try:
        t.insert([episode(i + 1, 30) for i in range(4)])
        t.sample(8, 2)  # admitted by the coordinator, with a lease for the next batches
        assert t._lease.take(8)  # this thread's next batch, under the lease ...
        reported = sampling.admission_args(t, 8, None)["done"]  # ... another thread's admission reports meanwhile ...
        sampling.SampleGrant(
            t._link, 8, None
        ).give_back_here()  # ... and the batch fails (under the lease: nothing given back)
        assert reported == 0
        served = 1
        for _ in range(40):  # past the lease: admissions again, reporting what was served
            t.sample(8, 2)
            served += 1
        t.flush()
        info = t.info()
        assert info["rate_limiter"]["samples"] == info["totals"]["sampled"] == 8 * served, info
    finally:
        t.close()


def test_a_handles_delete_ends_its_lease_so_min_size_holds_for_its_next_batch(client):
    """MinSize(5): 9 items, a batch (admitted with a lease), 5 deleted by the same handle: its next batch is
    asked of the coordinator, which finds 4 items and times it out, as a LocalTable does (the lease served it)."""
    t = DistributedTable.create(client, spec(capacity=32), rate_limiter=gf.MinSize(5), seed=5, name="lease-del")
    try:
        r = t.insert([episode(i + 1, 1) for i in range(9)])
        t.sample(2, timeout=0)
        assert t.delete(np.asarray(r.first_keys)[:5]).applied == 5
        with pytest.raises(gf.RateLimitTimeout, match=r"\(size 4,"):
            t.sample(2, timeout=0)
        t.insert([episode(20, 1)])
        assert len(t.sample(2, timeout=0).keys) == 2
    finally:
        t.close()


def test_the_leased_samples_of_a_dropped_handle_are_counted(client):
    """A handle dropped without flush or close (a task that samples a few batches and returns): the
    batches it served under its lease still reach the table's count, reported once it is collected."""
    t = DistributedTable.create(client, spec(), seed=13, name="lease-drop")
    try:
        t.insert([episode(i + 1, 30) for i in range(4)])
        h = DistributedTable.attach("lease-drop", client=client, seed=1)
        for _ in range(5):
            h.sample(8, 2)
        # 40 drawn (by the owners, or by the handle from their published state: they count those within
        # distributed.reader-flush); the coordinator counted the first batch (the other 4: its lease)
        wait_for(lambda: t.info()["totals"]["sampled"] == 40, "the owners' counts of the samples drawn")
        info = t.info()
        assert info["totals"]["sampled"] == 40 and info["rate_limiter"]["samples"] == 8, info
        del h
        gc.collect()
        wait_for(lambda: t.info()["rate_limiter"]["samples"] == 40, "the dropped handle's leased samples counted")
    finally:
        t.close()


def test_leased_samples_an_admission_reported_are_kept_when_it_is_never_granted(client):
    """An admission that times out was never granted, so the leased batches it reported were not
    counted: the handle keeps them for its next admission, which counts them."""
    t = DistributedTable.create(client, spec(), seed=14, name="lease-refused", rate_limiter=gf.MinSize(60))
    try:
        r = t.insert([episode(i + 1, 30) for i in range(4)])  # 120 items
        for _ in range(3):
            t.sample(8, 1)  # the first admitted (with a lease), the next two under it
        keys = np.concatenate([k + np.arange(30) for k in r.first_keys])
        assert t.delete(keys[:70]).applied == 70  # 50 left: below MinSize(60), samples wait
        with pytest.raises(gf.RateLimitTimeout):
            t.sample(4, 1, timeout=0.3)  # another size: no lease; reports the 16, never granted
        t.insert([episode(9, 30)])  # 80
        t.sample(4, 1)
        t.flush()
        info = t.info()
        assert info["rate_limiter"]["samples"] == info["totals"]["sampled"] == 3 * 8 + 4, info
    finally:
        t.close()


def test_colocated_lease_counts_every_sample(client):
    w0 = sorted(client.nthreads())[0]
    t = DistributedTable.create(client, spec(), workers=[w0], seed=11, name="lease")  # both shards on one worker
    try:
        t.insert([episode(i + 1, 30) for i in range(4)])

        def learner(name):
            import gear_flow as gf2
            from gear_flow.distributed import DistributedTable as DT

            table = DT.attach(name, seed=2)
            n = 0
            for b in gf2.Stream(table, 8, 3, num_batches=40, seed=2):
                assert b["obs"].shape == (8, 3, 3)
                n += 1
            return n, table.stats

        n, stats = client.submit(learner, "lease", workers=[w0], pure=False).result()
        assert n == 40 and stats["remote_bytes"] == 0
        info = t.info()
        assert info["rate_limiter"]["samples"] == 40 * 8  # leased batches were all reported
        assert info["totals"]["sampled"] == 40 * 8
    finally:
        t.close()
