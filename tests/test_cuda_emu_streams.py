"""Streams and events of the CUDA emulation keep order, and a missing fence in gear_flow is caught.

The model (tests/cuda_emu/streams.py): device work is queued per stream and
runs only when the host waits for it (or when a stream that waits for it runs).
The first half checks the model itself; the second removes, one at a time,
each fence gear_flow's GPU code relies on and shows that a test then fails —
while the same test passes with the fence.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_emu import fixtures

emulated = fixtures.emulated  # the fixture: cupy is the emulation's in these tests


def _raw(a, n: int) -> bytes:
    """The first ``n`` bytes of device memory as they are now (behind the emulation's back)."""
    return ctypes.string_at(a.data.ptr, n)


# ---- the model ---------------------------------------------------------------------------------------


def test_work_runs_only_when_the_host_waits(emulated):
    cp = emulated
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.zeros(4, dtype=np.int64)  # a memset on s
        b = a + 7
    assert s.pending == 2 and not s.query()
    assert _raw(a, 8) == _raw(b, 8) == b"\xa5" * 8  # still the allocations' poison
    s.synchronize()
    assert s.pending == 0 and _raw(b, 8) == np.int64(7).tobytes()


def test_memory_is_reclaimed_only_after_the_work_queued_before_it_went(emulated):
    """As CUDA's stream-ordered allocators: an array whose last reference goes while work queued before still
    writes it through its address (a copy, a gather through a table of pointers) keeps its memory until that
    work has run; it was freed at once, and the queued write scribbled on host memory reused meanwhile (heap
    corruption, a crash in a later test).  Then it is reclaimed."""
    from cuda_emu import streams

    cp = emulated
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        src, dst = cp.arange(1 << 16, dtype=np.uint8), cp.zeros(1 << 16, dtype=np.uint8)
        s.synchronize()
        ptr = dst.data.ptr
        cp.cuda.runtime.memcpyAsync(ptr, src.data.ptr, 1 << 16, cp.cuda.runtime.memcpyDefault, s.ptr)  # queued
    del dst
    assert ptr in streams.DEVICE  # held: the copy writes it when the stream runs
    s.synchronize()
    assert ptr not in streams.DEVICE  # reclaimed once it ran


def test_event_synchronize_runs_its_stream_up_to_the_record_only(emulated):
    cp = emulated
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.zeros(2, dtype=np.int64)
        a += 1
        ev = s.record()
        a += 10
    assert not ev.done
    ev.synchronize()
    assert ev.done and s.pending == 1
    assert _raw(a, 8) == np.int64(1).tobytes()
    assert a.get(stream=s).tolist() == [11, 11]


def test_wait_event_orders_two_streams_and_nothing_else_does(emulated):
    cp = emulated
    producer, consumer = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    src = cp.zeros(3, dtype=np.float32)  # a memset on the legacy default stream...
    with consumer:
        early = src * 1  # ...which a non-blocking stream does not wait for
    assert (early.get(stream=consumer) != 0).all()  # the allocation's poison
    cp.cuda.Stream.null.synchronize()
    with producer:
        src[...] = 5.0
    with consumer:
        unordered = src * 2  # no fence: reads src before the producer ran
    assert unordered.get(stream=consumer).tolist() == [0.0, 0.0, 0.0]
    with producer:
        src[...] = 6.0
    consumer.wait_event(producer.record())
    with consumer:
        ordered = src * 2
    assert ordered.get(stream=consumer).tolist() == [12.0, 12.0, 12.0]


def test_legacy_default_stream_orders_blocking_streams_only(emulated):
    cp = emulated
    blocking, non_blocking = cp.cuda.Stream(), cp.cuda.Stream(non_blocking=True)
    a, b = cp.zeros(1), cp.zeros(1)
    with blocking:
        a += 1
    with non_blocking:
        b += 1
    null = cp.cuda.Stream.null
    with null:
        got_a, got_b = a * 1, b * 1
    assert float(got_a[0]) == 1.0  # float() runs the current (null) stream, which waited for `blocking`
    assert float(got_b[0]) == 0.0  # `non_blocking` was never waited for
    assert non_blocking.pending == 1


def test_host_reads_run_the_current_stream(emulated):
    import torch

    cp = emulated
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.arange(6).reshape(2, 3) * 2
        assert int(a[1, 2]) == 10 and a.sum().item() == 30 and bool(a[0, 1] == 2)
        b = a + 1
        t = torch.from_dlpack(b)  # DLPack export: the consumer (the host) waits for the current stream
    assert t.tolist() == [[1, 3, 5], [7, 9, 11]] and s.pending == 0


def test_pageable_uploads_are_snapshots_pinned_ones_are_read_when_the_copy_runs(emulated):
    cp = emulated
    s = cp.cuda.Stream(non_blocking=True)
    pageable = np.arange(4, dtype=np.int64)
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(32), dtype=np.int64, count=4)
    pinned[...] = np.arange(4)
    d1, d2 = cp.empty(4, dtype=np.int64), cp.empty(4, dtype=np.int64)
    d1.set(pageable, stream=s)
    d2.set(pinned, stream=s)
    pageable += 100
    pinned += 100  # a host write while the copy is queued: the copy sees it
    s.synchronize()
    assert cp.asnumpy(d1).tolist() == [0, 1, 2, 3]
    assert cp.asnumpy(d2).tolist() == [100, 101, 102, 103]


