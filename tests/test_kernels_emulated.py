"""The CUDA kernels, compiled as host C++ and run through the real Python wrappers, against the twins.

No GPU needed: tests/cuda_emu maps the CUDA subset the kernels use onto host
threads, barriers and atomics, and stands in for CuPy with device arrays that
are not NumPy arrays (implicit host conversion raises, as in CuPy) and streams
that queue the work until the host waits for it (a missing fence shows as
wrong data).  The same cases as tests/test_gpu_parity.py (tests/parity_cases.py),
at the sizes an emulation can afford.  What this proves: the kernels' logic
equals the twins', the wrappers launch them with the right arguments in the
right order, and the host never reads device data it did not wait for.
What it cannot: speed, and behaviour that depends on the GPU memory model.
"""

from __future__ import annotations

import cuda_emu
import pytest
from cuda_emu import fixtures
from parity_cases import (  # noqa: F401  collected by pytest from this module
    Dev,
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

pytestmark = pytest.mark.skipif(cuda_emu.compiler() is None, reason="no C++ compiler for the CUDA emulation")


emulated = fixtures.emulated  # the fixture: cupy is the emulation's in these tests


@pytest.fixture
def dev(emulated):
    return Dev(emulated, max_n=200_000, cuda_tensors=False)


def test_emulated_launches_are_logged(dev):
    import numpy as np

    from gear_flow.gpu.ops import sumtree

    cuda_emu.EmuKernel.log.clear()
    tree = dev.to(np.zeros(8))
    sumtree.set_leaves(tree, np.array([1, 2]), np.array([1.0, 2.0]))
    assert [e[1] for e in cuda_emu.EmuKernel.log] == ["tree_update_block<SumOp, long long, double>"]
    assert float(tree[1]) == 3.0


def test_gpu_check_runs_under_emulation(dev, monkeypatch, tmp_path):
    """pipelines/gpu_check.py end to end on the emulation, at a small scale: no section may
    fail for a reason of its own (the table sections need CUDA tensors, the tests a device)."""
    import json
    import sys
    from pathlib import Path

    pipelines = Path(__file__).resolve().parents[1] / "pipelines"
    monkeypatch.syspath_prepend(str(pipelines))
    import gpu_check

    for k, v in {"episodes": 6, "episode_length": 40, "batch_size": 8, "length": 5}.items():
        monkeypatch.setitem(gpu_check.REFERENCE, k, v)
    out = tmp_path / "gpu_check.json"
    gpu_check.main(["--quick", "--skip-tests", "--out", str(out)])
    s = json.loads(out.read_text())["sections"]
    for name in ("device", "gather_device", "gather_pinned", "sumtree"):
        assert s[name]["status"] == "ok", (name, s[name].get("error"), s[name].get("traceback"))
    assert s["gather_device"]["parity_with_twin"] and s["gather_pinned"]["parity_with_twin"]
    for name in ("gather_device", "gather_pinned"):  # per column and fused, each measured
        g = s[name]
        assert g["parity_per_column"] and g["parity_fused"], name
        assert g["kernel_fused"]["launches_per_take"] == 1 and g["ratio_fused"] > 0 and g["ratio"] > 0, name
        assert g["meets_target"] == (g["ratio_fused"] >= gpu_check.TARGET_RATIO), name
    assert s["sumtree"]["parity_with_twin"] and s["sumtree"]["topk_parity"]
    assert s["table_device"]["status"] == "failed"  # CPU torch: no CUDA tensors here
    sel = s["table_selection"]  # the device tier's steady state, against its target, batch by batch as the host
    assert sel["status"] == "ok" and sel["parity_with_host"], sel.get("error")
    assert sel["target_ms"] == gpu_check.TABLE_SELECTION_MS == 0.3
    assert sel["meets_target"] == (sel["device"]["sample_and_update_ms"] <= 0.3)
    assert s["dask_cuda"]["status"] in ("skipped", "failed")
    assert "gpu_check" in sys.modules
