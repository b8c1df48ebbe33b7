"""The fused gather (kernel ``gather_columns``) under the CUDA emulation, against its twin.

Cases: tests/fused_gather_cases.py (shared with tests/test_gpu_fused_gather.py).
Also here, because the emulation logs every launch: a device-tier table issues
exactly one gather launch per shard per take.
"""

from __future__ import annotations

import cuda_emu
import numpy as np
import pytest
from cuda_emu import fixtures
from fused_gather_cases import (  # noqa: F401  collected by pytest from this module
    test_gather_columns_duplicate_windows_and_a_shared_source,
    test_gather_columns_empty_cases,
    test_gather_columns_from_pinned_and_device_sources_in_one_launch,
    test_gather_columns_into_batch_slices,
    test_gather_columns_matches_twin,
    test_gather_columns_more_columns_than_one_launch_takes,
    test_gather_columns_rejects_what_the_twin_rejects_before_launching,
    test_host_tier_gather_columns_is_the_twin,
    test_pinned_tier_write_after_gather_columns_keeps_gathered_values,
    test_tier_gather_columns_matches_twin,
)
from parity_cases import Dev

pytestmark = pytest.mark.skipif(cuda_emu.compiler() is None, reason="no C++ compiler for the CUDA emulation")

emulated = fixtures.emulated


@pytest.fixture
def dev(emulated):
    return Dev(emulated, max_n=200_000, cuda_tensors=False)


def _gathers() -> list[str]:
    return [e[1] for e in cuda_emu.EmuKernel.log if e[0] == "gather"]


@pytest.mark.parametrize("tier", ["device", "pinned"])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_table_sample_issues_one_gather_launch_per_shard_take(dev, monkeypatch, tier, num_shards):
    """LocalTable.sample on a GPU tier: every Shard.take_rows with windows is one ``gather_columns``
    launch (all four columns), never a launch per column; the batch equals the host tier's."""
    from gear_flow import ColumnSpec, LocalTable, Prioritized, TableSpec
    from gear_flow.shard import Shard

    spec = TableSpec(
        (
            ColumnSpec("obs", (16,), np.float32),
            ColumnSpec("action", (), np.int64),
            ColumnSpec("reward", (), np.float32),
            ColumnSpec("done", (), np.bool_),
        ),
        capacity=400,
        num_shards=num_shards,
    )
    rng = np.random.default_rng(0)
    eps = []
    for _ in range(15):
        T = int(rng.integers(5, 40))
        eps.append(
            {
                "obs": rng.random((T, 16), dtype=np.float32),
                "action": rng.integers(0, 9, T),
                "reward": rng.random(T, dtype=np.float32),
                "done": np.arange(T) == T - 1,
            }
        )
    tables = {t: LocalTable(spec, sampler=Prioritized(0.7, 0.5), tier=t, seed=3) for t in ("host", tier)}
    for t in tables.values():
        t.insert(eps)

    takes = []  # launches issued inside each take that gathered windows
    real_take = Shard.take_rows  # a sample's every take: windows, gather and rows

    def take(self, slots, *a, **kw):
        before = len(_gathers())
        real_take(self, slots, *a, **kw)
        if len(slots):
            takes.append(_gathers()[before:])

    monkeypatch.setattr(Shard, "take_rows", take)
    for _ in range(3):
        takes.clear()
        cuda_emu.EmuKernel.log.clear()
        ref = tables["host"].sample(24, 6)
        host_takes = len(takes)
        takes.clear()
        cuda_emu.EmuKernel.log.clear()
        got = tables[tier].sample(24, 6)
        assert len(takes) == host_takes >= 1
        assert all(t == ["gather_columns"] for t in takes), takes
        assert _gathers() == ["gather_columns"] * len(takes)  # no gather outside the takes either
        for name in spec.names:
            np.testing.assert_array_equal(got[name].cpu().numpy(), ref[name].numpy())
        if num_shards > 1:
            assert host_takes > 1  # 24 draws over 3 shards touch more than one
