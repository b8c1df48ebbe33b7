"""A distributed table on the ``disk`` tier: each shard's files on its worker, its own checkpoint.

What the shards hold is read from the worker processes themselves
(``client.run``), episode by episode in the order each shard stores them, so
"every episode is back" is checked on the data, not on counters.
"""

from __future__ import annotations

import os
from pathlib import Path

import dask
import numpy as np
import pytest
from dist_support import DIAL, coordinator, kill, own_cluster, tables_here, wait_for
from helpers import Catalog, check_windows, episode, make_spec

import gear_flow as gf
from gear_flow import checkpoint as ck
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.host import ShardHost
from gear_flow.distributed.transport import CoordinatorClient
from gear_flow.errors import CheckpointError, SpecError
from gear_flow.shard import EpisodeBatch
from gear_flow.storage import disk_state
from gear_flow.table.config import TableConfig

pytestmark = pytest.mark.timeout(120)


def _episodes(name, dask_worker=None):
    """``{shard: [(episode id, {column: its steps}), ...]}`` of this worker's shards, in the order stored."""
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    out = {}
    for i, s in sorted((t.shards if t is not None else {}).items()):
        arrays, _ = ck.snapshot_shard(s)
        eps = []
        for eid, start, n in zip(arrays["episode_episode_id"], arrays["episode_start"], arrays["episode_length"]):
            at = (int(start) + np.arange(int(n))) % s.capacity
            eps.append((int(eid), {c: arrays[f"col_{c}"][at].tolist() for c in s.ring.columns}))
        out[i] = eps
    return out


def stored(client, name) -> dict[int, list]:
    """Every shard's episodes, from whichever worker holds it (a shard on two workers fails the test)."""
    out = {}
    for per in client.run(_episodes, name).values():
        for i, eps in per.items():
            assert i not in out, f"shard {i} is on two workers"
            out[i] = eps
    return out


def expected(catalog: Catalog, shards: dict[int, list[int]]) -> dict[int, list]:
    """What ``stored`` must give: per shard, its episodes (ids in insertion order) as :func:`episode` made them."""
    out = {}
    for i, ids in shards.items():
        eps = []
        for eid in ids:
            tag, n, _ = catalog.by_id[eid]
            eps.append((eid, {c: np.asarray(v).tolist() for c, v in episode(tag, n).items()}))
        out[i] = eps
    return out


def insert(catalog: Catalog, t, tags_lengths, by_shard: dict[int, list[int]]):
    res = catalog.insert(t, tags_lengths)
    for eid, s in zip(res.episode_ids.tolist(), res.shards.tolist()):
        by_shard.setdefault(int(s), []).append(int(eid))
    return res


def _set(settings, dask_worker=None):
    dask.config.set(settings)  # (not a context: this worker keeps it)


def layouts(root: Path) -> list[str]:
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("layout.json"))


