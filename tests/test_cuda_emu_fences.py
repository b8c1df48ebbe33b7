"""Each fence of gear_flow's GPU code, removed, makes a test fail under the emulation (and passes with it).

Under the emulation (tests/cuda_emu/streams.py) device work runs only when the
host waits for it, so a missing ordering shows as wrong data, every time:

* ``_GpuTier._stream()`` (tiers.py): device work on a tier waits for the event
  after its previous operation, on whatever stream it is issued;
* ``PinnedTier.write_rows``: the host waits for issued gathers before it
  overwrites the pinned ring they read;
* ``_Staging`` (tiers.py): the host waits for the previous copy out of a
  page-locked staging buffer before refilling it (the gathers' parameter
  uploads, and batched host inserts into a device ring);
* ``gpu.streams.publish``: torch's stream (the host here) waits for batches
  gathered on another CuPy stream.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emu import fixtures

emulated = fixtures.emulated  # the fixture: cupy is the emulation's in these tests


def _no_stream_fence(monkeypatch):
    from gear_flow.gpu import tiers

    monkeypatch.setattr(tiers._GpuTier, "_stream", lambda self: self._cp.cuda.get_current_stream())


def _windows(B: int, L: int, first: int = 0):
    return np.arange(B, dtype=np.int64) * L + first, np.zeros(B, np.int64), np.full(B, L, np.int64)


def _write_on_one_stream_gather_on_another(cp):
    from gear_flow.storage import get_tier

    tier = get_tier("device")
    cap, nb, B, L = 32, 8, 4, 8
    ring = tier.empty((cap, nb), np.uint8)
    rows = np.arange(cap * nb, dtype=np.uint8).reshape(cap, nb)
    writer, learner = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with writer:
        tier.write_rows(ring, 0, rows)
    out = tier.empty_output((B, L, nb))
    with learner:
        tier.gather_windows(ring, *_windows(B, L), out)
    return out.get(stream=learner), rows.reshape(B, L, nb)


def test_gather_waits_for_a_write_on_another_stream(emulated):
    got, want = _write_on_one_stream_gather_on_another(emulated)
    np.testing.assert_array_equal(got, want)


def test_without_the_tier_fence_the_gather_reads_before_the_write(emulated, monkeypatch):
    _no_stream_fence(monkeypatch)
    got, want = _write_on_one_stream_gather_on_another(emulated)
    assert (got == 0xA5).all()  # the ring's allocation poison: the write had not run
    assert not np.array_equal(got, want)


def test_without_the_tier_fence_a_device_table_returns_unwritten_steps(emulated, monkeypatch):
    """At the table level: inserts are issued on CuPy's current stream, gathers on torch's (the
    host here, a non-blocking stream); only the tier's fence orders them."""
    from parity_cases import Dev, test_local_table_on_gpu_tier_matches_host_tier

    dev = Dev(emulated, max_n=200_000, cuda_tensors=False)
    test_local_table_on_gpu_tier_matches_host_tier(dev, "device", "strict", "fifo")
    _no_stream_fence(monkeypatch)
    with pytest.raises(AssertionError, match="Arrays are not equal"):
        test_local_table_on_gpu_tier_matches_host_tier(dev, "device", "strict", "fifo")


def _gather_then_overwrite(cp):
    from gear_flow.storage import get_tier

    tier = get_tier("device")
    cap, nb, B, L = 16, 4, 2, 8
    ring = tier.empty((cap, nb), np.uint8)
    tier.write_rows(ring, 0, np.full((cap, nb), 1, np.uint8))
    learner, writer = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    out = tier.empty_output((B, L, nb))
    with learner:
        tier.gather_windows(ring, *_windows(B, L), out)
    with writer:
        tier.write_rows(ring, 0, np.full((cap, nb), 2, np.uint8))
        assert (tier.read_rows(ring, 0, cap) == 2).all()  # the host waits for the writer stream
    return out.get(stream=learner)


def test_write_waits_for_a_gather_on_another_stream(emulated):
    assert (_gather_then_overwrite(emulated) == 1).all()


def test_without_the_tier_fence_the_write_overtakes_the_gather(emulated, monkeypatch):
    _no_stream_fence(monkeypatch)
    assert (_gather_then_overwrite(emulated) == 2).all()


