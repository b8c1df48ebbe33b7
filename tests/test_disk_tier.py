"""The ``disk`` tier: parity with the host tier batch by batch, a table reopened from its files, a process
killed mid-insert, corrupted and foreign files.

The composition, property, fuzz, Reverb-semantics and chi-squared suites run on the
disk tier too (the ``disk`` kind of the ``make_table`` fixture).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from dist_support import wait_for
from helpers import episode, make_spec

import gear_flow as gf
from gear_flow import checkpoint as ck
from gear_flow.errors import CheckpointError, SpecError
from gear_flow.storage import disk_state

SAMPLERS = {
    "uniform": gf.Uniform,
    "prioritized": lambda: gf.Prioritized(0.8, 0.5),
    "fifo": gf.Fifo,
    "lifo": gf.Lifo,
    "max_heap": gf.MaxHeap,
    "min_heap": gf.MinHeap,
    "without_replacement": gf.WithoutReplacement,
}


def live_content(table) -> list:
    """Every shard's live episodes (id, start, length, stamp) and their steps, in order, plus the trees."""
    out = []
    for s in table.shards:
        arrays, meta = ck.snapshot_shard(s)
        eps = [arrays[f"episode_{f}"].tolist() for f in ("episode_id", "start", "length", "stamp")]
        steps = {}
        for name in s.ring.columns:
            col = arrays[f"col_{name}"]
            steps[name] = [col[(st + np.arange(n)) % s.capacity].tolist() for st, n in zip(eps[1], eps[2])]
        trees = {k: arrays[k].tolist() for k in ("sampler_tree", "remover_tree") if k in arrays}
        out.append((eps, steps, arrays["active"].tolist(), arrays["priority"].tolist(), trees, meta["counters"]))
    return out


def same_batches(a, b, rounds: int, rng, update: bool = True) -> None:
    """``a`` and ``b`` hand out the same batches (keys, data, probabilities, in order) under the same changes."""
    for r in range(rounds):
        x = a.sample(batch_size=6, length=3, boundary="pad_tail")
        y = b.sample(batch_size=6, length=3, boundary="pad_tail")
        assert x.keys.tolist() == y.keys.tolist()
        for name in ("obs", "ep", "t"):
            assert np.asarray(x[name]).tolist() == np.asarray(y[name]).tolist()
        assert np.asarray(x.probabilities).tolist() == np.asarray(y.probabilities).tolist()
        assert np.asarray(x.priorities).tolist() == np.asarray(y.priorities).tolist()
        if update:
            pr = rng.random(len(x.keys)) * 3
            assert a.update_priorities(x.keys, pr) == b.update_priorities(y.keys, pr)
        if r % 3 == 2:
            assert a.delete(x.keys[:1]) == b.delete(y.keys[:1])


