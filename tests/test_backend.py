"""The backend switch, the GPU package's import hygiene, and the no-GPU paths (CPU only)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gear_flow import backend
from gear_flow.errors import GearFlowError, SpecError

ROOT = Path(__file__).resolve().parents[1]
GPU_MODULES = ("cupy", "cupyx", "cudf", "dask_cudf", "rmm", "torch", "numba.cuda")


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter rooted at the repository; returns stdout."""
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def _loaded_after(imports: str) -> list[str]:
    out = _run(
        f"""
        import json, sys
        {imports}
        heavy = {GPU_MODULES!r}
        print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))))
        """
    )
    return json.loads(out.strip().splitlines()[-1])


def test_import_gear_flow_imports_no_gpu_module_nor_torch():
    assert _loaded_after("import gear_flow") == []


def test_import_gear_flow_gpu_and_loader_import_no_cupy():
    assert _loaded_after("import gear_flow.gpu, gear_flow.gpu.loader, gear_flow.backend") == []


def test_backend_queries_import_no_torch():
    # gpu_available may import cupy (when installed) but never torch or cudf
    loaded = _loaded_after("import gear_flow.backend as b; b.gpu_available(); b.array_module('host')")
    assert not [m for m in loaded if m.split(".")[0] in ("torch", "cudf", "dask_cudf")]


def test_host_modules():
    import pandas as pd

    assert backend.array_module("host") is np
    assert backend.output_module("host") is np
    assert backend.frame_module("host") is pd
    assert backend.array_module("pinned") is np  # rings are NumPy arrays over pinned memory
    assert backend.frame_module("pinned") is pd
    assert not backend.output_on_device("host")
    assert backend.output_on_device("pinned") and backend.output_on_device("device")


def test_tier_objects_and_unknown_tiers():
    from gear_flow.storage.base import HostTier

    assert backend.tier_name(HostTier()) == "host"
    assert backend.array_module(HostTier()) is np
    with pytest.raises(SpecError, match="'tape'"):
        backend.array_module("tape")


def test_gpu_available_is_a_bool_and_never_raises():
    assert isinstance(backend.gpu_available(), bool)


@pytest.fixture
def no_cupy(monkeypatch):
    """Make ``import cupy`` fail, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "cupy", None)
    backend.gpu_available.cache_clear()
    yield
    backend.gpu_available.cache_clear()


def test_without_cupy_gpu_paths_raise_clearly(no_cupy):
    assert backend.gpu_available() is False
    for fn in (backend.array_module, backend.output_module):
        with pytest.raises(backend.BackendUnavailableError, match="cupy cannot be imported") as ei:
            fn("device")
        assert isinstance(ei.value, GearFlowError) and "gpu-cu13" in str(ei.value)
    with pytest.raises(backend.BackendUnavailableError):
        backend.output_module("pinned")
    assert backend.array_module("host") is np  # the CPU backend is unaffected


@pytest.mark.parametrize("tier", ["device", "pinned"])
def test_gpu_tiers_without_a_device_raise_backend_unavailable(tier, no_cupy):
    from gear_flow.storage import get_tier

    with pytest.raises(backend.BackendUnavailableError, match=f"storage tier '{tier}'"):
        get_tier(tier)


@pytest.mark.skipif(backend.gpu_available(), reason="checks the no-device path")
def test_with_cupy_but_no_device_tiers_raise():
    pytest.importorskip("cupy")
    backend.gpu_available.cache_clear()
    from gear_flow.storage import get_tier

    with pytest.raises(backend.BackendUnavailableError, match="no CUDA device|cannot query"):
        get_tier("device")


def test_local_table_on_gpu_tier_without_device_fails_at_construction(no_cupy):
    from gear_flow import ColumnSpec, LocalTable, TableSpec

    spec = TableSpec((ColumnSpec("x", (2,), np.float32),), capacity=16)
    with pytest.raises(backend.BackendUnavailableError):
        LocalTable(spec, tier="device")


def test_sample_buffers_host_default_and_tier_matching():
    from gear_flow import ColumnSpec, SampleBuffers, TableSpec

    spec = TableSpec((ColumnSpec("x", (3,), np.float32), ColumnSpec("d", (), np.bool_)), capacity=16)
    buf = SampleBuffers(spec, ["x", "d"], batch_size=4, length=2)
    assert buf.tier == "host" and not buf.on_device
    assert isinstance(buf.bytes["x"], np.ndarray) and buf.arrays["d"].dtype == np.bool_
    assert buf.matches(("x", "d"), 4, 2) and buf.matches(("x", "d"), 4, 2, tier="host")
    assert not buf.matches(("x", "d"), 4, 2, tier="device")
    with buf.gather_stream():  # a no-op for host buffers
        pass
    b = buf.batch(7)
    assert b["x"].shape == (4, 2, 3) and b.table_size == 7


def test_to_torch_host_is_zero_copy():
    a = np.arange(6, dtype=np.float32)
    t = backend.to_torch(a)
    a[0] = 42
    assert float(t[0]) == 42.0
    assert not backend.is_device_array(a)


# -- configuration without dask ---------------------------------------------------------------


def test_simple_yaml_parser_matches_pyyaml():
    yaml = pytest.importorskip("yaml")
    from gear_flow import config

    text = (ROOT / "gear_flow" / "gear-flow.yaml").read_text()
    assert config._parse_simple_yaml(text) == yaml.safe_load(text)


def test_gear_flow_imports_and_configures_without_dask():
    out = _run(
        """
        import sys
        class _Block:  # hide dask (and distributed) from this interpreter
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("dask", "distributed"):
                    raise ImportError(f"{name} is blocked for this test")
        sys.meta_path.insert(0, _Block())
        import gear_flow
        from gear_flow import config
        assert config._dask_config is None
        print(config.get("table.tier"), config.get("table.boundary"), config.get("table.tier", "device"))
        """
    )
    assert out.split() == ["host", "strict", "device"]


# -- kernel sources as the loader sees them -----------------------------------------------------


def test_loader_sources_and_name_expressions():
    from gear_flow.gpu import loader

    assert loader.kernel_dir() == ROOT / "kernels"
    for name, src in loader.SOURCES.items():
        text = loader.source(name)
        assert text.startswith(f'#line 1 "{src.file}"\n')
        assert len(set(src.name_expressions)) == len(src.name_expressions)
        for e in src.name_expressions:
            assert e.split("<")[0] in text, (name, e)
    assert loader.expr("tree_find", "double") in loader.SOURCES["sumtree"].name_expressions
    assert loader.ctype(np.int64) == "long long" and loader.ctype("float32") == "float"
    with pytest.raises(TypeError, match="int16"):
        loader.ctype(np.int16)


def test_loader_kernel_dir_override(tmp_path, monkeypatch):
    from gear_flow.gpu import loader

    monkeypatch.setenv("GEAR_FLOW_KERNEL_DIR", str(tmp_path))
    (tmp_path / "gather.cu").write_text("// test\n")
    assert loader.source("gather") == '#line 1 "gather.cu"\n// test\n'
    with pytest.raises(KeyError, match="unknown kernel module"):
        loader.source("nope")