def test_a_distributed_disk_table_hands_out_what_a_host_one_does_and_stores_every_episode(dist_client, tmp_path):
    """The same episodes into a disk table and a host table (owners draw on both): the same batches, keys,
    data and probabilities, round after round with priority updates; each shard's files hold exactly the
    episodes routed to it, step by step, in order; ``flush(disk=True)`` leaves every shard clean and
    ``close()`` removes the files."""
    spec = make_spec(capacity=300, num_shards=2)
    kw = dict(sampler=gf.Prioritized(0.8, 0.5), seed=3)
    with dask.config.set({"gear-flow.distributed.shared-memory": False, "gear-flow.distributed.reader-draw": False}):
        disk = DistributedTable.create(dist_client, spec, tier="disk", path=tmp_path, name="disk-a", **kw)
        host = DistributedTable.create(dist_client, spec, name="host-a", **kw)
    try:
        catalog, by_shard = Catalog(), {}
        tags = [(k + 1, 5 + k % 7) for k in range(30)]
        for part in (tags[:10], tags[10:25], tags[25:]):
            insert(catalog, disk, part, by_shard)
            host.insert([episode(tag, n) for tag, n in part])
        assert layouts(tmp_path) == ["disk-a/shard-0", "disk-a/shard-1"]
        for r in range(6):
            a, b = disk.sample(16, 3), host.sample(16, 3)
            assert a.keys.tolist() == b.keys.tolist(), r
            for c in ("obs", "ep", "t", "done"):
                assert np.asarray(a[c]).tolist() == np.asarray(b[c]).tolist(), (r, c)
            assert np.allclose(a.probabilities.numpy(), b.probabilities.numpy()), r
            assert (a.probabilities.numpy() > 0).all() and (a.probabilities.numpy() <= 1).all()
            check_windows(a, catalog, 3, "strict")
            prios = np.arange(1.0, 17.0) + r
            assert disk.update_priorities(a.keys, prios).applied == host.update_priorities(b.keys, prios).applied
        assert stored(dist_client, disk.name) == expected(catalog, by_shard)
        assert disk.info()["size"] == disk.size == host.size == sum(n for _, n in tags)
        with pytest.raises(SpecError, match=r"flush\(disk=True\) is for disk tables"):
            host.flush(disk=True)
        rep = disk.flush(disk=True)
        assert rep["shards"] == [0, 1] and rep["bytes_checksummed"] > 0
        assert all(s["disk"]["clean"] for s in disk.info()["shards"])
    finally:
        host.close()
        disk.close()
    assert layouts(tmp_path) == [] and list(tmp_path.iterdir()) == []  # dropped: its files went with it
    assert "disk-a" not in coordinator(disk).list()


def test_a_killed_workers_disk_shard_is_reopened_in_place_with_every_completed_insert(tmp_path):
    """SIGKILL the process holding shard 1; another worker of the machine reopens its files in place: every
    episode inserted before the kill is back, in order, the coordinator's counts agree (nothing lost), a
    key issued before the kill still updates its item, and the table samples and inserts again with new
    episode ids and keys."""
    with own_cluster(DIAL, n=2) as client:
        t = DistributedTable.create(
            client,
            make_spec(capacity=400, num_shards=2),
            tier="disk",
            path=tmp_path,
            name="disk-b",
            sampler=gf.Prioritized(0.8, 0.5),
            degraded=True,
            seed=1,
        )
        catalog, by_shard = Catalog(), {}
        for k in range(8):
            insert(catalog, t, [(10 * k + j + 1, 4 + j) for j in range(4)], by_shard)
        old = t.sample(32, 1)
        before = stored(client, t.name)
        assert before == expected(catalog, by_shard)
        victim, survivor = t.placement[1], t.placement[0]
        kill(client.run(os.getpid, workers=[victim])[victim])
        wait_for(lambda: 1 in coordinator(t).lookup()["lost"], "shard 1 marked lost")

        rep = t.restore_shard(1, tmp_path / "disk-b", worker=survivor)
        assert rep["worker"] == survivor and rep["directory"] == str(tmp_path / "disk-b" / "shard-1")
        assert rep["items_restored"] == rep["inserted_at_checkpoint"] == rep["inserted_at_loss"]
        assert rep["lost_items"] == 0 and rep["recovered"]["torn_steps"] == 0
        print(f"\nreopen in place of shard 1 ({rep['items_restored']} items): {rep['reopened_s'] * 1e3:.1f} ms")
        assert stored(client, t.name) == before  # every episode, step by step, in the order stored
        info = t.info()
        assert not info["lost"] and info["size"] == info["coordinator_size"] == t.size
        assert t.placement == {0: survivor, 1: survivor}

        on_1 = gf.keys.decode(old.keys.numpy())[0] == 1
        res = t.update_priorities(old.keys[on_1], np.full(int(on_1.sum()), 7.0))  # keys issued before the kill
        assert res.applied == int(on_1.sum()) > 0 and res.stale == 0
        check_windows(t.sample(64, 2), catalog, 2, "strict")
        assert {0, 1} == set(gf.keys.decode(t.sample(64, 1).keys.numpy())[0].tolist())
        old_ids = set(catalog.by_id)
        used = {(k >> 56, (k & ((1 << 56) - 1)) + j) for _, n, k in catalog.by_id.values() for j in range(n)}
        new = insert(catalog, t, [(900 + j, 6) for j in range(4)], by_shard)
        assert set(new.shards.tolist()) == {0, 1}
        assert min(new.episode_ids.tolist()) > max(old_ids)  # episode ids never handed out again
        for fk in new.first_keys.tolist():
            assert not {(fk >> 56, (fk & ((1 << 56) - 1)) + j) for j in range(6)} & used  # nor keys
        assert stored(client, t.name) == expected(catalog, by_shard)
        t.close()
        assert layouts(tmp_path) == []