@pytest.mark.parametrize("unit", ["step", "episode"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_disk_tier_hands_out_what_the_host_tier_does_batch_by_batch_and_after_a_reopen(sampler, unit, tmp_path):
    spec = make_spec(capacity=40, num_shards=2, item_unit=unit)
    kw = dict(sampler=SAMPLERS[sampler](), seed=3, max_times_sampled=0 if unit == "step" else 12, timeout=5)
    host = gf.LocalTable(spec, **kw)
    disk = gf.LocalTable(spec, tier="disk", path=tmp_path / "t", **kw)
    rng = np.random.default_rng(0)
    tag = 1
    for rnd in range(8):  # past the rings' capacity: evictions, wrapped windows
        eps = [episode(tag + k, int(n)) for k, n in enumerate(rng.integers(2, 9, 3))]
        tag += len(eps)
        pr = rng.random(sum(len(e["t"]) for e in eps) if unit == "step" else len(eps)) + 0.1
        a, b = host.insert(eps, priorities=pr), disk.insert(eps, priorities=pr)
        assert a.first_keys.tolist() == b.first_keys.tolist()
        same_batches(host, disk, 3, np.random.default_rng(rnd))
    assert live_content(host) == live_content(disk)
    assert host.info()["totals"] == disk.info()["totals"]
    # reopened from its files, against the host table restored from a checkpoint taken at the same point
    host.checkpoint(tmp_path / "ckpt")
    disk.close()
    host2 = gf.LocalTable.restore(tmp_path / "ckpt", seed=11)
    disk2 = gf.LocalTable.open(tmp_path / "t", verify="full", seed=11)
    assert live_content(host2) == live_content(disk2)
    for rnd in range(3):
        eps = [episode(tag + k, 5) for k in range(2)]
        tag += 2
        assert host2.insert(eps).first_keys.tolist() == disk2.insert(eps).first_keys.tolist()
        same_batches(host2, disk2, 3, np.random.default_rng(100 + rnd))
    assert live_content(host2) == live_content(disk2)


def test_a_disk_table_reopens_with_its_counters_ids_and_limiter_and_grows_its_index(tmp_path):
    spec = make_spec(capacity=1000, num_shards=1)
    t = gf.LocalTable(
        spec, tier="disk", path=tmp_path / "t", rate_limiter=gf.SampleToInsertRatio(2.0, 1, 10_000.0), seed=0, timeout=5
    )
    for k in range(100):  # the episode index grows from 64 records to 128: a new file, the old one goes
        t.insert(episode(k + 1, 3))
    t.sample(batch_size=4, length=1)
    names = sorted(p.name for p in (tmp_path / "t" / "shard-0").glob("index-*.bin"))
    assert names == ["index-128.bin"]
    info = t.info()
    t.close()
    t2 = gf.LocalTable.open(tmp_path / "t")
    assert t2.size == 300
    assert t2.info()["totals"] == info["totals"]
    assert t2.info()["rate_limiter"] == info["rate_limiter"]
    r = t2.insert(episode(101, 2))
    assert int(r.episode_ids[0]) == 100  # ids are never reused
    with pytest.raises(gf.errors.TableClosedError):
        t.insert(episode(1, 2))


def test_a_disk_table_open_in_one_table_is_refused_to_another_until_it_is_closed(tmp_path):
    """A disk table opened again while it was open, in this process or another, handed out the same keys and
    episode ids and wrote the same ring slots as the first: the size after both inserted 3 steps was 8, not
    11, and one insert's steps were gone.  The directory is now locked while a table has it open."""
    t = gf.LocalTable(make_spec(capacity=64), tier="disk", path=tmp_path / "t", seed=0)
    t.insert(episode(1, 5))
    t.flush()
    with pytest.raises(CheckpointError, match="is open in another table"):
        gf.LocalTable.open(tmp_path / "t")
    code = f"import gear_flow as gf; gf.LocalTable.open({str(tmp_path / 't')!r})"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert other.returncode == 1 and "is open in another table" in other.stderr.splitlines()[-1]
    r = t.insert(episode(2, 3))
    assert (int(r.first_keys[0]), int(r.episode_ids[0])) == (5, 1)
    t.close()
    t2 = gf.LocalTable.open(tmp_path / "t")  # closed: the next may open it
    assert t2.size == 8
    assert int(t2.insert(episode(3, 3)).episode_ids[0]) == 2
    t2.close()
    other = subprocess.run([sys.executable, "-c", code + ".close()"], capture_output=True, text=True, timeout=120)
    assert other.returncode == 0, other.stderr[-2000:]


def test_a_forked_child_does_not_keep_a_disk_tables_directory_locked(tmp_path):
    """A flock belongs to every copy of its descriptor: a child forked while the table was open (a DataLoader's
    worker) kept the directory locked after the table was closed, for as long as it lived.  A forked child
    now drops its copy at once; the parent's lock holds until it closes."""
    t = gf.LocalTable(make_spec(capacity=64), tier="disk", path=tmp_path / "t", seed=0)
    t.insert(episode(1, 4))
    pid = os.fork()
    if pid == 0:  # a worker that never touches the table
        time.sleep(60)
        os._exit(0)
    try:
        code = f"import gear_flow as gf; gf.LocalTable.open({str(tmp_path / 't')!r}).close()"
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert other.returncode == 1 and "is open in another table" in other.stderr  # the parent's lock holds
        t.close()
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stderr[-2000:]  # closed: open again, the child still alive
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_disk_table_is_a_checkpoint_that_restores_into_memory(tmp_path):
    spec = make_spec(capacity=100, num_shards=2)
    disk = gf.LocalTable(spec, tier="disk", path=tmp_path / "t", sampler=gf.Prioritized(0.5, 0.5), seed=1)
    for k in range(30):
        disk.insert(episode(k + 1, 5), priorities=np.arange(5.0) + k)
    want = live_content(disk)
    disk.close()
    host = gf.LocalTable.restore(tmp_path / "t", seed=2)
    assert host.cfg.tier == "host" and live_content(host) == want
    assert host.insert(episode(99, 3)).episode_ids.tolist() == [30]
    again = gf.LocalTable.open(tmp_path / "t", seed=2)  # the directory is still the disk table
    assert live_content(again) == want


def test_disk_files_are_sparse_private_and_accounted(tmp_path):
    spec = gf.TableSpec((gf.ColumnSpec("obs", (1024,), np.float32),), capacity=100_000)  # a 400 MB ring
    t = gf.LocalTable(spec, tier="disk", path=tmp_path / "t")
    t.insert({"obs": np.ones((10, 1024), np.float32)})
    st = t.info()["storage"]
    assert st["bytes_on_disk"] < 20 << 20, st  # the ring's blocks are allocated as written
    assert st["bytes_resident"] is None or st["bytes_resident"] < 20 << 20
    assert st["tier"] == "disk" and st["path"] == str(tmp_path / "t")
    for p in (tmp_path / "t").rglob("*"):
        assert p.stat().st_mode & 0o077 == 0, p  # replay data: private, as checkpoints are
    t.flush()
    assert t.info()["storage"]["clean"]


def test_disk_table_arguments_get_one_line_errors(tmp_path):
    spec = make_spec()
    with pytest.raises(SpecError, match="needs a directory"):
        gf.LocalTable(spec, tier="disk")
    gf.LocalTable(spec, tier="disk", path=tmp_path / "t").close()
    with pytest.raises(SpecError, match="already holds a table"):
        gf.LocalTable(spec, tier="disk", path=tmp_path / "t")
    with pytest.raises(SpecError, match="flush\\(\\) is for disk tables"):
        gf.LocalTable(spec).flush()
    with pytest.raises(SpecError, match="verify"):
        gf.LocalTable.open(tmp_path / "t", verify="yes")
    with pytest.raises(CheckpointError, match="no manifest"):
        gf.LocalTable.open(tmp_path / "nothing")
    gf.LocalTable(spec).checkpoint(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="not a disk table"):
        gf.LocalTable.open(tmp_path / "ck")


def _files(root: Path) -> dict:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _filled(tmp_path, n_eps: int = 12) -> Path:
    t = gf.LocalTable(make_spec(capacity=200, num_shards=2), tier="disk", path=tmp_path / "t", seed=0)
    for k in range(n_eps):
        t.insert(episode(k + 1, 6))
    t.close()
    return tmp_path / "t"


def test_a_corrupted_header_is_refused_and_nothing_is_opened(tmp_path):
    root = _filled(tmp_path)
    path = root / "shard-1" / "header.bin"
    raw = bytearray(path.read_bytes())
    cur = int.from_bytes(raw[:8], "little")
    raw[64 + cur * 512 + 40] ^= 0xFF  # a byte of the current slot's write position
    path.write_bytes(bytes(raw))
    before = _files(root)
    with pytest.raises(CheckpointError, match=r"shard-1/header.bin is corrupted \(CRC32 mismatch\)"):
        gf.LocalTable.open(root)
    assert _files(root) == before  # shard 0 was checked, not opened: nothing written


def test_a_corrupted_ring_is_found_by_a_full_verify_and_a_truncated_one_by_any_open(tmp_path):
    root = _filled(tmp_path)
    ring = root / "shard-0" / "ring-0.bin"
    raw = bytearray(ring.read_bytes())
    raw[12] ^= 0x01  # a bit of the first stored step's obs
    ring.write_bytes(bytes(raw))
    before = _files(root)
    with pytest.raises(CheckpointError, match=r"ring-0.bin is corrupted at bytes \[0, \d+\) \(CRC32 mismatch\)"):
        gf.LocalTable.open(root, verify="full")
    assert _files(root) == before  # verified before anything was mapped: nothing written
    ring.write_bytes(bytes(raw[:-4]))
    with pytest.raises(CheckpointError, match=r"ring-0.bin has \d+ bytes, its layout says \d+"):
        gf.LocalTable.open(root)


@pytest.mark.parametrize("name", ["priority", "active", "touched", "step_episode", "sampler-tree", "index-64"])
def test_a_full_verify_finds_a_flipped_bit_in_every_file_and_writes_nothing(name, tmp_path):
    """Every array of a cleanly closed shard is checked, not only the rings, and a refused open leaves every
    file as it was (the second shard's, whose first shard was fine, included)."""
    root = _filled(tmp_path)
    path = root / "shard-1" / f"{name}.bin"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3] ^= 0x10
    path.write_bytes(bytes(raw))
    before = _files(root)
    with pytest.raises(CheckpointError, match=rf"shard-1: {name}.bin is corrupted at bytes \[0, \d+\)"):
        gf.LocalTable.open(root, verify="full")
    assert _files(root) == before
    gf.LocalTable.open(root).close()  # a quick open does not read the arrays


@pytest.mark.parametrize("sums", [{"priority": []}, {"priority": 7}, [1, 2], {"active": [0, 1]}])
def test_checksums_that_do_not_describe_the_files_are_refused_in_one_line(sums, tmp_path):
    root = _filled(tmp_path)
    path = root / "shard-0" / "checksums.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **sums} if isinstance(sums, dict) else sums))
    before = _files(root)
    with pytest.raises(CheckpointError, match="checksums.json is corrupted: not one checksum per MiB"):
        gf.LocalTable.open(root, verify="full")
    assert _files(root) == before


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m["state"].__setitem__("rr", "x"), r"state 'rr' is 'x', not a count"),
        (lambda m: m["state"].__setitem__("stamp", -4), r"state 'stamp' is -4, not a count"),
        (lambda m: m["table"].__setitem__("sampler", {"kind": "fifo", "params": {}}),
         r"shard-0 is not shard 0 of the table at .* \(laid out for another sampler\)"),
        (lambda m: m["table"].__setitem__("max_times_sampled", 3), r"laid out for another max times sampled"),
        (lambda m: m["files"].pop("1"), r"the manifest lists shards \[0\] of a table of 2"),
    ],
)  # fmt: skip
def test_a_manifest_its_shards_disagree_with_is_refused_in_one_line_and_nothing_written(edit, match, tmp_path):
    """The manifest's counters, its shard list and the selectors its shards' files were laid out for are
    checked before any shard is mapped (a sampler other than the trees' opened silently with it)."""
    root = _filled(tmp_path)
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(m))
    before = _files(root)
    with pytest.raises(CheckpointError, match=match) as e:
        gf.LocalTable.open(root)
    assert "\n" not in str(e.value)
    assert _files(root) == before


