"""Checkpoints: atomic, checksummed, no pickle; restore locally, onto other clusters, and of a lost shard."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import zipfile

import numpy as np
import pytest
from dist_support import kill, own_cluster, tables_here, wait_for
from helpers import COLUMNS, episode, reconcile

import gear_flow as gf
from gear_flow import checkpoint as ck
from gear_flow.distributed import DistributedTable
from gear_flow.errors import CheckpointError

pytestmark = pytest.mark.timeout(240)


def local_table(**kw):
    spec = gf.TableSpec(COLUMNS, capacity=300, num_shards=2)
    t = gf.LocalTable(
        spec, sampler=gf.Prioritized(0.7, 0.5), rate_limiter=gf.SampleToInsertRatio(2, 10, 10_000), seed=0, **kw
    )
    rng = np.random.default_rng(0)
    for i in range(30):
        t.insert([episode(i + 1, int(rng.integers(3, 30)))], priorities=rng.random())
    b = t.sample(16, 3)
    t.update_priorities(b.keys, np.arange(16) + 1.0)
    return t


def test_local_roundtrip_is_exact(tmp_path):
    t = local_table()
    res = t.checkpoint(tmp_path / "ck")
    assert res["pause_s"] < res["seconds"]
    t2 = gf.LocalTable.restore(tmp_path / "ck")
    assert t.info() == t2.info()
    assert t.rate_limiter.info() == t2.rate_limiter.info()
    t.rng, t2.rng = np.random.default_rng(7), np.random.default_rng(7)
    b1, b2 = t.sample(32, 4), t2.sample(32, 4)
    for f in ("keys", "probabilities", "weights", "mask", "episode_ids", "timesteps"):
        assert np.array_equal(getattr(b1, f).numpy(), getattr(b2, f).numpy()), f
    for c in b1.data:
        assert np.array_equal(b1[c].numpy(), b2[c].numpy())
    r1, r2 = t.insert([episode(99, 5)]), t2.insert([episode(99, 5)])  # ids and keys continue identically
    assert np.array_equal(r1.episode_ids, r2.episode_ids) and np.array_equal(r1.first_keys, r2.first_keys)
    reconcile(t2)


def test_files_hold_no_pickle_and_manifest_is_versioned(tmp_path):
    local_table().checkpoint(tmp_path / "ck")
    m = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert m["format"] == "gear-flow-checkpoint" and m["version"] == 1
    for e in m["files"].values():
        with zipfile.ZipFile(tmp_path / "ck" / e["file"]) as z:
            for n in z.namelist():
                with z.open(n) as f:
                    head = f.read(10)
                    assert head[:6] == b"\x93NUMPY"  # plain .npy members
        with np.load(tmp_path / "ck" / e["file"], allow_pickle=False) as z:
            assert all(z[k].dtype != object for k in z.files)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


CHECKPOINT_KILLER = """
import os, signal, sys
import numpy as np
import gear_flow as gf
from gear_flow import checkpoint as ck

where, final = sys.argv[1], sys.argv[2]
spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=2)
t = gf.LocalTable(spec, seed=0)
t.insert({"x": np.full(7, 2.0, np.float32)})
die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
if where == "writing":
    ck.write_shard_file = die  # the temporary directory made, the shards not yet written
else:  # between the commit's two renames: the older checkpoint moved aside, the new one not yet in place
    ck._exchange = lambda a, b: False
    rename = os.rename
    ck.os.rename = lambda a, b: die() if str(b) == final else rename(a, b)
