"""Stream as a context manager, its background priority write-back, and DataLoader workers."""

from __future__ import annotations

import subprocess
import sys
import threading

import dask
import numpy as np
import pytest
import torch.utils.data
from helpers import episode, make_spec

import gear_flow as gf
from gear_flow.keys import decode


def _stream_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gear-flow-stream")]


def test_leaving_the_with_block_stops_the_requests():
    table = gf.LocalTable(make_spec(capacity=256), seed=0)
    table.insert([episode(i + 1, 20) for i in range(5)])
    with gf.Stream(table, 8, 2, prefetch=4) as stream:  # endless
        for i, b in enumerate(stream):
            assert len(b) == 8
            if i == 2:
                break
        sampled = table.info()["totals"]["sampled"]
    assert _stream_threads() == []
    assert table.info()["totals"]["sampled"] == sampled  # nothing was requested after the exit
    assert sampled <= 8 * (3 + 4)  # the batches taken and at most `prefetch` requests in flight


class GatedTable(gf.LocalTable):
    """A real table whose priority updates wait for the test to let them through (a slow network)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = threading.Event()
        self.order = []

    def update_priorities(self, keys, priorities):
        self.gate.wait(30)
        self.order.append(float(priorities[0]))
        return super().update_priorities(keys, priorities)


def test_update_priorities_never_blocks_and_applies_in_order():
    table = GatedTable(make_spec(capacity=256), sampler=gf.Prioritized(alpha=1.0), seed=0)
    table.insert([episode(1, 30)])
    key = None
    with gf.Stream(table, 4, 1, num_batches=20) as stream:
        for i, b in enumerate(stream):
            key = b.keys[:1].clone() if key is None else key
            stream.update_priorities(torch.cat([key, b.keys[1:]]), torch.full((4,), float(i + 1)))
        # 20 updates queued while none could be applied: the learner never waited
        assert stream.priority_writes["pending"] == 20 and table.order == []
        table.gate.set()
    assert table.order == [float(i + 1) for i in range(20)]
    assert stream.priority_writes == {"applied": 80, "stale": 0, "pending": 0, "deferred": 0}  # a local table: none
    shard, seq = decode(key.numpy())
    s = table.shards[int(shard[0])]
    assert s.priority[int(seq[0]) % s.capacity] == 20.0  # the last update won


def test_priority_write_back_refuses_keys_that_are_not_integers(make_table):
    """A PriorityWriter, and a stream's update (a distributed table's stored to ride on its next sample), cast
    float keys to int64: a float64 key of shard 1 had lost its low bits and set another item's priority, and
    2.9 set item 2's, where the table's own update refuses them.  They now refuse them as the table does, at
    the call, nothing queued or applied."""
    t = make_table(make_spec(capacity=64, num_shards=2), sampler=gf.Prioritized(1.0, 0.4), seed=0)
    res = t.insert([episode(1, 10), episode(2, 10)], priorities=1.0)
    key = int(res.first_keys[1]) + 5  # item 5 of shard 1: 2**56 + 5 is not a float64
    with gf.PriorityWriter(t, backlog=0) as pw:
        for bad in (torch.tensor([key], dtype=torch.float64), np.array([2.9]), [float(key)]):
            with pytest.raises(gf.InvalidDataError, match="keys must be integers"):
                pw.update(bad, [7.0])
        assert pw.pending == 0
    assert (pw.applied, pw.stale) == (0, 0)
    with gf.Stream(t, 4, 1, num_batches=2) as stream:
        for b in stream:
            with pytest.raises(gf.InvalidDataError, match="keys must be integers"):
                stream.update_priorities(b.keys.double(), torch.full((4,), 7.0))
            stream.update_priorities(b.keys, torch.full((4,), 1.0))  # the same keys as integers go through
    assert stream.priority_writes["pending"] == 0
    got = t.sample(400, 1)  # every item kept its priority 1: each drawn with probability 1/20
    assert got.probabilities.numpy() == pytest.approx(np.full(400, 1 / 20), rel=1e-12)


def test_a_closed_stream_takes_no_update_and_its_wait_times_hold_at_a_full_history():
    """A closed stream's update_priorities started a new background writer that nothing closed (a failed update
    reached no one); and after exactly WAIT_HISTORY batches wait_times() was empty and stats() raised
    IndexError (the history's ring had just come round).  A closed stream now refuses the update, and a full
    history is the whole ring."""
    from gear_flow.stream import WAIT_HISTORY, _Waits

    table = gf.LocalTable(make_spec(capacity=64), sampler=gf.Prioritized(1.0), seed=0)
    table.insert([episode(1, 10)])
    with gf.Stream(table, 4, 1, num_batches=2) as stream:
        keys = [b.keys.clone() for b in stream]
    with pytest.raises(gf.GearFlowError, match="this Stream is closed"):
        stream.update_priorities(keys[0], torch.full((4,), 2.0))
    assert stream.priority_writes["pending"] == 0
    waits = _Waits()
    for n in range(1, WAIT_HISTORY + 2):
        waits.record(n * 1e-6)
        if n >= WAIT_HISTORY - 1:
            got = waits.recent()
            assert len(got) == min(n, WAIT_HISTORY) and got[-1] == n * 1e-6  # the newest last
    stream._waits = waits
    assert stream.stats()["wait_p50_s"] > 0


def _loader_keys(dataset, workers: int, context: str | None = None) -> list[list[int]]:
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers, multiprocessing_context=context)
    out = []
    for b in loader:
        assert isinstance(b, gf.SampleBatch) and b["obs"].shape == (16, 4, 3)
        assert bool(b.mask.all())
        out.append(b.keys.tolist())
    return out


def test_dataloader_workers_attach_their_own_handles(dist_client):
    t = gf.DistributedTable.create(dist_client, make_spec(capacity=256, num_shards=2), seed=0)
    try:
        t.insert([episode(i + 1, 30) for i in range(8)])
        ds = gf.Stream(t, 16, 4, num_batches=5, seed=7, boundary="strict").dataset()
        first = _loader_keys(ds, 2)
        assert len(first) == 5  # the workers' shares add up to num_batches
        assert first[0] != first[1]  # worker 0 and worker 1 draw with their own seeds
        assert _loader_keys(ds, 2) == first  # seeded: the same batches again
        assert _loader_keys(ds, 2, "spawn") == first  # spawned workers: the dataset travels pickled, by name
        # Stream.loader's workers start as Dask's own processes do, not forked from this threaded process
        stream = gf.Stream(t, 16, 4, num_batches=5, seed=7, boundary="strict")
        loader = stream.loader(num_workers=2)
        method = dask.config.get("distributed.worker.multiprocessing-method")  # (the suite's: forkserver)
        assert method != "fork" and loader.multiprocessing_context.get_start_method() == method
        assert [b.keys.tolist() for b in loader] == first
        chosen = stream.loader(num_workers=2, multiprocessing_context="fork")  # the caller's choice stands
        assert chosen.multiprocessing_context.get_start_method() == "fork"
        assert stream.loader().multiprocessing_context is None  # no workers: nothing started
        assert t.info()["totals"]["sampled"] == 4 * 5 * 16
    finally:
        t.close()


def test_dataloader_workers_refuse_a_local_table():
    table = gf.LocalTable(make_spec(capacity=64))
    table.insert([episode(1, 10)])
    stream = gf.Stream(table, 4, 2, num_batches=2)
    # Stream.loader refuses at the call, in one line, before any worker starts or any batch is drawn
    with pytest.raises(gf.SpecError, match=r"^num_workers=2: a LocalTable cannot be read by DataLoader workers") as e:
        stream.loader(num_workers=2)
    assert "\n" not in str(e.value) and "use num_workers=0" in str(e.value) and "or a DistributedTable" in str(e.value)
    assert table.info()["totals"]["sampled"] == 0
    assert len(list(stream.loader())) == 2
    # a DataLoader made by hand finds out in its worker
    ds = gf.Stream(table, 4, 2, num_batches=2).dataset()
    with pytest.raises(gf.GearFlowError, match="LocalTable cannot be read by DataLoader workers"):
        _loader_keys(ds, 1)
    assert len(list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0))) == 2
    assert np.isfinite(table.info()["totals"]["sampled"])


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"batch_size": -1}, "batch_size"), ({"batch_size": None}, "batch_size"), ({"length": 0}, "length"),
        ({"boundary": "sideways"}, "boundary"), ({"num_batches": -1}, "num_batches"),
        ({"num_batches": 1.5}, "num_batches"), ({"num_batches": "3"}, "num_batches"), ({"seed": -1}, "seed"),
        ({"timeout": "x"}, "timeout"), ({"timeout": float("nan")}, "timeout"), ({"columns": 5}, "columns"),
        ({"columns": ["nope"]}, "nope"),
    ],
)  # fmt: skip
def test_a_streams_bad_arguments_are_refused_when_it_is_made(kw, match):
    """Each is a SpecError from the constructor, as the table's own sample gives it, not a TypeError or
    ValueError at the first batch (a timeout of another type: a place left in the table's line)."""
    t = gf.LocalTable(make_spec(capacity=64), seed=0)
    t.insert(episode(1, 8))
    with pytest.raises(gf.SpecError, match=match):
        gf.Stream(t, **{"batch_size": 2, **kw})
    assert t.info()["waiting"] == {"inserts": 0, "samples": 0}


def test_leaving_a_stream_whose_request_waits_in_a_drained_queue_returns(make_table):
    """A learner that stops while a prefetched request waits for a queue's next item (no timeout): leaving
    the stream gives that request up, with nothing taken, where it waited for good (and so did the exit).
    On a DistributedTable the request waits at the coordinator in turns, and gives up between two."""
    t = make_table.queue(make_spec(capacity=64), 8)
    t.insert([episode(i, 1) for i in range(2)])
    got, done = [], threading.Event()

    def learner():
        with gf.Stream(t, batch_size=1, prefetch=2) as s:  # endless; the table's timeout: None
            for b in s:
                got.append(int(b["ep"].numpy()[0, 0]))
                if len(got) == 2:
                    while t.info()["waiting"]["samples"] == 0:  # the next request is in the table, waiting
                        threading.Event().wait(0.01)
                    break
        done.set()

    th = threading.Thread(target=learner, daemon=True)
    th.start()
    assert done.wait(60), "the stream did not close"
    assert got == [0, 1] and t.info()["waiting"]["samples"] == 0
    t.insert([episode(2, 1)])  # the item the given-up request would have taken is still there
    assert t.sample(1, timeout=5)["ep"].numpy()[0, 0] == 2
    assert t.info()["totals"]["sampled"] == 3


_EXIT_WITH_A_STREAM_WAITING = """
import sys
import dask
import numpy as np
import gear_flow as gf

if __name__ == "__main__":
    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.int64),), capacity=64)
    if sys.argv[1] == "local":
        t = gf.LocalTable.queue(spec, 16)
    else:  # a cluster and client left open too, as a plain script leaves them
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=None)
        t = gf.DistributedTable.queue(Client(cluster), spec, 16)
    t.insert([{"x": np.array([7])}])
    it = iter(gf.Stream(t, batch_size=1, prefetch=2))  # (the table's timeout: None)
    print(next(it)["x"].ravel().tolist(), flush=True)  # the next request now waits for an item
"""


@pytest.mark.parametrize("kind", ["local", "distributed"])
def test_a_script_that_ends_with_an_unfinished_stream_exits(kind, tmp_path):
    """A script that ended with an unfinished stream still referenced, its next request waiting for a queue's
    item, never exited: Python joins the request threads before it collects the stream (which gives them up);
    on a DistributedTable the stream's last report of its samples then waited for the client's event loop,
    gone by then.  At exit the requests give up and the report is left."""
    script = tmp_path / "ends.py"
    script.write_text(_EXIT_WITH_A_STREAM_WAITING)
    r = subprocess.run([sys.executable, str(script), kind], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["[7]"], (r.returncode, r.stdout, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_stream_closed_after_its_table_returns(make_table):
    """A stream closed after its table was closed: a LocalTable's returned, a DistributedTable's raised
    SpecError ("no distributed table ...", its last report of the samples it served going to a table no longer
    there), and one left to the garbage collector printed that as an ignored exception."""
    t = make_table(make_spec(capacity=64, num_shards=2), seed=0)  # (MinSize: a distributed handle's leases)
    t.insert([episode(i, 1) for i in range(8)])
    s = gf.Stream(t, batch_size=2, prefetch=2)
    it = iter(s)
    assert len(next(it)["ep"]) == 2
    t.close()
    s.close()
    with pytest.raises(gf.GearFlowError, match="this Stream is closed"):
        iter(s)


def test_a_closed_stream_takes_nothing_more(make_table):
    """A stream iterated again after its `with` block (closed) raises, and an iterator made before the close
    and first run after it yields nothing: neither takes a queue's items (both took up to `prefetch`
    batches for no one)."""
    t = make_table.queue(make_spec(capacity=256), 64)
    t.insert([episode(i, 1) for i in range(40)])
    with gf.Stream(t, batch_size=1, prefetch=3, num_batches=2) as s:
        assert [int(b["ep"].numpy()[0, 0]) for b in s] == [0, 1]
        early = iter(s)
    size = t.info()["size"]
    with pytest.raises(gf.GearFlowError, match="this Stream is closed"):
        iter(s)
    assert list(early) == []
    assert t.info()["size"] == size and t.info()["totals"]["sampled"] == 40 - size


def test_tensordict_batches_come_through_the_streams_data_loader(make_table):
    """`stream.loader()` hands a TensorDict batch over as the stream made it (torch's default conversion
    for batch_size=None rebuilds every mapping, and failed on a TensorDict at the first batch)."""
    pytest.importorskip("tensordict")
    t = make_table(make_spec(capacity=256), seed=0)
    t.insert([episode(i, 8) for i in range(10)])
    s = gf.Stream(t, batch_size=4, length=2, as_tensordict=True, num_batches=3, seed=0)
    got = list(s.loader())
    assert len(got) == 3 and all(tuple(b.batch_size) == (4,) for b in got)
    assert all(b["ep"].shape == (4, 2) for b in got)