def test_a_layout_of_another_version_or_tampered_is_refused(tmp_path):
    root = _filled(tmp_path)
    path = root / "shard-0" / "layout.json"
    d = json.loads(path.read_text())
    d["version"] = 99
    path.write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="SHA-256 mismatch"):
        gf.LocalTable.open(root)
    d.pop("sha256")
    d["sha256"] = disk_state.hashlib.sha256(disk_state._canonical(d)).hexdigest()
    path.write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match="version 99; this gear_flow reads 'gear-flow-disk' version 1"):
        gf.LocalTable.open(root)


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from helpers import episode, make_spec
    import gear_flow as gf

    where, path, unit = sys.argv[1], sys.argv[2], sys.argv[3]
    t = gf.LocalTable(make_spec(capacity=64, num_shards=1, item_unit=unit), tier="disk", path=path,
                      sampler=gf.Prioritized(0.7, 0.4), seed=0)
    shard = t.shards[0]
    for k in range(40):  # 5 to 8 steps each, past the ring's 64: evictions on every insert
        r = t.insert(episode(k + 1, 5 + k % 4), priorities=np.full(5 + k % 4 if unit == "step" else 1, k + 1.0))
        print(int(r.episode_ids[0]), flush=True)
        if k == 20:
            t.update_priorities(r.first_keys, [100.0])
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if where == "after_first_column":  # the ring's first column written, the others not
        write = shard.ring.write_chunks
        shard.ring.write_chunks = lambda pos, name, parts: (write(pos, name, parts), die())
    elif where == "before_records":  # every column written, the episode records not
        shard.index.append = die
    elif where == "after_records":  # records appended, the items not added
        shard._add_items = die
    t.insert([episode(900, 7), episode(901, 9)])  # 16 steps: overwrites the oldest episodes' steps
    print("not killed", flush=True)
    """
)


@pytest.mark.parametrize("unit", ["step", "episode"])
@pytest.mark.parametrize("where", ["after_first_column", "before_records", "after_records"])
def test_a_process_killed_mid_insert_reopens_with_every_completed_insert_and_without_the_torn_one(
    where, unit, tmp_path
):
    tests = str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", KILLER.format(tests=tests), where, str(tmp_path / "t"), unit],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    completed = [int(x) for x in proc.stdout.split()]
    assert completed == list(range(40))
    # what the table must hold: the same completed inserts into a host table, then the episodes whose
    # steps the torn insert (16 steps) was overwriting dropped
    want = gf.LocalTable(make_spec(capacity=64, num_shards=1, item_unit=unit), sampler=gf.Prioritized(0.7, 0.4))
    for k in range(40):
        r = want.insert(episode(k + 1, 5 + k % 4), priorities=np.full(5 + k % 4 if unit == "step" else 1, k + 1.0))
        if k == 20:
            want.update_priorities(r.first_keys, [100.0])
    ws = want.shards[0]
    with ws.lock:
        ws._evict_steps_before(ws.ring.write_pos + 16 - ws.capacity)
    layout, header = disk_state.check(tmp_path / "t" / "shard-0")  # the header's checksum holds
    assert header["writing_until"] == header["write_pos"] + 16
    t = gf.LocalTable.open(tmp_path / "t", verify="full")
    rec = t.info()["storage"]["recovered"]["0"]
    assert rec["torn_steps"] == 16 and rec["torn_episodes"] == 2 and rec["evicted"] > 0
    got, exp = live_content(t), live_content(want)
    assert got[0][:4] == exp[0][:4]  # episodes, their steps, items' state and priorities, in order
    assert got[0][4] == exp[0][4]  # the trees, rebuilt from their leaves
    c = got[0][5]
    assert c["inserted"] == c["evicted"] + t.size + c["removed"] + c["deleted"] + c["expired"]
    # the table goes on: the torn slots are reused, ids are not
    r = t.insert(episode(902, 4))
    assert int(r.episode_ids[0]) == 42  # the torn insert's two ids are never handed out
    live_tags = {tag for steps in got[0][1]["ep"] for tag in steps} | {902}
    b = t.sample(batch_size=64, length=1)
    assert set(np.asarray(b["ep"]).ravel().tolist()) <= live_tags
    assert not {900, 901} & live_tags


ACROSS_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from helpers import episode, make_spec
    import gear_flow as gf

    where, path = sys.argv[1], sys.argv[2]
    t = gf.LocalTable(make_spec(capacity=64, num_shards=2), tier="disk", path=path, seed=0)
    for k in range(6):  # inserts across both shards that complete
        r = t.insert([episode(2 * k + 1, 3), episode(2 * k + 2, 4)])
        print(t.size, flush=True)
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    second, insert = t.shards[1], t.shards[1].insert
    if where == "second_shard":  # shard 0 has committed its part, shard 1 has not begun
        second.insert = die
    else:  # both have committed their parts, the call has not returned
        second.insert = lambda batch: (insert(batch), die())
    t.insert([episode(900, 5), episode(901, 6)])
    print("not killed", flush=True)
    """
)