def test_without_the_pinned_write_fence_the_insert_races_the_gather(emulated, monkeypatch):
    from parity_cases import Dev, test_pinned_tier_write_after_gather_keeps_gathered_values

    from gear_flow.gpu import tiers
    from gear_flow.ops.gather import scatter_rows

    dev = Dev(emulated, max_n=200_000, cuda_tensors=False)
    test_pinned_tier_write_after_gather_keeps_gathered_values(dev)  # with the fence
    monkeypatch.setattr(tiers.PinnedTier, "write_rows", lambda self, dst, pos, rows: scatter_rows(dst, pos, rows))
    with pytest.raises(AssertionError):
        test_pinned_tier_write_after_gather_keeps_gathered_values(dev)


@pytest.mark.parametrize("fence", [True, False])
def test_staging_buffer_is_refilled_only_after_its_upload(emulated, monkeypatch, fence):
    """Two takes with different windows, no host wait between them: the second refills the pinned
    staging buffer, which the first take's upload may not have read yet."""
    from gear_flow.gpu import tiers
    from gear_flow.storage import get_tier

    if not fence:
        monkeypatch.setattr(tiers._Staging, "sent", lambda self, event: None)
    cp = emulated
    tier = get_tier("pinned")
    cap, nb, B, L = 64, 4, 3, 4
    ring = tier.empty((cap, nb), np.uint8)
    ring[...] = np.arange(cap, dtype=np.uint8)[:, None]
    s = cp.cuda.Stream(non_blocking=True)
    outs = [tier.empty_output((B, L, nb)) for _ in range(2)]
    with s:
        for k, out in enumerate(outs):
            tier.gather_windows(ring, *_windows(B, L, first=k * 20), out)
    got = [o.get(stream=s)[:, :, 0] for o in outs]
    want = [np.arange(B * L).reshape(B, L) + k * 20 for k in range(2)]
    np.testing.assert_array_equal(got[1], want[1])
    assert np.array_equal(got[0], want[0]) == fence


@pytest.mark.parametrize("fence", [True, False])
def test_batch_published_to_torch_after_a_gather_on_another_stream(emulated, monkeypatch, fence):
    """Reused device SampleBuffers: the cached torch tensors see a gather made on a side stream only
    because ``publish()`` makes torch's stream (the host, here) wait for it."""
    from gear_flow import ColumnSpec, TableSpec
    from gear_flow.gpu import streams
    from gear_flow.sample import SampleBuffers
    from gear_flow.storage import get_tier

    if not fence:
        monkeypatch.setattr(streams, "publish", lambda: None)
    cp = emulated
    spec = TableSpec((ColumnSpec("x", (), np.int32),), capacity=64)
    tier = get_tier("device")
    ring = tier.empty((64,), np.int32)
    tier.write_rows(ring, 0, np.arange(64, dtype=np.int32))
    buf = SampleBuffers(spec, ["x"], 2, 4, tier="device")
    src = ring.reshape(64, -1).view(np.uint8)
    tier.gather_windows(src, *_windows(2, 4), buf.bytes["x"])
    first = buf.batch(64)["x"]  # DLPack export: runs the current stream
    assert first.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        tier.gather_windows(src, *_windows(2, 4, first=32), buf.bytes["x"])
        again = buf.batch(64)["x"]  # the same tensors, published after the side stream's gather
    assert (again.tolist() == [[32, 33, 34, 35], [36, 37, 38, 39]]) == fence


@pytest.mark.parametrize("fence", [True, False])
def test_insert_staging_buffer_is_refilled_only_after_its_copy(emulated, monkeypatch, fence):
    """Batched host inserts into a device ring go through one reused page-locked buffer, copied
    asynchronously: the next insert may refill it only after that copy ran (``_Staging.sent``)."""
    from gear_flow import ColumnSpec, LocalTable, TableSpec
    from gear_flow.gpu import tiers

    if not fence:
        monkeypatch.setattr(tiers._Staging, "sent", lambda self, event: None)
    spec = TableSpec((ColumnSpec("x", (), np.int64),), capacity=64)
    ref, dev = LocalTable(spec, seed=1), LocalTable(spec, tier="device", seed=1)
    for k in range(3):  # three inserts of three episodes each: host parts, one staged copy per insert
        batch = [{"x": np.arange(5) + 100 * k + 10 * e} for e in range(3)]
        ref.insert(batch)
        dev.insert(batch)
    same = np.array_equal(dev.shards[0].ring.read("x", 0, 45), ref.shards[0].ring.read("x", 0, 45))
    assert same == fence