t.checkpoint(final)
"""


@pytest.mark.parametrize("where", ["writing", "between_renames"])
def test_a_checkpoint_killed_mid_way_leaves_nothing_behind_once_the_next_one_begins(tmp_path, where):
    """A process killed while writing a checkpoint left its temporary directory (as large as the checkpoint)
    beside the path for ever, one more for every such kill.  A checkpoint to that path, or a restore from it,
    now removes what a dead writer left; a whole new checkpoint that a kill kept from its place (between the
    two renames of a file system that cannot exchange them) is put in place, being the newest; a live writer's
    directory is left alone."""
    import subprocess
    import sys

    final = tmp_path / "ck"
    older = gf.LocalTable(gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=2), seed=0)
    older.insert({"x": np.full(3, 1.0, np.float32)})
    older.checkpoint(final)
    proc = subprocess.run(
        [sys.executable, "-c", CHECKPOINT_KILLER, where, str(final)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = sorted(p.name.split("-")[0] for p in tmp_path.iterdir() if p.name.startswith(".ck."))
    assert left == ([".ck.tmp"] if where == "writing" else [".ck.old", ".ck.tmp"])
    live = ck.temp_dir(tmp_path / "other")  # another checkpoint's directory, being written: never taken
    assert gf.LocalTable.restore(final).size == (3 if where == "writing" else 7)  # the newest whole one
    older.insert({"x": np.full(2, 1.0, np.float32)})
    older.checkpoint(final)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ck.")]
    assert gf.LocalTable.restore(final).size == 5
    swept = ck.temp_dir(tmp_path / "other")
    assert live.exists() and swept != live
    ck.discard(live), ck.discard(swept)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest", "version", "missing"])
def test_corrupted_checkpoint_is_refused(tmp_path, damage):
    local_table().checkpoint(tmp_path / "ck")
    d = tmp_path / "ck"
    shard = d / "shard-0.npz"
    if damage == "flip":
        b = bytearray(shard.read_bytes())
        b[len(b) // 2] ^= 0xFF
        shard.write_bytes(bytes(b))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "manifest":
        (d / "manifest.json").write_text("{not json")
    elif damage == "version":
        m = json.loads((d / "manifest.json").read_text())
        m["version"] = 999
        (d / "manifest.json").write_text(json.dumps(m))
    else:
        shard.unlink()
    with pytest.raises(CheckpointError):
        gf.LocalTable.restore(d)


def test_a_checkpoint_replaces_only_an_older_checkpoint(make_table, tmp_path):
    """A checkpoint's path held a user's files, a file, or a disk table's own directory: the checkpoint moved
    it aside and deleted it.  Only nothing, an empty directory or an older checkpoint may be there now; the
    rest is refused with a CheckpointError and left as it was."""
    t = make_table(gf.TableSpec(COLUMNS, capacity=64, num_shards=2), seed=0)
    t.insert([episode(1, 5), episode(2, 3)])
    tmp_path = tmp_path / "here"  # (a disk kind's own table is beside it)
    tmp_path.mkdir()
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "important.txt").write_text("keep me")
    note = tmp_path / "notes.txt"
    note.write_text("notes")
    disk = gf.LocalTable(gf.TableSpec(COLUMNS, capacity=64), tier="disk", path=tmp_path / "disk-table", seed=0)
    disk.insert(episode(3, 4))
    disk.flush()
    for where, what in ((mine, "not a gear_flow checkpoint"), (note, "is a file"), (tmp_path / "disk-table", "disk")):
        with pytest.raises(CheckpointError, match=what):
            t.checkpoint(where)
    assert (mine / "important.txt").read_text() == "keep me" and note.read_text() == "notes"
    disk.close()
    assert gf.LocalTable.open(tmp_path / "disk-table").size == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk-table", "notes.txt", "results"]  # nothing left
    empty = tmp_path / "ckpt"
    empty.mkdir()
    t.checkpoint(empty)  # an empty directory made for it
    t.insert(episode(4, 2))
    t.checkpoint(empty)  # and the older checkpoint there replaced
    assert json.loads((empty / "manifest.json").read_text())["kind"] in ("local", "distributed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "disk-table", "notes.txt", "results"]


def test_mismatched_table_is_refused(tmp_path):
    local_table().checkpoint(tmp_path / "ck")
    m = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    m["table"]["spec"]["capacity"] = 301  # the arrays no longer fit the spec
    (tmp_path / "ck" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="capacity|column"):
        gf.LocalTable.restore(tmp_path / "ck")


def test_checkpoint_while_writers_and_samplers_run(tmp_path):
    t = local_table()
    stop = threading.Event()
    errors = []

    def work():
        rng = np.random.default_rng(1)
        try:
            while not stop.is_set():
                t.insert([episode(int(rng.integers(1, 50)), 10)])
                b = t.sample(8, 2)
                t.update_priorities(b.keys, rng.random(8) + 0.1)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=work)
    th.start()
    try:
        results = [t.checkpoint(tmp_path / f"ck{i}") for i in range(5)]
    finally:
        stop.set()
        th.join()
    assert not errors
    for i, r in enumerate(results):
        assert r["pause_s"] < 0.5
        t2 = gf.LocalTable.restore(tmp_path / f"ck{i}")
        reconcile(t2)  # each shard's snapshot is self-consistent


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_checkpoint_taken_while_writers_insert_restores_a_table_that_reuses_no_id_or_stamp(tmp_path, tier):
    """Writers insert while the checkpoint snapshots its shards: the restored table hands out episode ids and
    stamps past every one its shards hold.  The counters were read before the snapshots, so 200 new episodes
    took ids the restored table already held."""
    spec = gf.TableSpec((gf.ColumnSpec("tag", (), np.int64),), capacity=100_000, num_shards=2)
    path = {"path": tmp_path / "table"} if tier == "disk" else {}
    t = gf.LocalTable(spec, sampler=gf.Uniform(), seed=0, **path)
    stop = threading.Event()

    def write():
        i = 0
        while not stop.is_set():
            t.insert([{"tag": np.array([i])}, {"tag": np.array([i + 1])}])
            i += 2

    th = threading.Thread(target=write)
    th.start()
    try:
        for _ in range(10_000):  # the writer well under way (no sleep: its inserts are counted)
            if t.size >= 2000:
                break
            t.info()
        for i in range(3):
            t.checkpoint(tmp_path / f"ck{i}")
    finally:
        stop.set()
        th.join()
    t.close()
    for i in range(3):
        t2 = gf.LocalTable.restore(tmp_path / f"ck{i}")
        held = {int(s.index.get("episode_id", r)) for s in t2.shards for r in range(s.index.first, s.index.next)}
        stamps = max(int(s.touched[s.active == 1].max(initial=-1)) for s in t2.shards)
        r = t2.insert([{"tag": np.array([-1 - j])} for j in range(200)])
        assert not set(r.episode_ids.tolist()) & held and int(r.episode_ids.min()) > max(held)
        new = max(int(s.touched[s.active == 1].max()) for s in t2.shards)
        assert new > stamps and t2._stamp > new  # the new items stamped past the held ones
        t2.close()


@pytest.fixture
def cluster3():
    with own_cluster({"distributed.comm.timeouts.connect": "3s"}, n=3) as cl:  # (its tests kill a worker)
        yield cl


def test_a_handle_sampling_while_a_live_shard_is_replaced_elsewhere_follows_it(cluster3, tmp_path):
    """restore_shard(replace=True) onto another worker dropped the old copy without telling that worker the
    placement had moved on: another handle's samples planned at the old placement met a bare SpecError ("shard
    1 ... is not on this worker") for several batches after the restore returned (4 to 15 of 20).  The drop
    now carries the new placement version, so such a request is refused as stale and redone where the shard
    is, as after a move."""
    c = cluster3
    spec = gf.TableSpec(COLUMNS, capacity=400, num_shards=3)
    t = DistributedTable.create(c, spec, sampler=gf.Uniform(), seed=0, timeout=10)
    t.insert([episode(i + 1, 10) for i in range(30)])
    t.checkpoint(tmp_path / "ck")
    stop, log = threading.Event(), []

    def learner():
        h = DistributedTable.attach(t.name, client=c, seed=1, timeout=10)
        while not stop.is_set():
            try:
                h.sample(16, 1)
                log.append(None)
            except Exception as e:  # noqa: BLE001  (every error counts against it)
                log.append(f"{type(e).__name__}: {e}")

    th = threading.Thread(target=learner)
    th.start()
    try:
        wait_for(lambda: len(log) >= 5, "the learner sampling")
        old = t.placement[1]
        other = next(w for w in sorted(c.nthreads()) if w != old)
        res = t.restore_shard(1, tmp_path / "ck", worker=other, replace=True)
        n0 = len(log)
        wait_for(lambda: len(log) >= n0 + 20, "20 batches after the restore")
    finally:
        stop.set()
        th.join(60)
    assert res["worker"] == other and t.placement[1] == other
    assert [e for e in log if e is not None] == []
    t.close()


def test_distributed_checkpoint_restore_elsewhere_and_after_a_kill(cluster3, tmp_path):
    c = cluster3
    workers = sorted(c.nthreads())
    spec = gf.TableSpec(COLUMNS, capacity=400, num_shards=2)
    t = DistributedTable.create(
        c, spec, sampler=gf.Prioritized(0.6, 0.4), workers=workers[:2], degraded=True, seed=0, name="ck"
    )
    t.insert([episode(i + 1, 20) for i in range(10)])
    b = t.sample(16, 2)
    t.update_priorities(b.keys, np.full(16, 3.0))
    ck = t.checkpoint(tmp_path / "ck")
    assert ck["shards"] == [0, 1]
    before = t.info()

    # restore onto other workers (one worker holding both shards)
    t2 = DistributedTable.restore(c, tmp_path / "ck", name="ck-copy", workers=[workers[2]])
    info2 = t2.info()
    assert set(t2.placement.values()) == {workers[2]}
    assert info2["size"] == before["size"] and info2["totals"]["inserted"] == before["totals"]["inserted"]
    assert [s["size"] for s in info2["shards"]] == [s["size"] for s in before["shards"]]
    assert info2["rate_limiter"]["inserts"] == before["rate_limiter"]["inserts"]
    r = t2.insert([episode(77, 4)])
    assert int(r.episode_ids[0]) >= 10  # ids continue after the checkpoint's
    t2.close()

    # more data after the checkpoint, then lose shard 1's worker
    res = t.insert([episode(50 + i, 10) for i in range(4)])
    after_ck_on_1 = 10 * int((res.shards == 1).sum())
    victim = t.placement[1]
    kill(c.run(os.getpid, workers=[victim])[victim])
    b = t.sample(8, 1)  # degraded: notices the loss, serves from shard 0
    assert set(gf.keys.decode(b.keys.numpy())[0].tolist()) == {0}
    assert 1 in t.info()["lost"]
    rep = t.restore_shard(1, tmp_path / "ck")
    assert rep["lost_items"] == after_ck_on_1  # exactly the items inserted after the checkpoint
    assert rep["items_restored"] == before["shards"][1]["size"]
    info = t.info()
    assert not info["lost"] and info["size"] == info["coordinator_size"]
    shards = set(gf.keys.decode(t.sample(64, 1).keys.numpy())[0].tolist())
    assert shards == {0, 1}


def test_kill_while_writers_and_samplers_run_then_restore(cluster3, tmp_path):
    """Writers and samplers keep running through the loss (degraded mode); the restore reports
    exactly the items that reached the lost shard after the checkpoint."""
    c = cluster3
    workers = sorted(c.nthreads())
    spec = gf.TableSpec(COLUMNS, capacity=5000, num_shards=2)
    t = DistributedTable.create(c, spec, workers=workers[:2], degraded=True, seed=1, name="ck-live")
    t.insert([episode(i + 1, 10) for i in range(10)])
    t.checkpoint(tmp_path / "ck")
    stop = threading.Event()
    after = {0: 0, 1: 0}
    served = []
    errors = []
    lock = threading.Lock()

    def writer(seed):
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            n = int(rng.integers(3, 12))
            try:
                r = t.insert([episode(int(rng.integers(1, 99)), n)])
                with lock:
                    after[int(r.shards[0])] += n
            except gf.ShardLostError:
                pass  # this insert went to the lost shard: not stored, not counted
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    def sampler():
        while not stop.is_set():
            try:
                served.append(len(t.sample(16, 2)))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)] + [threading.Thread(target=sampler)]
    for th in threads:
        th.start()
    time.sleep(1.5)
    victim = t.placement[1]
    os.kill(c.run(os.getpid, workers=[victim])[victim], signal.SIGKILL)
    time.sleep(2.5)
    stop.set()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads) and not errors, errors
    assert 1 in t.info()["lost"] and len(served) > 0
    rep = t.restore_shard(1, tmp_path / "ck")
    assert rep["lost_items"] == after[1]  # exactly what reached shard 1 after the checkpoint
    info = t.info()
    assert not info["lost"] and info["size"] == info["coordinator_size"]


def test_a_distributed_checkpoint_taken_while_a_writer_inserts_restores_the_snapshots_sizes(dist_client, tmp_path):
    """A writer inserts while the workers snapshot their shards: the restored coordinator counts what the
    shards hold, so a table of ``max_size`` filled to it removes nothing.  Its sizes were the coordinator's
    after the snapshots: it counted the writer's later inserts, held more than its shards and evicted early."""
    M = 20_000
    spec = gf.TableSpec((gf.ColumnSpec("tag", (), np.int64),), capacity=40_000, num_shards=2, max_size=M)
    t = DistributedTable.create(dist_client, spec, seed=0)
    stop = threading.Event()
    stored = []

    def write():
        h = DistributedTable.attach(t.name, dist_client)
        i = 0
        while not stop.is_set():
            h.insert([{"tag": np.arange(i, i + 20)}, {"tag": np.arange(i + 20, i + 40)}])
            i += 40
            stored.append(40)

    th = threading.Thread(target=write)
    th.start()
    try:
        wait_for(lambda: sum(stored) >= 2000, "the writer under way")
        t.checkpoint(tmp_path / "ck")
    finally:
        stop.set()
        th.join()
    r = DistributedTable.restore(dist_client, tmp_path / "ck", name="restored")
    try:
        info = r.info()
        assert info["coordinator_size"] == info["size"] > 0, info
        room = M - info["size"]
        r.insert([{"tag": np.arange(room)}])  # exactly up to max_size
        info = r.info()
        assert info["size"] == info["coordinator_size"] == M and info["totals"]["removed"] == 0, info
    finally:
        r.close()
        t.close()