@pytest.mark.parametrize("where", ["second_shard", "after_both"])
def test_an_insert_across_shards_cut_short_by_a_kill_is_dropped_whole(where, tmp_path):
    """Each shard commits its own part of an insert: a process killed after shard 0 had committed its part of
    an insert across two shards reopened with that part, the insert half applied, where a reopen drops an
    insert cut short.  The table now keeps a record of such an insert until every shard has its part, and a
    reopen that finds it takes back the parts committed: the insert is dropped whole, counted nowhere."""
    tests = str(Path(__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-c", ACROSS_KILLER.format(tests=tests), where, str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [int(x) for x in proc.stdout.split()] == [7 * (k + 1) for k in range(6)]
    t = gf.LocalTable.open(tmp_path / "t")
    assert t.size == 42 and [s.size for s in t.shards] == [18, 24]
    assert t.info()["storage"]["rolled_back"] == (11 if where == "after_both" else 5)
    assert not list((tmp_path / "t").glob("*.intent"))
    b = t.sample(batch_size=256, length=1)
    assert not {900, 901} & set(np.asarray(b["ep"]).ravel().tolist())
    c, lim = t.info()["totals"], t.info()["rate_limiter"]
    assert c["inserted"] == t.size + c["evicted"] + c["removed"] + c["deleted"] + c["expired"] == 42
    assert lim["inserts"] == 42  # the insert taken back is counted nowhere
    assert int(t.insert(episode(3, 2)).episode_ids[0]) == 14  # its ids are never handed out
    t.close()
    t = gf.LocalTable.open(tmp_path / "t")  # and stays taken back
    assert t.size == 44 and t.info()["storage"]["rolled_back"] == 0


def test_inserts_across_shards_from_two_threads_at_once_each_keep_their_own_record(tmp_path):
    """Every insert across shards of a disk table wrote the one record file, and the first to end removed it:
    the other's removal raised FileNotFoundError (its insert stored, its caller told it failed), and a kill
    meanwhile found the other insert's record, not its own.  Each insert keeps a record of its own."""
    t = gf.LocalTable(make_spec(capacity=64, num_shards=4), tier="disk", path=tmp_path / "t", seed=0)
    first, insert, go, errors = t.shards[0], t.shards[0].insert, threading.Event(), []

    def held(batch):  # the first insert's part on shard 0 waits until the second insert has ended
        assert go.wait(30)
        return insert(batch)

    first.insert = held

    def one():
        try:
            t.insert([episode(1, 3), episode(2, 3)])  # shards 0 and 1 (round robin)
        except BaseException as e:  # noqa: BLE001 - what the test reports
            errors.append(e)

    th = threading.Thread(target=one)
    th.start()
    wait_for(lambda: len(list((tmp_path / "t").glob("*.intent"))) == 1, "the first insert's record")
    t.insert([episode(3, 3), episode(4, 3)])  # shards 2 and 3, while the first is under way
    go.set()
    th.join(30)
    first.insert = insert
    assert errors == [] and t.size == 12 and [s.size for s in t.shards] == [3, 3, 3, 3]
    assert not list((tmp_path / "t").glob("*.intent"))
    t.close()
    t = gf.LocalTable.open(tmp_path / "t")
    assert t.size == 12 and t.info()["storage"]["rolled_back"] == 0
    t.close()


MAX_SIZE_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import gear_flow as gf

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=100, max_size=20)
    t = gf.LocalTable(spec, tier="disk", path=sys.argv[1], seed=0)
    for k in range(4):
        t.insert({{"x": np.full(5, k, np.float32)}})
    t._enforce_max_size = lambda: os.kill(os.getpid(), signal.SIGKILL)  # after the shard commits, before eviction
    t.insert({{"x": np.full(8, 9, np.float32)}})
    """
)


def test_a_process_killed_before_its_insert_evicted_to_max_size_reopens_within_max_size(tmp_path):
    """An insert whose shard had committed before a kill that came before the table evicted down to max_size
    reopened with 28 items of a max_size of 20.  A reopen now evicts down to it, as the insert would have."""
    proc = subprocess.run(
        [sys.executable, "-c", MAX_SIZE_KILLER.format(), str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    t = gf.LocalTable.open(tmp_path / "t")
    assert t.size == 20
    got = sorted(t.sample(20, 1, boundary="pad_tail")["x"].numpy()[:, 0].tolist())
    assert set(got) <= {1.0, 2.0, 3.0, 9.0} and got.count(9.0) > 0  # the oldest went, as Fifo evicts them
    c = t.info()["totals"]
    assert c["inserted"] == t.size + c["evicted"] + c["removed"] + c["deleted"] + c["expired"] == 28


@pytest.mark.parametrize("source", ["checkpoint", "disk table"])
def test_a_table_restored_onto_disk_and_killed_before_a_flush_reopens_with_its_counts_once(tmp_path, source):
    """A restore onto the disk tier wrote the new table's manifest (the checkpoint's limiter counts beside
    shards that held nothing yet) before filling the shards: killed before its first flush, it reopened with
    the limiter counting every restored insert and sample twice (32 inserts of 16).  The manifest is written
    again once the shards are filled, from a checkpoint and from another disk table alike; the new table's
    directory given as ``disk_path`` or by config."""
    kw = {"tier": "disk", "path": tmp_path / "src"} if source == "disk table" else {}
    t = gf.LocalTable(make_spec(capacity=64, num_shards=2), seed=0, **kw)
    t.insert([episode(1, 10), episode(2, 6)])
    t.sample(batch_size=3)
    if source == "checkpoint":
        t.checkpoint(tmp_path / "src")
    t.close()
    for how in ("argument", "config"):
        dest = tmp_path / how
        call = (
            f"gf.LocalTable.restore({str(tmp_path / 'src')!r}, tier='disk', disk_path={str(dest)!r})"
            if how == "argument"
            else f"""dask.config.set({{"gear-flow.disk.path": {str(dest)!r}}})
            gf.LocalTable.restore({str(tmp_path / "src")!r}, tier="disk")"""
        )
        child = textwrap.dedent(
            f"""
            import os, signal, dask.config, gear_flow as gf
            {call}
            os.kill(os.getpid(), signal.SIGKILL)  # before any flush or close
            """
        )
        proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        r = gf.LocalTable.open(dest)
        c, lim = r.info()["totals"], r.info()["rate_limiter"]
        assert (r.size, c["inserted"], lim["inserts"], c["sampled"], lim["samples"]) == (16, 16, 16, 3, 3)
        r.close()
    with pytest.raises(SpecError, match="disk_path is the directory of a disk table"):
        gf.LocalTable.restore(tmp_path / "src", tier="host", disk_path=tmp_path / "x")
    assert not (tmp_path / "x").exists()


TORN_OVER_FLUSHED = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import gear_flow as gf

    spec = gf.TableSpec((gf.ColumnSpec("obs", (1024,), np.float32),), capacity=1024)  # 4 MiB: 4 checksum chunks
    t = gf.LocalTable(spec, tier="disk", path=sys.argv[1], seed=0)
    for k in range(11):
        t.insert({"obs": np.full((100, 1024), k, np.float32)})  # 1,100 steps: the ring wrapped
    t.flush()  # every chunk checksummed
    t.shards[0].index.append = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # the ring written
    t.insert({"obs": np.full((300, 1024), 99, np.float32)})  # slots 76..375: chunks the flush checksummed
    """
)