def test_memcpy_async_and_graphs_are_queued(emulated):
    cp = emulated
    s = cp.cuda.Stream(non_blocking=True)
    calls = []
    with s:
        src, dst = cp.arange(8, dtype=np.uint8), cp.zeros(8, dtype=np.uint8)
        s.synchronize()
        s.begin_capture()
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, 8, cp.cuda.runtime.memcpyDefault, s.ptr)
        g = s.end_capture()
        assert s.pending == 0  # captured, not queued
        g.launch(s)
        g.launch(s)
        calls.append(s.pending)
    assert calls == [2]
    assert dst.get(stream=s).tolist() == list(range(8))


def test_events_time_the_work_between_them(emulated):
    cp = emulated
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    x = cp.zeros(1000) + 1
    b.record()
    with pytest.raises(RuntimeError, match="NotReady"):
        cp.cuda.get_elapsed_time(a, b)
    b.synchronize()
    assert cp.cuda.get_elapsed_time(a, b) >= 0.0 and float(x.sum()) == 1000.0


def test_dlpack_stream_handshake(emulated):
    """``stream=-1``: the consumer asked for no ordering and reads what is there; a host stream's
    handle (torch's stream here) or ``None``: the current stream runs first."""
    import torch
    from cuda_emu import streams

    cp = emulated
    s, host = cp.cuda.Stream(non_blocking=True), streams.HostStream()
    with s:
        a = cp.zeros(2, dtype=np.int32)
        s.synchronize()
        b = a + 3
        unordered = torch.from_dlpack(b.__dlpack__(stream=-1))
        assert unordered.tolist() == [-1515870811] * 2  # 0xA5A5A5A5: the add has not run
        ordered = torch.from_dlpack(b.__dlpack__(stream=host.ptr))
    assert ordered.tolist() == [3, 3] and s.pending == 0


def test_asarray_of_pinned_memory_reads_it_when_the_copy_runs(emulated):
    """As CuPy: a pinned source is copied asynchronously (the host must not change it until the copy ran)."""
    cp = emulated
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(16), dtype=np.int64, count=2)
    pinned[...] = 1
    pageable = np.ones(2, np.int64)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        from_pinned, from_pageable = cp.asarray(pinned), cp.asarray(pageable)
    pinned[...] = 2
    pageable[...] = 2
    assert from_pinned.get(stream=s).tolist() == [2, 2]
    assert from_pageable.get(stream=s).tolist() == [1, 1]
