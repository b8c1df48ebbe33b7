"""The fused gather (kernel ``gather_columns``) on a real device, against its twin.

Cases: tests/fused_gather_cases.py (shared with tests/test_fused_gather_emulated.py).
Run on a GPU machine with ``pytest -m gpu``; without a usable device the
``gpu`` marker turns into a skip (tests/conftest.py).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from fused_gather_cases import (  # noqa: E402, F401  collected by pytest from this module
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
from parity_cases import Dev  # noqa: E402


@pytest.fixture
def dev():
    return Dev(cupy, max_n=1 << 30, cuda_tensors=True)