WOR_DRAW_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import gear_flow as gf
    from gear_flow.shard import Shard

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=100)
    t = gf.LocalTable(spec, tier="disk", path=sys.argv[1], seed=0, sampler=gf.WithoutReplacement())
    t.insert({"x": np.arange(20, dtype=np.float32)})
    t.flush()  # a clean header, every array checksummed
    Shard._record = lambda self, slots: os.kill(os.getpid(), signal.SIGKILL)  # drawn (consumed), not counted
    t.sample(batch_size=4)
    """
)


@pytest.mark.parametrize("case", ["torn insert", "without-replacement draw"])
def test_a_table_killed_mid_change_after_a_flush_passes_a_full_verify(tmp_path, case):
    """Two changes a full verify took for corruption.  An insert cut short over ring chunks the last flush
    checksummed: the reopen took it back, but its commit forgot those chunks had changed, and once the table
    was closed cleanly ``open(verify="full")`` refused the ring (CRC32 mismatch).  A WithoutReplacement draw
    took its items out of the sampler's tree (its mapped file) before the header was marked changed: killed
    before the sample's counts were committed, the header said clean over a changed tree, refused too.  The
    reopen now checksums the chunks the cut insert wrote, and a draw's consumption is a change as any other."""
    root = tmp_path / "t"
    child = TORN_OVER_FLUSHED if case == "torn insert" else WOR_DRAW_KILLER
    proc = subprocess.run([sys.executable, "-c", child, str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    t = gf.LocalTable.open(root, verify="full")
    size = t.size
    assert size == (700 if case == "torn insert" else 20)
    t.close()
    t = gf.LocalTable.open(root, verify="full")  # closed cleanly: every checksum applies, and matches
    assert t.size == size
    if case == "torn insert":
        got = t.sample(700, 1, boundary="pad_tail")["obs"].numpy()[:, 0, 0]
        assert 99.0 not in set(got.tolist())
    t.close()


QUEUE_DELETE_KILLER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import gear_flow as gf

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64)
    make = gf.LocalTable.queue if sys.argv[2] == "queue" else gf.LocalTable.stack
    t = make(spec, 3, tier="disk", path=sys.argv[1])
    r = t.insert([{"x": np.array([float(i)], np.float32)} for i in range(3)])
    t.delete([int(r.first_keys[1])])  # unsampled: it waits no more
    assert t.info()["rate_limiter"]["inserts"] == 2 and t.size == 2
    os._exit(0)  # the process ends without close, as after a kill
    """
)


@pytest.mark.parametrize("kind", ["queue", "stack"])
def test_a_disk_queue_killed_after_a_delete_reopens_with_the_deleted_item_no_longer_waiting(tmp_path, kind):
    """A queue's limiter forgets an item deleted unsampled (it no longer waits).  Reopened after its process
    ended without a close, the limiter took back the deletes the shards had committed since the manifest but
    not the forgetting: it counted 3 items waiting of 2 held, refused an insert of 1 (RateLimitTimeout) and
    stayed one short for good.  The manifest now keeps the count of items removed unsampled too, and the
    reopen forgets those removed since, as the calls would have (a clean close always did)."""
    root = tmp_path / "q"
    proc = subprocess.run(
        [sys.executable, "-c", QUEUE_DELETE_KILLER, str(root), kind], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    t = gf.LocalTable.open(root)
    lim = t.info()["rate_limiter"]
    assert (t.size, lim["inserts"], lim["samples"], lim["deletes"]) == (2, 2, 0, 1)
    t.insert({"x": np.array([9.0], np.float32)}, timeout=5.0)  # the room the deleted item left
    got = t.sample(3, 1, timeout=5.0)["x"].numpy()[:, 0].tolist()
    assert got == ([0.0, 2.0, 9.0] if kind == "queue" else [9.0, 2.0, 0.0])
    t.close()


FLUSH_RACE_KILLER = textwrap.dedent(
    """
    import os, signal, sys, threading
    import numpy as np
    import gear_flow as gf

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64)
    make = gf.LocalTable.queue if sys.argv[2] == "queue" else gf.LocalTable
    t = make(spec, 8, tier="disk", path=sys.argv[1]) if sys.argv[2] == "queue" else make(spec, tier="disk", path=sys.argv[1])
    t.insert({"x": np.zeros(3, np.float32)})
    inside, go = threading.Event(), threading.Event()
    store = t.shards[0].insert

    def held_insert(batch):  # admitted (the limiter counts it), its shard not yet written
        inside.set()
        go.wait()
        return store(batch)

    t.shards[0].insert = held_insert
    write = t._write_manifest

    def racing_write(*a, **k):  # the manifest written while another thread's insert is under way
        th = threading.Thread(target=lambda: t.insert({"x": np.ones(2, np.float32)}))
        th.start()
        inside.wait()
        write(*a, **k)
        go.set()
        th.join()

    t._write_manifest = racing_write
    t.flush()
    t.delete(t.insert({"x": np.ones(1, np.float32)}).first_keys)  # and a delete after it
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("kind", ["uniform", "queue"])
def test_a_disk_table_whose_flush_raced_an_insert_reopens_counting_it_once(tmp_path, kind):
    """A flush wrote the manifest, the limiter's counts beside the shards', while another thread's insert was
    admitted (the limiter counting it) and not yet stored (the shards not): a process killed after the insert
    finished reopened with the limiter counting it twice (8 inserts of 6 stored), a queue with a phantom
    waiting item.  The manifest keeps the two as they were at a moment no call was under way (the table's
    creation, a restore, an open), and a reopen counts what the shards did since."""
    root = tmp_path / "t"
    proc = subprocess.run(
        [sys.executable, "-c", FLUSH_RACE_KILLER, str(root), kind], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    t = gf.LocalTable.open(root)
    lim, c = t.info()["rate_limiter"], t.info()["totals"]
    waiting = 5 if kind == "queue" else 6  # a queue's deleted item waits no more (forget)
    assert (t.size, c["inserted"], c["deleted"]) == (5, 6, 1)
    assert (lim["inserts"], lim["samples"], lim["deletes"]) == (waiting, 0, 1)
    t.close()


CREATION_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import gear_flow as gf

    gf.LocalTable._write_manifest = lambda self: os.kill(os.getpid(), signal.SIGKILL)  # shards made, no manifest
    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=2)
    gf.LocalTable(spec, tier="disk", path=sys.argv[1])
    """
)


def test_a_disk_table_whose_creation_was_cut_short_is_named_by_open_and_created_again(tmp_path):
    """A process killed while creating a disk table (its shard files made, its manifest not yet written)
    left a directory that open() refused (no manifest) and a new table refused too (a shard there): the user
    had to find and remove the files.  open() now says what happened, and a new table removes what the cut
    creation left (its shard directories, and only those) and is made."""
    root = tmp_path / "t"
    proc = subprocess.run(
        [sys.executable, "-c", CREATION_KILLER, str(root)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (root / "shard-1" / "layout.json").exists() and not (root / "manifest.json").exists()
    (root / "notes.txt").write_text("the user's")
    with pytest.raises(CheckpointError, match="creation of a disk table there was cut short"):
        gf.LocalTable.open(root)
    t = gf.LocalTable(make_spec(capacity=32, num_shards=1), tier="disk", path=root, seed=0)
    assert not (root / "shard-1").exists() and (root / "notes.txt").read_text() == "the user's"
    t.insert([episode(1, 5)])
    t.close()
    t = gf.LocalTable.open(root)
    assert t.size == 5 and [s.shard_id for s in t.shards] == [0]
    t.close()
    # shard files that no creation of a table left (another's, e.g. a distributed table's) are never removed
    other = tmp_path / "o"
    gf.LocalTable(make_spec(capacity=32), tier="disk", path=other).close()
    os.unlink(other / "manifest.json")
    with pytest.raises(SpecError, match="already holds a disk shard"):
        gf.LocalTable(make_spec(capacity=32), tier="disk", path=other)
    assert (other / "shard-0" / "layout.json").exists()


DELETE_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import gear_flow as gf

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64)
    t = gf.LocalTable(spec, tier="disk", path=sys.argv[1], sampler=gf.Prioritized(1.0), seed=0)
    r = t.insert([{{"x": np.full(5, k, np.float32)}} for k in range(6)])
    t.flush()
    # the items deactivated, their weights not yet taken from the tree, nothing committed
    t.shards[0].sampler.remove = lambda slots: os.kill(os.getpid(), signal.SIGKILL)
    t.delete(r.first_keys[0] + np.arange(5))
    """
)


