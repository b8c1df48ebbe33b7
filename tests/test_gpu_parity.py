"""Parity of the CUDA kernels with their CPU twins, on a real device (cases: tests/parity_cases.py).

Run on a GPU machine with ``pytest -m gpu``; without a usable device the
``gpu`` marker turns into a skip (tests/conftest.py).  The last cases run
LocalTable on the ``device`` and ``pinned`` tiers end to end and expect CUDA
torch tensors.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from parity_cases import (  # noqa: E402, F401  collected by pytest from this module
    Dev,  # noqa: E402
    test_gather_windows,
    test_gather_windows_into_batch_slices_with_device_window_arrays,
    test_gather_windows_rejects_what_the_twin_rejects,
    test_gather_windows_with_host_and_device_window_arrays_mixed,
    test_local_table_on_gpu_tier_into_device_buffers,
    test_local_table_on_gpu_tier_matches_host_tier,
    test_maxtree_set_leaves,
    test_pinned_tier_write_after_gather_keeps_gathered_values,
    test_sumtree_empty_update_is_a_no_op,
    test_sumtree_find,
    test_sumtree_range_sums_and_ring_tail_mass,
    test_sumtree_range_sums_stay_inside_the_tree_and_their_output,
    test_sumtree_rebuild,
    test_sumtree_sample_matches_twin_on_same_uniforms,
    test_sumtree_set_leaves,
    test_sumtree_set_leaves_const,
    test_sumtree_set_leaves_host_inputs_and_scratch_reuse,
    test_tier_write_read_gather,
    test_topk,
    test_topk_flat_float32,
)


@pytest.fixture
def dev():
    return Dev(cupy, max_n=1 << 30, cuda_tensors=True)


def test_kernels_compile_lazily_once_per_module():
    """The loader builds one RawModule per source and memoises it."""
    from gear_flow.gpu import loader

    a = loader.module("gather")
    assert loader.module("gather") is a
    assert isinstance(a, cupy.RawModule)