def test_a_distributed_checkpoint_reports_the_bytes_it_wrote_as_a_local_one_does(dist_client, tmp_path, capsys):
    """``bytes`` is the array bytes of the shard files on both tables (it was missing from a distributed
    checkpoint, and ``gear-flow checkpoint`` printed 0.0 MB for every table of a cluster)."""
    from gear_flow import cli

    def array_bytes(path):
        files = json.loads((path / "manifest.json").read_text())["files"]
        return sum(a.nbytes for e in files.values() for a in np.load(path / e["file"]).values())

    spec = gf.TableSpec(COLUMNS, capacity=40_000, num_shards=2)  # 1 MB of rings: the CLI's MB is not 0.0
    eps = [episode(i + 1, 100) for i in range(20)]
    lt = gf.LocalTable(spec, seed=0)
    lt.insert(eps)
    local = lt.checkpoint(tmp_path / "local")
    t = DistributedTable.create(dist_client, spec, seed=0)
    try:
        t.insert(eps)
        res = t.checkpoint(tmp_path / "dist")
        on_disk = sum(os.path.getsize(tmp_path / "dist" / f"shard-{s}.npz") for s in res["shards"])
        assert res["bytes"] == array_bytes(tmp_path / "dist") == local["bytes"] == array_bytes(tmp_path / "local")
        assert 0.95 * on_disk < res["bytes"] < on_disk, (res["bytes"], on_disk)
        capsys.readouterr()
        argv = ["checkpoint", "--scheduler", dist_client.scheduler.address, "--table", t.name, str(tmp_path / "cli")]
        assert cli.main(argv) == 0
        assert f": {array_bytes(tmp_path / 'cli') / 1e6:.1f} MB in " in capsys.readouterr().out
    finally:
        t.close()