def test_a_process_killed_inside_a_delete_reopens_without_the_items_and_with_them_counted(tmp_path):
    """A delete deactivates its items, then takes their weights from the sampler's tree, then commits: killed
    in between, the table reopened with the items gone from its size but not counted deleted (30 inserted
    against 25 held and none removed, the limiter still counting 30), and with their weight still in the tree,
    drawable.  A reopen now empties the leaves of items that are not there and counts what a removal cut
    short took as deleted."""
    proc = subprocess.run(
        [sys.executable, "-c", DELETE_KILLER.format(), str(tmp_path / "t")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    t = gf.LocalTable.open(tmp_path / "t")
    c, lim = t.info()["totals"], t.info()["rate_limiter"]
    assert t.size == 25 and c["inserted"] == t.size + c["evicted"] + c["removed"] + c["deleted"] + c["expired"]
    assert lim["inserts"] - lim["deletes"] == 25
    assert 0.0 not in t.sample(2000, 1)["x"].numpy()[:, 0].tolist()  # the deleted episode is never drawn


SAMPLE_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import gear_flow as gf

    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=100, num_shards=2)
    t = gf.LocalTable(spec, tier="disk", path=sys.argv[1], max_times_sampled=2, seed=0)
    t.insert([{{"x": np.arange(10, dtype=np.float32)}}, {{"x": np.arange(7, dtype=np.float32)}}])
    t.flush()
    r = t.insert({{"x": np.arange(6, dtype=np.float32)}})  # after the manifest was written
    for _ in range(3):  # each item handed out twice expires
        t.sample(batch_size=5, length=1)
    t.delete(r.first_keys)
    c, lim = t.info()["totals"], t.info()["rate_limiter"]
    print(t.size, c["sampled"], c["expired"], lim["inserts"], lim["samples"], lim["deletes"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_process_killed_after_samples_reopens_with_their_counts_and_expiries(tmp_path):
    """A sample's counts and the items it expired are committed with the shard's header, and the limiter's
    counts come back with what the shards committed after the manifest was last written: the files a
    killed process leaves hold the size, counts and limiter counts it reported."""
    proc = subprocess.run([sys.executable, "-c", SAMPLE_KILLER.format(), str(tmp_path / "t")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    size, sampled, expired, *limiter = map(int, proc.stdout.split())
    assert sampled == 15 and expired > 0 and limiter[0] == 23
    t = gf.LocalTable.open(tmp_path / "t", verify="full")
    c, lim = t.info()["totals"], t.info()["rate_limiter"]
    assert (t.size, c["sampled"], c["expired"]) == (size, sampled, expired)
    assert [lim["inserts"], lim["samples"], lim["deletes"]] == limiter
    assert c["inserted"] == c["evicted"] + t.size + c["removed"] + c["deleted"] + c["expired"]


def test_ingest_parity_reopen_and_drop_cache_keep_batches(tmp_path):
    """Batches drawn after the pages were dropped from the cache are the ones drawn from cached pages."""
    spec = make_spec(capacity=500, num_shards=2)
    t = gf.LocalTable(spec, tier="disk", path=tmp_path / "t", seed=5)
    for k in range(60):
        t.insert(episode(k + 1, 7))
    t.flush()
    state = t.rng.bit_generator.state
    a = t.sample(batch_size=32, length=4)
    for s in t.shards:
        s.tier.drop_cache()
    t.rng.bit_generator.state = state
    b = t.sample(batch_size=32, length=4)
    assert a.keys.tolist() == b.keys.tolist()
    assert np.asarray(a["obs"]).tolist() == np.asarray(b["obs"]).tolist()
    os.sync()


def test_a_plain_sample_advises_its_windows_while_the_rings_are_cold_and_not_once_they_are_cached(tmp_path):
    spec = gf.TableSpec((gf.ColumnSpec("obs", (1024,), np.float32),), capacity=4000)
    t = gf.LocalTable(spec, tier="disk", path=tmp_path / "t", seed=0)
    for k in range(10):
        t.insert({"obs": np.full((300, 1024), k, np.float32)})
    t.flush()
    tier = t.shards[0].tier
    tier.drop_cache()
    cold = t.sample(batch_size=64, length=4)
    assert tier.advised > 0  # the windows were announced before the gather touched them
    assert tier.rings_cold()
    np.asarray(tier.arrays["ring-0"]).sum()  # every page read: the ring is cached now
    tier._measured_at = -np.inf  # (measured again at the next gather, not half a second later)
    before = tier.advised
    warm = t.sample(batch_size=64, length=4)
    assert tier.advised == before and not tier.rings_cold()
    with tier.readahead(True):  # asked for: advised even when cached (unless probed resident)
        t.sample(batch_size=64, length=4)
    off = tier.advised
    with tier.readahead(False):  # refused: a page fault at a time, even cold
        tier.drop_cache()
        t.sample(batch_size=64, length=4)
    assert tier.advised == off
    assert np.asarray(cold["obs"]).shape == np.asarray(warm["obs"]).shape == (64, 4, 1024)
