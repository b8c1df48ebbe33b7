"""The device tier's steady-state batch, counted under the CUDA emulation: kernel launches and host waits.

A ``device`` table's sample into reused device buffers, and a priority update,
after the first batches of their shape: the emulation logs every launch
(:attr:`cuda_emu.EmuKernel.log`) and counts every wait of the host for the
device (:data:`cuda_emu.streams.HOST_WAITS`: stream and event
synchronizations, blocking copies to the host).  The bounds are today's
counts, so that a change adding a launch or a wait to the per-batch path fails
here without a GPU: a prioritized sample is the draw (``tree_sample``) and
one fused gather of every column, with one wait (the drawn slots copied back
for the host's window geometry; the staging buffer of the windows' upload is
reused without a wait once the copy that last read it is seen done); a uniform
sample of a ring without holes draws by arithmetic on the host
(:meth:`gear_flow.selectors.Uniform.draw`), so it is the gather alone and
no wait; an
update is one launch and no wait; an insert that overwrites the ring changes the sampler's tree with
one launch (the evicted items and the new ones together).
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emu import EmuKernel, fixtures, streams

emulated = fixtures.emulated

SAMPLE = {
    "prioritized": ((("sumtree", "tree_sample<double>"), ("gather", "gather_columns")), 1),
    "uniform": ((("gather", "gather_columns"),), 0),
}
UPDATE = (("sumtree", "tree_update_block<SumOp, long long, double>"),)


def counted(fn):
    """``fn()``'s result, the (module, kernel) of each launch it made in order, and its host waits."""
    launches, waits = len(EmuKernel.log), streams.HOST_WAITS[0]
    out = fn()
    return out, [e[:2] for e in EmuKernel.log[launches:]], streams.HOST_WAITS[0] - waits


@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_a_steady_state_device_sample_launches_and_waits_within_bounds(emulated, sampler):
    from gear_flow import ColumnSpec, LocalTable, Prioritized, SampleBuffers, TableSpec, Uniform

    spec = TableSpec((ColumnSpec("obs", (7,), np.float32), ColumnSpec("done", (), np.bool_)), capacity=400)
    rng = np.random.default_rng(1)
    eps = [
        {"obs": rng.random((T, 7), dtype=np.float32), "done": np.arange(T) == T - 1} for T in rng.integers(8, 30, 10)
    ]
    sel = Prioritized(1.0, 0.4) if sampler == "prioritized" else Uniform()
    t = LocalTable(spec, sampler=sel, tier="device", seed=5, boundary="pad_tail")
    host = LocalTable(spec, sampler=sel, tier="host", seed=5, boundary="pad_tail")
    for x in (t, host):
        x.insert(eps)
    buf = SampleBuffers(spec, spec.names, 16, 4, tier="device")
    for _ in range(3):  # the first batches of this shape
        t.sample(16, 4, out=buf)
        host.sample(16, 4)
    for _ in range(3):
        b, launches, waits = counted(lambda: t.sample(16, 4, out=buf))
        assert tuple(launches) == SAMPLE[sampler][0], launches
        assert waits == SAMPLE[sampler][1], waits
        ref = host.sample(16, 4)  # and the batch is still the host's
        np.testing.assert_array_equal(b["obs"].cpu().numpy(), ref["obs"].numpy())
        np.testing.assert_array_equal(b.probabilities.numpy(), ref.probabilities.numpy())
    if sampler == "prioritized":
        for p in (2.0, 3.0):
            _, launches, waits = counted(lambda p=p: t.update_priorities(b.keys.numpy(), np.full(16, p)))
            assert tuple(launches) == UPDATE and waits == 0, (launches, waits)


@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_an_insert_that_overwrites_the_ring_changes_each_tree_once(emulated, sampler):
    """The evicted items' removal and the new items' weights are one update of the sampler's tree: one
    upload and one launch per insert, however many episodes it overwrites; the table still samples as the
    host tier does."""
    from gear_flow import ColumnSpec, LocalTable, Prioritized, TableSpec, Uniform

    spec = TableSpec((ColumnSpec("obs", (3,), np.float32),), capacity=120)
    rng = np.random.default_rng(2)
    sel = Prioritized(0.8, 0.4) if sampler == "prioritized" else Uniform()
    t = LocalTable(spec, sampler=sel, tier="device", seed=4)
    host = LocalTable(spec, sampler=sel, tier="host", seed=4)
    for i in range(8):  # from the third on, each insert overwrites episodes at the ring's front
        eps = [{"obs": rng.random((int(T), 3), dtype=np.float32)} for T in rng.integers(10, 25, 3)]
        pr = rng.random(sum(len(e["obs"]) for e in eps)) + 0.1
        host.insert(eps, priorities=pr)
        _, launches, _ = counted(lambda eps=eps, pr=pr: t.insert(eps, priorities=pr))
        trees = [x for x in launches if x[0] == "sumtree"]
        assert trees == [("sumtree", "tree_update_block<SumOp, long long, double>")], (i, launches)
        b, ref = t.sample(8, 2), host.sample(8, 2)
        np.testing.assert_array_equal(b.keys.numpy(), ref.keys.numpy())
        np.testing.assert_array_equal(b.probabilities.numpy(), ref.probabilities.numpy())
    assert t.info()["totals"]["evicted"] > 0
