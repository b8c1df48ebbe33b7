"""Every CUDA source compiles, with every template instantiation the loader asks for.

Needs no GPU: nvcc builds cubins for sm_80 and sm_90 (skipped when nvcc is
absent), and, where CuPy and the NVRTC library are installed, NVRTC compiles
the exact text and name expressions that :mod:`gear_flow.gpu.loader` hands to
``cupy.RawModule``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gear_flow.gpu import loader

ROOT = Path(__file__).resolve().parents[1]
KERNELS = sorted((ROOT / "kernels").glob("*.cu"))
ARCHS = ("sm_80", "sm_90")
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def _nvcc(src: Path, arch: str, out: Path) -> str:
    cmd = [
        NVCC,
        "-cubin",
        f"-arch={arch}",
        "-std=c++17",
        "-Werror",
        "all-warnings",
        "-Xptxas",
        "-v",
        "-o",
        str(out),
        str(src),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    assert out.stat().st_size > 0
    return res.stderr


def test_every_source_is_known_to_the_loader():
    assert {p.name for p in KERNELS} == {s.file for s in loader.SOURCES.values()}


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cu", KERNELS, ids=lambda p: p.name)
def test_source_compiles(cu, arch, tmp_path):
    _nvcc(cu, arch, tmp_path / f"{cu.stem}.cubin")


def _instantiation_unit(name: str, tmp_path: Path) -> Path:
    """A translation unit including the source and taking the address of every name expression,
    which instantiates each template exactly as NVRTC's name expressions do."""
    src = loader.SOURCES[name]
    lines = [f'#include "{ROOT / "kernels" / src.file}"', "void* gear_flow_instantiations[] = {"]
    lines += [f"    (void*)&{e}," for e in src.name_expressions]
    lines += ["};", ""]
    unit = tmp_path / f"inst_{name}.cu"
    unit.write_text("\n".join(lines))
    return unit


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(loader.SOURCES))
def test_loader_instantiations_compile_without_spills(name, arch, tmp_path):
    log = _nvcc(_instantiation_unit(name, tmp_path), arch, tmp_path / f"inst_{name}.cubin")
    entries = re.findall(r"Compiling entry function '([^']+)'", log)
    # one entry per name expression (templates instantiated, none dropped)
    assert len(entries) == len(loader.SOURCES[name].name_expressions), log
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert spills and all(a == "0" and b == "0" for a, b in spills), log


def _nvrtc():
    cupy = pytest.importorskip("cupy")
    try:
        from cupy.cuda import compiler
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # library missing
        pytest.skip(f"NVRTC unavailable: {e}")
    if not hasattr(compiler, "_NVRTCProgram"):
        pytest.skip("this CuPy has no _NVRTCProgram")
    return cupy, compiler


@pytest.mark.parametrize("name", sorted(loader.SOURCES))
def test_loader_source_compiles_with_nvrtc(name):
    """The exact RawModule input (``#line`` header, options, name expressions) through NVRTC,
    with the option CuPy adds for RawModule."""
    _, compiler = _nvrtc()
    opts = loader.options(name) + ("--device-as-default-execution-space", "-arch=sm_90")
    exprs = list(loader.SOURCES[name].name_expressions)
    prog = compiler._NVRTCProgram(loader.source(name), f"{name}.cu", name_expressions=exprs, method="cubin")
    cubin, mapping = prog.compile(opts)
    assert len(cubin) > 0
    assert set(mapping) == set(exprs) and all(mapping.values())
