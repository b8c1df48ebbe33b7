"""Distributed tables on the GPU tiers, against the same table on the host tier, under the CUDA emulation.

The shards live on emulated worker processes (``cuda_emu.fixtures.emu_cluster``):
``device`` rings in (fake) device memory, ``pinned`` rings in page-locked
memory — with the shared-memory data plane on, in named segments page-locked
in place that this process maps, registers and gathers from with its own
(emulated) GPU.  Same seed, same inserts: the GPU tiers must return exactly the
host tier's batches, in order (keys, probabilities, weights, mask, bytes), with
the column tensors coming from device buffers; a co-located learner samples
into its own device buffers; writers inserting meanwhile never make a window
mix episodes.  On a real GPU the same paths run in ``pipelines/gpu_check.py``.
"""

from __future__ import annotations

import threading

import dask
import numpy as np
import pytest
from cuda_emu import fixtures

import gear_flow as gf
from gear_flow.distributed import DistributedTable

emulated = fixtures.emulated
emu_cluster = fixtures.emu_cluster

SPEC = gf.TableSpec((gf.ColumnSpec("obs", (3,), np.float32), gf.ColumnSpec("a", (), np.int64)), capacity=120,
                    num_shards=2)  # fmt: skip


def _episodes(first_id: int, lengths) -> list[dict]:
    """Episode ``e`` step ``t``: obs = (e, t, e + t), a = 1000 e + t (a window's rows identify it)."""
    out = []
    for k, n in enumerate(lengths):
        e, t = first_id + k, np.arange(n)
        out.append({"obs": np.stack([np.full(n, e), t, e + t], 1).astype(np.float32), "a": 1000 * e + t})
    return out


def _same(a, b) -> None:
    for f in ("keys", "probabilities", "weights", "mask", "episode_ids", "timesteps"):
        assert np.array_equal(getattr(a, f).numpy(), getattr(b, f).cpu().numpy()), f
    for c in SPEC.names:
        assert np.array_equal(a[c].numpy(), b[c].cpu().numpy()), c


@pytest.mark.parametrize("sampler", [gf.Prioritized(0.8, 0.5), gf.Fifo()], ids=["prioritized", "fifo"])
@pytest.mark.parametrize(("tier", "plane"), [("device", "comm"), ("pinned", "comm"), ("pinned", "shared-memory")])
def test_gpu_tiers_sample_what_the_host_tier_samples(emulated, emu_cluster, tier, plane, sampler):
    with dask.config.set({"gear-flow.distributed.shared-memory": plane == "shared-memory"}):
        host = DistributedTable.create(emu_cluster, SPEC, sampler=sampler, seed=7)
        gpu = DistributedTable.create(emu_cluster, SPEC, sampler=sampler, tier=tier, seed=7)
        try:
            for i, lengths in enumerate(([9, 14, 5], [30, 7], [11, 16, 8, 21])):  # both rings wrap (120 steps)
                pr = None if sampler.deterministic else list(np.random.default_rng(i).random((len(lengths), 1)))
                kw = {} if pr is None else {"priorities": [np.full(n, p[0] + 0.1) for n, p in zip(lengths, pr)]}
                host.insert(_episodes(10 * i, lengths), **kw)
                gpu.insert(_episodes(10 * i, lengths), **kw)
                for _ in range(2):
                    a, b = host.sample(12, 5), gpu.sample(12, 5)
                    _same(a, b)
                    if not sampler.deterministic:
                        p = np.linspace(0.5, 2.0, 12)
                        host.update_priorities(a.keys.numpy(), p)
                        gpu.update_priorities(b.keys.numpy(), p)
            if plane == "shared-memory":
                assert gpu.stats["shared_bytes"] > 0 and gpu.stats["remote_bytes"] == 0, gpu.stats
            else:
                assert gpu.stats["remote_bytes"] > 0, gpu.stats
        finally:
            host.close()
            gpu.close()


def _colocated(name: str) -> dict:
    """A learner task on a worker: samples the table into device buffers of its own."""

    from gear_flow.distributed import DistributedTable
    from gear_flow.sample import SampleBuffers

    t = DistributedTable.attach(name, seed=1)
    out = SampleBuffers(t.spec, t.spec.names, 8, 4, tier="device")
    b = t.sample(8, 4, out=out)
    a = b["a"].numpy()
    m = b.mask.numpy()
    return {"on_device": out.on_device, "a": a.tolist(), "mask": m.tolist(), "stats": dict(t.stats)}


@pytest.mark.parametrize("tier", ["device", "pinned"])
def test_a_colocated_learner_samples_into_its_device_buffers(emu_cluster, tier):
    t = DistributedTable.create(emu_cluster, SPEC, tier=tier, seed=3)
    try:
        t.insert(_episodes(0, [20, 25, 30, 15]))
        res = emu_cluster.submit(_colocated, t.name, pure=False).result(timeout=60)
        assert res["on_device"]
        a, m = np.array(res["a"]), np.array(res["mask"])
        for row, mask in zip(a, m):  # consecutive steps of one episode where the mask says data
            v = row[mask]
            assert len(v) and np.all(np.diff(v) == 1) and len(set(v // 1000)) == 1
        assert res["stats"]["local_bytes"] > 0  # its own worker's shard in-process
    finally:
        t.close()


def test_writers_inserting_while_a_learner_samples_device_tier(emulated, emu_cluster):
    t = DistributedTable.create(emu_cluster, SPEC, sampler=gf.Uniform(), tier="device", seed=11)
    stop = threading.Event()
    errors = []

    def writer(base):
        i = 0
        while not stop.is_set() and i < 40:
            try:
                t.insert(_episodes(base + i, [7 + i % 5]))
            except Exception as e:  # surfaced below
                errors.append(e)
                return
            i += 1

    try:
        t.insert(_episodes(0, [10, 10]))
        ws = [threading.Thread(target=writer, args=(b,)) for b in (100, 500)]
        for w in ws:
            w.start()
        for _ in range(15):
            b = t.sample(16, 4)
            a, m, obs = b["a"].cpu().numpy(), b.mask.cpu().numpy(), b["obs"].cpu().numpy()
            for row, mask, o in zip(a, m, obs):
                v = row[mask]
                assert np.all(np.diff(v) == 1) and len(set(v // 1000)) == 1, row
                assert np.array_equal(o[mask][:, 0], v // 1000) and np.array_equal(o[mask][:, 1], v % 1000)
        stop.set()
        for w in ws:
            w.join(60)
        assert not errors, errors
    finally:
        stop.set()
        t.close()