def test_a_disk_shard_that_fails_a_check_is_not_reopened_and_stays_lost(tmp_path):
    """A lost shard's header corrupted, another shard's directory, a directory with no shard, a live shard:
    each refused with a one-line error naming why; the shard stays lost, no worker hosts it, its files are
    untouched; once the header is whole again it reopens."""
    with own_cluster(DIAL, n=2) as client:
        t = DistributedTable.create(
            client, make_spec(capacity=200, num_shards=2), tier="disk", path=tmp_path, name="disk-c", degraded=True
        )
        catalog, by_shard = Catalog(), {}
        insert(catalog, t, [(k + 1, 5) for k in range(12)], by_shard)
        victim, survivor = t.placement[1], t.placement[0]
        with pytest.raises(SpecError, match=r"shard 0 of table 'disk-c' is alive .* maps its files"):
            t.restore_shard(0, tmp_path / "disk-c", worker=victim)
        kill(client.run(os.getpid, workers=[victim])[victim])
        wait_for(lambda: 1 in coordinator(t).lookup()["lost"], "shard 1 marked lost")

        header = tmp_path / "disk-c" / "shard-1" / "header.bin"
        good = header.read_bytes()
        raw = bytearray(good)
        raw[64 + int.from_bytes(raw[:8], "little") * 512 + 40] ^= 0xFF  # the current slot's write position
        header.write_bytes(bytes(raw))
        files = {p: p.read_bytes() for p in (tmp_path / "disk-c").rglob("*") if p.is_file()}
        state = coordinator(t).lookup()
        for path, why in [
            (tmp_path / "disk-c", r"shard-1/header.bin is corrupted \(CRC32 mismatch\)"),
            (tmp_path / "disk-c" / "shard-0", r"holds shard 0, not shard 1"),
            (tmp_path / "nothing", r"holds no disk shard 1"),
        ]:
            with pytest.raises(CheckpointError, match=why) as e:
                t.restore_shard(1, path, worker=survivor)
            assert "\n" not in str(e.value)
            assert coordinator(t).lookup() == state  # still lost, nothing placed
            hosted = client.run(_hosted, t.name)  # (the killed worker's nanny may have started a new one)
            assert hosted.pop(survivor) == [0] and all(v == [] for v in hosted.values()), hosted
            assert {p: p.read_bytes() for p in files} == files
        header.write_bytes(good)
        rep = t.restore_shard(1, tmp_path / "disk-c" / "shard-1", worker=survivor)
        assert rep["lost_items"] == 0 and rep["items_restored"] == 5 * len(by_shard[1])
        assert stored(client, t.name) == expected(catalog, by_shard)
        t.close()