def test_each_table_refuses_the_others_checkpoint_in_one_line_and_builds_nothing(dist_client, tmp_path):
    """LocalTable.restore of a distributed table's checkpoint built the table, loaded every shard and then
    failed with a bare KeyError 'stamp' (a distributed checkpoint's state names it next_stamp); onto the disk
    tier it left a half-made disk table in disk_path.  It is refused before anything is built with a
    CheckpointError naming the restore to use, as DistributedTable.restore refuses a local one."""
    spec = gf.TableSpec(COLUMNS, capacity=64, num_shards=2)
    t = DistributedTable.create(dist_client, spec, seed=0)
    try:
        t.insert([episode(1, 6), episode(2, 6)])
        t.checkpoint(tmp_path / "dist")
    finally:
        t.close()
    lt = gf.LocalTable(spec, seed=0)
    lt.insert([episode(1, 6)])
    lt.checkpoint(tmp_path / "local")
    for kw in ({}, {"tier": "disk", "disk_path": tmp_path / "disk"}):
        with pytest.raises(CheckpointError, match="holds a 'distributed' checkpoint; use DistributedTable.restore"):
            gf.LocalTable.restore(tmp_path / "dist", **kw)
    assert not (tmp_path / "disk").exists()
    with pytest.raises(CheckpointError, match="holds a 'local' checkpoint; use LocalTable.restore"):
        DistributedTable.restore(dist_client, tmp_path / "local")
    assert gf.LocalTable.restore(tmp_path / "local").size == 6


