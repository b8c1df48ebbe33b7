"""Table-level paths on the GPU tiers under the stricter emulation, beyond the parity cases.

Each test compares a ``device`` or ``pinned`` table with a ``host`` table fed
the same inserts and seed: the learner's Stream (prefetch threads, reused
device buffers), checkpoint and restore, and the shard's host reads of a
device ring.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emu import fixtures

emulated = fixtures.emulated  # the fixture: cupy is the emulation's in these tests


def _spec(num_shards: int = 2):
    from gear_flow import ColumnSpec, TableSpec

    cols = (ColumnSpec("obs", (3,), np.float32), ColumnSpec("reward", (), np.float32), ColumnSpec("done", (), np.bool_))
    return TableSpec(cols, capacity=160, num_shards=num_shards)


def _episodes(n: int = 10, seed: int = 3):
    rng = np.random.default_rng(seed)
    return [
        {"obs": rng.random((T, 3), dtype=np.float32), "reward": rng.random(T, dtype=np.float32),
         "done": np.arange(T) == T - 1}
        for T in rng.integers(6, 25, n)
    ]  # fmt: skip


def _tables(tier: str, **kw):
    from gear_flow import LocalTable, Prioritized

    return {t: LocalTable(_spec(), sampler=Prioritized(0.6, 0.4), tier=t, seed=11, **kw) for t in ("host", tier)}


def _same(got, ref) -> None:
    for name in ("obs", "reward", "done"):
        np.testing.assert_array_equal(got[name].cpu().numpy(), ref[name].numpy(), err_msg=name)
    np.testing.assert_array_equal(got.keys.numpy(), ref.keys.numpy())


@pytest.mark.parametrize("tier", ["device", "pinned"])
def test_stream_with_prefetch_threads_yields_the_host_batches(emulated, tier):
    """gear_flow.Stream: requests in flight on threads, gathering into a pool of reused device buffers."""
    from gear_flow import Stream

    tables = _tables(tier)
    for t in tables.values():
        t.insert(_episodes())
    streams = {t: Stream(tables[t], 6, 4, prefetch=2, num_batches=6, seed=5) for t in tables}
    n = 0
    for ref, got in zip(streams["host"], streams[tier]):
        _same(got, ref)
        n += 1
    assert n == 6


@pytest.mark.parametrize("tier", ["device", "pinned"])
def test_checkpoint_and_restore_keep_the_rings(emulated, tier, tmp_path):
    from gear_flow import LocalTable

    tables = _tables(tier)
    for t in tables.values():
        t.insert(_episodes())
    for name, t in tables.items():
        t.checkpoint(tmp_path / name)
    back = {name: LocalTable.restore(tmp_path / name, tier=name, seed=2) for name in tables}
    for _ in range(2):
        _same(back[tier].sample(8, 3), back["host"].sample(8, 3))


def test_checkpoint_orders_after_inserts_issued_on_another_stream(emulated, tmp_path):
    """The snapshot of a device ring reads it on the checkpointing thread's current stream; an
    insert issued on another stream is ordered before it only by the tier's fence.

    Fails today: ``checkpoint._host`` copies the ring with ``a.get()`` on the current stream,
    bypassing the tier (reported; the fix belongs in gear_flow/checkpoint.py, see the report).
    """
    from gear_flow import LocalTable

    tables = _tables("device")
    side = emulated.cuda.Stream(non_blocking=True)
    tables["host"].insert(_episodes())
    with side:  # e.g. a collector thread inserting under its own CUDA stream
        tables["device"].insert(_episodes())
    for name, t in tables.items():
        t.checkpoint(tmp_path / name)
    back = {name: LocalTable.restore(tmp_path / name, tier="host", seed=2) for name in tables}
    _same(back["device"].sample(8, 3), back["host"].sample(8, 3))


def test_episode_reads_of_a_device_ring_wait_for_the_inserts(emulated):
    """``ColumnRing.read`` (ingest reports, episode export) goes through ``DeviceTier.read_rows``."""
    tables = _tables("device")
    eps = _episodes(4)
    side = emulated.cuda.Stream(non_blocking=True)
    with side:
        tables["device"].insert(eps)
    tables["host"].insert(eps)
    for s_dev, s_host in zip(tables["device"].shards, tables["host"].shards):
        starts, lengths = (
            s_host.index.get("start", s_host.index.live()),
            s_host.index.get("length", s_host.index.live()),
        )
        for a, t in zip(starts, lengths):
            np.testing.assert_array_equal(
                s_dev.ring.read("obs", int(a), int(t)), s_host.ring.read("obs", int(a), int(t))
            )


def test_a_device_rings_large_list_insert_holds_every_episode_in_order(emulated, monkeypatch):
    """A list insert of many short episodes into a ``device`` ring is joined on the host into its page-locked
    staging buffer by the host ring's join (compiled copies for many parts): the ring holds what the host
    ring holds, wrapping included, and the join ran compiled for the staging buffer."""
    from gear_flow import ColumnSpec, LocalTable, TableSpec, Uniform
    from gear_flow.ops import gather

    spec = TableSpec((ColumnSpec("obs", (256,), np.float32), ColumnSpec("reward", (), np.float32)), capacity=25_000)
    rng = np.random.default_rng(4)
    lists = [
        [{"obs": rng.random((T, 256), dtype=np.float32), "reward": rng.random(T, dtype=np.float32)}
         for T in rng.integers(5, 16, 1000)]
        for _ in range(3)
    ]  # fmt: skip
    joined = []
    compiled = gather._copy_parts

    def counted(dst, at, addr, size):
        joined.append(int(size.sum()))
        compiled(dst, at, addr, size)

    monkeypatch.setattr(gather, "_copy_parts", counted)
    tables = {t: LocalTable(spec, sampler=Uniform(), tier=t, seed=7) for t in ("host", "device")}
    for eps in lists:  # ~10 MB of obs per insert; the third wraps the ring (every row written)
        tables["host"].insert(eps)
    joined.clear()
    for eps in lists:
        tables["device"].insert(eps)
    # every insert's obs and rewards (1,000 parts each) joined into the staging buffer by compiled copies, whole
    assert sum(joined) == sum(e["obs"].nbytes + e["reward"].nbytes for eps in lists for e in eps)
    for name in ("obs", "reward"):
        host = tables["host"].shards[0].ring.bytes[name]
        dev = tables["device"].shards[0].ring.bytes[name]
        np.testing.assert_array_equal(dev.get() if hasattr(dev, "get") else np.asarray(dev), host, err_msg=name)
    for _ in range(3):
        got, ref = tables["device"].sample(16, 4), tables["host"].sample(16, 4)
        np.testing.assert_array_equal(got.keys.numpy(), ref.keys.numpy())
        for name in ("obs", "reward"):
            np.testing.assert_array_equal(got[name].cpu().numpy(), ref[name].numpy(), err_msg=name)


@pytest.mark.parametrize("tier", ["device", "pinned"])
@pytest.mark.parametrize("episodes", [1, 3])
def test_an_insert_from_a_page_locked_buffer_refilled_at_once_keeps_the_values_it_was_given(emulated, tier, episodes):
    """An actor hands its pinned buffer (a torch tensor's ``.numpy()``) to ``insert`` and refills it as soon
    as the call returns.  A device table's insert of one episode copied from it asynchronously (a copy from
    page-locked memory reads it when it runs): the ring got the refilled values (2.0 where 1.0 was
    inserted).  Several episodes went through a staging buffer and were right."""
    import cupy as cp

    tables = _tables(tier)
    T = 8
    buf = np.frombuffer(cp.cuda.alloc_pinned_memory(episodes * T * 3 * 4), dtype=np.float32).reshape(episodes, T, 3)
    for value in (1.0, 2.0):
        buf[...] = value
        for t in tables.values():
            t.insert(
                [
                    {"obs": buf[k], "reward": np.zeros(T, np.float32), "done": np.arange(T) == T - 1}
                    for k in range(episodes)
                ]
            )
        buf[...] = -1.0  # the actor's next trajectory, written into the same buffer
    for t in tables.values():
        t.rng = np.random.default_rng(0)
    _same(tables[tier].sample(16, 2), tables["host"].sample(16, 2))
    assert -1.0 not in tables[tier].sample(16, 2)["obs"].cpu().numpy()