def test_disk_shards_move_in_place_on_one_machine_and_are_copied_to_another(tmp_path):
    """A move to a worker that counts as another host (its own host id and ``disk.path``) copies the shard
    into new files there, and the source's files go; ``retire_workers`` of a holder moves its shard to a
    worker of the same machine by its files (the same inodes: nothing copied).  Every episode is there
    after each, in order."""
    with own_cluster(DIAL, n=3) as client:
        w = sorted(client.nthreads())
        client.run(_set, {"gear-flow.disk.path": str(tmp_path / "near")}, workers=w[:2])
        client.run(_set, {"gear-flow.distributed.host-id": "elsewhere", "gear-flow.disk.path": str(tmp_path / "far")}, workers=[w[2]])  # fmt: skip
        t = DistributedTable.create(client, make_spec(capacity=300, num_shards=2), tier="disk", name="disk-d", workers=w[:2])  # fmt: skip
        catalog, by_shard = Catalog(), {}
        insert(catalog, t, [(k + 1, 3 + k % 5) for k in range(20)], by_shard)
        assert t.placement == {0: w[0], 1: w[1]}

        t.move_shards([0], w[2])
        assert layouts(tmp_path) == ["far/disk-d/shard-0", "near/disk-d/shard-1"]  # copied; the source's gone
        assert stored(client, t.name) == expected(catalog, by_shard)

        ring = tmp_path / "near" / "disk-d" / "shard-1" / "ring-0.bin"
        inode = ring.stat().st_ino
        assert list(client.retire_workers(workers=[w[1]])) == [w[1]]  # its shard goes to w0 (the fewest)
        st = coordinator(t).lookup()
        assert not st["lost"] and st["placement"] == {0: w[2], 1: w[0]}
        assert ring.stat().st_ino == inode and layouts(tmp_path) == ["far/disk-d/shard-0", "near/disk-d/shard-1"]
        assert stored(client, t.name) == expected(catalog, by_shard)
        insert(catalog, t, [(500 + k, 4) for k in range(4)], by_shard)
        check_windows(t.sample(32, 2), catalog, 2, "strict")
        assert stored(client, t.name) == expected(catalog, by_shard)
        t.close()
        assert layouts(tmp_path) == []


def _open_under(root: str, dask_worker=None) -> int:
    """Descriptors this process holds of files under ``root`` (deleted ones included) or mappings of them."""
    import os

    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(root)
        except OSError:
            pass
    with open("/proc/self/maps") as f:
        return n + sum(root in line for line in f)


def test_a_dropped_disk_tables_files_are_let_go_at_once(dist_client, tmp_path):
    """Dropped, a disk table's files were removed but the workers kept them open and mapped (90 deleted files,
    292 MiB of disk after five cycles) until Python's cyclic GC happened to run: every shard was in reference
    cycles with its selectors, its tail masses and its files.  A shard is in none now: once close() drops the
    table, no worker holds a descriptor or a mapping of its files."""
    root = str(tmp_path / "w")
    dist_client.run(_set, {"gear-flow.disk.path": root})
    try:
        for _ in range(2):
            t = DistributedTable.create(dist_client, make_spec(capacity=100, num_shards=2), tier="disk",
                                        sampler=gf.Prioritized(), name="disk-let-go")  # fmt: skip
            t.insert([episode(k + 1, 4) for k in range(6)])
            t.sample(4, 2)
            assert sum(dist_client.run(_open_under, root).values()) > 0
            t.close()
            assert layouts(tmp_path) == []
            assert dist_client.run(_open_under, root) == dict.fromkeys(dist_client.run(_open_under, root), 0)
    finally:
        dist_client.run(_set, {"gear-flow.disk.path": None})