def test_a_queue_checkpointed_while_an_insert_lands_restores_every_item_as_waiting(tmp_path, dist_client):
    """A checkpoint takes the limiter's counts and the shards' snapshots at different moments: an insert that
    landed between them (before the snapshots of a local table, after the workers' of a distributed one)
    left a restored queue counting fewer or more items waiting than it held (3 held, 2 waiting: one never
    went out).  A restored queue's limiter counts its items as waiting, local and distributed alike."""
    spec = gf.TableSpec((gf.ColumnSpec("tag", (), np.int64),), capacity=64, num_shards=2)
    # local: the insert lands after the limiter's counts were taken, before the shards are snapshotted
    t = gf.LocalTable.queue(spec, 8)
    t.insert([{"tag": np.array([1])}, {"tag": np.array([2])}])
    snap, landed = ck.snapshot_shard, []

    def racing(shard):
        if not landed:
            landed.append(t.insert([{"tag": np.array([3])}]))
        return snap(shard)

    ck.snapshot_shard = racing
    try:
        t.checkpoint(tmp_path / "local")
    finally:
        ck.snapshot_shard = snap
    r = gf.LocalTable.restore(tmp_path / "local")
    assert r.size == 3 and r.info()["rate_limiter"]["inserts"] - r.info()["rate_limiter"]["samples"] == 3
    assert r.sample(3, 1, timeout=10)["tag"].numpy().ravel().tolist() == [1, 2, 3]
    # distributed: the insert lands after the workers' snapshots, before the coordinator's counts are read
    d = DistributedTable.queue(dist_client, spec, 8)
    d.insert([{"tag": np.array([1])}, {"tag": np.array([2])}])
    coord, lookup, landed = d._link.coordinator, d._link.coordinator.lookup, []

    async def racing_lookup(*a, **k):
        if not landed:
            landed.append(await d.insert_async([{"tag": np.array([3])}]))
        return await lookup(*a, **k)

    coord.lookup = racing_lookup
    try:
        d.checkpoint(tmp_path / "dist")
    finally:
        coord.lookup = lookup
    assert landed
    r = DistributedTable.restore(dist_client, tmp_path / "dist", name="restored-queue")
    try:
        lim = r.info()["rate_limiter"]
        assert r.size == 2 and lim["inserts"] - lim["samples"] == 2, lim  # the snapshots' items, all waiting
        assert r.sample(2, 1, timeout=10)["tag"].numpy().ravel().tolist() == [1, 2]
    finally:
        r.close()
        d.close()


