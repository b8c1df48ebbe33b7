"""Run the CUDA kernels on the CPU, through the real Python wrappers, for tests.

:func:`build` compiles each ``kernels/<name>.cu`` as host C++ (``emu.h`` maps
the CUDA subset the kernels use onto threads, barriers and atomics) together
with a trampoline per name expression of :data:`gear_flow.gpu.loader.SOURCES`,
so the kernels are instantiated exactly as the loader instantiates them.
The build checks alignment at run time (UBSan, with the handler in emu.h): a
vector load or store at an address a GPU would fault on fails the launch with
the source line, rather than passing on a CPU that tolerates it.

:func:`install` then replaces ``cupy`` by :mod:`.fake_cupy` (device arrays that
are not NumPy arrays, streams that queue work) and
``gear_flow.gpu.loader.function`` by :class:`EmuKernel`, whose call signature
is RawKernel's ``(grid, block, args)``.  A launch is queued on the current
stream and runs when the host waits for that stream (see :mod:`.streams`).
Arguments are packed like CuPy packs them: arrays as pointers, NumPy scalars
(and size-1 NumPy arrays) by their dtype — a Python int or float is refused,
since its C type would be a guess, and a larger NumPy array is refused as
CuPy refuses it.  A wrapper passing an argument of the wrong type or in the
wrong position therefore fails here as it would on a GPU.

:func:`install_in_process` does the same without pytest's monkeypatch, for a
process that stays emulated (a Dask worker, see :mod:`.preload`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

_CTYPES = {
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double,
}


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


def _trampolines(name: str) -> str:
    from gear_flow.gpu import loader

    src = loader.SOURCES[name]
    lines = [
        '#include "emu.h"',
        f'#include "{ROOT / "kernels" / src.file}"',
        'extern "C" int emu_launch(const char* name, unsigned gx, unsigned bx, void** args) {',
    ]
    for e in src.name_expressions:
        lines.append(f'    if (!std::strcmp(name, "{e}")) {{ emu::launch(&{e}, gx, bx, args); return 0; }}')
    lines += ["    return -1;", "}", ""]
    return "\n".join(lines)


_libs: dict[str, ctypes.CDLL] = {}


def build(name: str) -> ctypes.CDLL:
    """The emulation library of module ``name`` (built once per source version, cached on disk)."""
    if name in _libs:
        return _libs[name]
    from gear_flow.gpu import loader

    code = _trampolines(name)
    digest = hashlib.sha256(
        (code + (HERE / "emu.h").read_text() + (ROOT / "kernels" / loader.SOURCES[name].file).read_text()).encode()
    ).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"gear_flow_cuda_emu_{os.getuid()}"
    cache.mkdir(exist_ok=True)
    so = cache / f"{name}_{digest}.so"
    if not so.exists():
        cpp = cache / f"{name}_{digest}.cpp"
        cpp.write_text(code)
        tmp = cache / f"{name}_{digest}.{os.getpid()}.so"
        # misaligned accesses (which fault on a GPU) are counted by emu.h's UBSan handler
        cmd = [compiler(), "-std=c++17", "-O1", "-shared", "-fPIC", "-Wno-unknown-pragmas",
               "-fsanitize=alignment", "-fsanitize-recover=alignment", "-Wl,-Bsymbolic",
               f"-I{HERE}", "-o", str(tmp), str(cpp)]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if res.returncode:
            raise RuntimeError(f"emulation build of {name} failed:\n{res.stderr}")
        os.replace(tmp, so)
    lib = ctypes.CDLL(str(so))
    lib.emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
    lib.emu_launch.restype = ctypes.c_int
    lib.emu_faults.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.emu_faults.restype = ctypes.c_ulonglong
    _libs[name] = lib
    return lib


def _pack(a):
    from .ndarray import ndarray

    if isinstance(a, ndarray):
        return ctypes.c_void_p(a.data.ptr)
    if isinstance(a, np.ndarray):
        if a.size != 1:  # CuPy's message: a host array where a device pointer was meant
            raise TypeError(
                f"You are trying to pass a numpy.ndarray of shape {a.shape} as a kernel parameter. Only "
                "numpy.ndarrays of size one can be passed by value. If you meant to pass a pointer to __global__ "
                "memory, you need to pass a cupy.ndarray instead."
            )
        a = a.reshape(())[()]
    if isinstance(a, np.generic):
        return _CTYPES[a.dtype](a.item())
    raise TypeError(f"kernel argument {a!r} of type {type(a).__name__}: pass arrays or NumPy scalars")


#: Every kernel in kernels/ is either grid-stride (any grid computes the same
#: result) or launched as a single block, so the emulation may run fewer blocks
#: than the wrapper asked for; several, so that blocks still meet in global
#: atomics.  The requested grid is kept in EmuKernel.log.
MAX_EMULATED_BLOCKS = 6


class EmuKernel:
    """Stands in for a ``cupy.RawKernel``: ``kernel(grid, block, args)``."""

    #: launches so far, as (module, name expression, grid, block): tests may inspect them
    log: list = []

    def __init__(self, module: str, expression: str):
        self.module = module
        self.expression = expression
        self.lib = build(module)

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        from . import streams

        gx, bx = int(grid[0]), int(block[0])
        assert all(int(g) == 1 for g in grid[1:]) and all(int(b) == 1 for b in block[1:]), "1-D launches only"
        assert 1 <= bx <= 1024 and gx >= 1, (grid, block)
        vals = [_pack(a) for a in args]
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
        EmuKernel.log.append((self.module, self.expression, gx, bx))
        s = streams.get_current_stream() if stream is None else stream

        def run(args=args, vals=vals):  # the arrays and the packed values live until the launch has run
            rc = self.lib.emu_launch(self.expression.encode(), min(gx, MAX_EMULATED_BLOCKS), bx, ptrs)
            if rc:
                raise KeyError(f"{self.expression!r} has no trampoline in module {self.module!r}")
            first = ctypes.create_string_buffer(256)
            faults = self.lib.emu_faults(first, 256)
            if faults:
                raise AssertionError(
                    f"{self.expression}: {faults} misaligned accesses, which fault on a GPU; first: "
                    f"{first.value.decode()}"
                )

        s._enqueue(run, self.expression)


def function(module: str, expression: str) -> EmuKernel:
    from gear_flow.gpu import loader

    if expression not in loader.SOURCES[module].name_expressions:
        raise KeyError(f"{expression!r} is not instantiated in {module}")
    return EmuKernel(module, expression)


def _torch_stream(device_id: int):
    """torch's current CUDA stream, as the emulation sees it (``gear_flow.gpu.streams._torch_stream``).

    torch is CPU-only here, so the learner's reads of a batch are host reads: its stream is a
    :class:`~cuda_emu.streams.HostStream` (work queued on it runs at once, after what it waits
    for).  It is non-blocking, like the streams of torch's pool: the legacy default stream, on
    which inserts are issued, is ordered before the gathers issued on it by gear_flow's fences
    only, never implicitly.
    """
    from . import streams

    global _TORCH_STREAM
    if _TORCH_STREAM is None:
        _TORCH_STREAM = streams.HostStream()
    return SimpleNamespace(cuda_stream=_TORCH_STREAM.ptr)


_TORCH_STREAM = None


def _patches():
    """(object, attribute, value) for every replacement :func:`install` makes."""
    from gear_flow import backend
    from gear_flow.gpu import loader, streams

    from . import fake_cupy

    try:  # torch's first import walks sys.modules; it must not meet the fake there
        import torch  # noqa: F401
    except ImportError:
        pass
    return [
        (sys.modules, "cupy", fake_cupy),
        (loader, "function", function),
        (backend, "_cupy_status", lambda: None),
        # torch has no CUDA here: its "current stream" is the host, a stream whose work runs at once
        (streams, "_torch_stream", _torch_stream),
    ]


def install(monkeypatch) -> None:
    """Route ``import cupy`` to the fake, kernel launches to the emulator, torch's stream to the host
    (undone by monkeypatch)."""
    from gear_flow import backend

    for obj, name, value in _patches():
        if obj is sys.modules:
            monkeypatch.setitem(sys.modules, name, value)
        else:
            monkeypatch.setattr(obj, name, value)
    backend.gpu_available.cache_clear()


def install_in_process() -> None:
    """:func:`install` for good, in a process that runs only emulated GPU code (a Dask worker)."""
    from gear_flow import backend

    for obj, name, value in _patches():
        if obj is sys.modules:
            sys.modules[name] = value
        else:
            setattr(obj, name, value)
    backend.gpu_available.cache_clear()