def test_a_worker_without_a_disk_path_refuses_the_table_and_nothing_is_left(dist_client, tmp_path):
    """One worker has ``gear-flow.disk.path``, the other none: ``create(tier="disk")`` fails with one line
    naming the worker, and neither worker, the coordinator nor the disk keeps anything of it; with a path on
    both, each worker keeps its shards under its own ``<disk.path>/<name>``; ``close(drop=False)`` flushes
    them and leaves them there, ``close()`` removes them."""
    w0, w1 = sorted(dist_client.nthreads())
    spec = make_spec(capacity=100, num_shards=2)
    try:
        dist_client.run(_set, {"gear-flow.disk.path": str(tmp_path / "w0")}, workers=[w0])
        with pytest.raises(SpecError, match=rf"^worker {w1}: disk table 'disk-e' needs a directory") as e:
            DistributedTable.create(dist_client, spec, tier="disk", name="disk-e")
        assert "\n" not in str(e.value)
        assert layouts(tmp_path) == [] and not (tmp_path / "w0" / "disk-e").exists()
        assert all("disk-e" not in v for v in dist_client.run(tables_here).values())
        assert "disk-e" not in CoordinatorClient.of(dist_client).list()
        with pytest.raises(SpecError, match=r"path= is for disk tables; this one is on the 'host' tier"):
            DistributedTable.create(dist_client, spec, path=tmp_path, name="disk-e")

        dist_client.run(_set, {"gear-flow.disk.path": str(tmp_path / "w1")}, workers=[w1])
        t = DistributedTable.create(dist_client, spec, tier="disk", name="disk-e")
        t.insert([episode(k + 1, 4) for k in range(6)])
        assert layouts(tmp_path) == ["w0/disk-e/shard-0", "w1/disk-e/shard-1"]
        t.close(drop=False)  # kept for later: flushed, the files stay
        assert layouts(tmp_path) == ["w0/disk-e/shard-0", "w1/disk-e/shard-1"]
        for d in ("w0/disk-e/shard-0", "w1/disk-e/shard-1"):
            assert disk_state.read_header(tmp_path / d)["clean"] == 1
        t.close()
        assert layouts(tmp_path) == []
    finally:
        dist_client.run(_set, {"gear-flow.disk.path": None})


def test_a_worker_builds_a_disk_tables_shards_all_or_none_and_lets_go_of_them_as_told(tmp_path):
    """The worker's side, without a cluster: shard 1's directory holds a shard already, so building shards 0
    and 1 fails naming it and leaves no directory of shard 0; reopening checks the files first; dropping
    removes them, a closing worker flushes and keeps them."""
    cfg = TableConfig.build(make_spec(capacity=50, num_shards=2), tier="disk").to_dict()
    cfg["disk_path"] = str(tmp_path)
    host = ShardHost()
    host.create("t", cfg, [1])
    shard = host.shard("t", 1)
    with shard.lock:
        shard.insert(EpisodeBatch([episode(1, 5)], np.array([5]), np.array([0]), np.array([0])))
    host.close()  # the worker closes: flushed, kept
    assert layouts(tmp_path) == ["t/shard-1"] and disk_state.read_header(tmp_path / "t" / "shard-1")["clean"] == 1
    other = ShardHost()
    with pytest.raises(SpecError, match=r"t/shard-1 already holds the files of a shard 1 of a table named 't'"):
        other.create("t", cfg, [0, 1])
    assert layouts(tmp_path) == ["t/shard-1"] and not (tmp_path / "t" / "shard-0").exists()
    with pytest.raises(CheckpointError, match="holds shard 1, not shard 0"):
        other.reopen("t", cfg, tmp_path / "t" / "shard-1", 0)
    assert "t" not in other.tables
    rep = other.reopen("t", cfg, tmp_path / "t", 1)
    assert rep["size"] == 5 and rep["directory"] == str(tmp_path / "t" / "shard-1")
    with pytest.raises(SpecError, match="shard 1 of table 't' is hosted on this worker already"):
        other.reopen("t", cfg, tmp_path / "t", 1)
    with pytest.raises(SpecError, match="in use by shard 1 of table 't' on this worker"):
        other.reopen("t2", cfg, tmp_path / "t", 1)  # two mappings writing one shard's files: refused
    assert sorted(other.tables) == ["t"]
    assert list(other.flush_disk("t")) == [1] and disk_state.read_header(tmp_path / "t" / "shard-1")["clean"] == 1
    other.drop("t")
    assert list(tmp_path.iterdir()) == []


def _hosted(name, dask_worker=None):
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    return [] if t is None else sorted(t.shards)
