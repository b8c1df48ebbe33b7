"""Selection on the ``device`` tier on a real GPU (cases: tests/selection_cases.py).

The same cases as tests/test_device_selection.py runs under the CUDA
emulation; here the kernels run on the device, with CuPy.  Skipped without a
usable device (the ``gpu`` marker, tests/conftest.py).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from parity_cases import Dev  # noqa: E402
from selection_cases import (  # noqa: E402, F401  collected by pytest from this module
    test_device_shard_removers_match_host,
    test_device_tier_checkpoint_round_trip_keeps_the_samples,
    test_device_tier_heaps_with_many_ties_match_host,
    test_device_tier_matches_host_with_max_times_sampled_and_epochs,
    test_device_tier_table_matches_host_tier,
)


@pytest.fixture
def dev():
    return Dev(cupy, max_n=1 << 30, cuda_tensors=True)


def test_device_tier_trees_are_cupy_arrays(dev):
    from selection_cases import _spec

    from gear_flow import LocalTable, MaxHeap, Prioritized

    for sampler in (Prioritized(), MaxHeap()):
        t = LocalTable(_spec("step"), sampler=sampler, tier="device", seed=0)
        assert all(isinstance(s.sampler.tree, cupy.ndarray) for s in t.shards)