@pytest.mark.parametrize("damage", ["flip", "missing-shard"])
def test_a_distributed_restore_that_fails_leaves_nothing_behind(dist_client, tmp_path, damage):
    """One shard's file fails verification on its worker (the other worker's shard loads), or the manifest
    of a table that is not degraded names no file for a shard: the restore raises CheckpointError and no
    worker nor the coordinator keeps anything of it."""
    spec = gf.TableSpec(COLUMNS, capacity=200, num_shards=2)
    t = DistributedTable.create(dist_client, spec, seed=0, name="ck-src")
    try:
        t.insert([episode(i, 10) for i in range(4)])
        t.checkpoint(tmp_path / "ck")
    finally:
        t.close()
    d = tmp_path / "ck"
    if damage == "flip":
        b = bytearray((d / "shard-1.npz").read_bytes())
        b[len(b) // 2] ^= 0xFF
        (d / "shard-1.npz").write_bytes(bytes(b))
    else:
        m = json.loads((d / "manifest.json").read_text())
        del m["files"]["1"]
        (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="no file for shard" if damage == "missing-shard" else "shard-1"):
        DistributedTable.restore(dist_client, d, name="ck-bad")
    assert all("ck-bad" not in names for names in dist_client.run(tables_here).values())
    with pytest.raises(gf.SpecError):
        DistributedTable.attach("ck-bad", client=dist_client)


def test_a_restore_under_a_live_tables_name_is_refused_before_any_worker_loads(dist_client, tmp_path):
    """Restoring a checkpoint under the name of a table that is live: SpecError before any worker loads a
    shard (they would replace that table's shards), and the live table is as it was."""
    spec = gf.TableSpec(COLUMNS, capacity=200, num_shards=2)
    src = DistributedTable.create(dist_client, spec, seed=0, name="ck-other")
    live = DistributedTable.create(dist_client, spec, seed=0, name="ck-live")
    try:
        src.insert([episode(i, 10) for i in range(4)])
        src.checkpoint(tmp_path / "ck")
        live.insert([episode(100 + i, 5) for i in range(2)])
        with pytest.raises(gf.SpecError, match="already exists"):
            DistributedTable.restore(dist_client, tmp_path / "ck", name="ck-live")
        info = live.info()
        assert info["size"] == info["coordinator_size"] == 10 and len(info["shards"]) == 2
        assert set(live.sample(64, 1)["ep"].numpy().ravel().tolist()) == {100, 101}  # its own episodes
    finally:
        live.close()
        src.close()
