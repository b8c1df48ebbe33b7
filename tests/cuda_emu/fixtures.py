"""pytest fixtures of the CUDA emulation; bind them in a test module by name.

Examples
--------
In ``tests/test_something.py`` (an assignment rather than an import, so that the
test parameters of the same name do not shadow an import)::

    from cuda_emu import fixtures

    emulated = fixtures.emulated        # cupy is the fake in this process
    emu_cluster = fixtures.emu_cluster  # a Client of 2 emulated worker processes

    def test_device_tier(emulated):
        ...

    def test_on_workers(emu_cluster):
        emu_cluster.run(...)
"""

from __future__ import annotations

import pytest

from . import compiler, install


@pytest.fixture
def emulated(monkeypatch):
    """The emulation installed in this process for one test; yields the fake ``cupy`` module.

    ``import cupy`` returns it, kernel launches run the host build of
    ``kernels/*.cu``, torch's stream is the host (see :mod:`cuda_emu.streams`).
    After the test, every stream's queued work runs (its errors fail this test's teardown), then
    the installation is undone.
    """
    if compiler() is None:
        pytest.skip("no C++ compiler for the CUDA emulation")
    install(monkeypatch)
    from . import fake_cupy, streams

    yield fake_cupy
    # work the test left queued runs now: an error in it belongs to this test, not to the next one
    streams.synchronize_device()


@pytest.fixture(scope="module")
def emu_cluster():
    """A :class:`distributed.Client` of a 2-worker ``LocalCluster(processes=True)`` on 127.0.0.1 whose
    workers run under the CUDA emulation.

    Each worker process loads :mod:`cuda_emu.preload` (``--preload``) before any task: in that
    process ``import cupy`` returns the fake, gear_flow's kernel loader runs the host build of the
    kernels, and ``gear_flow.storage.get_tier("device")`` / ``"pinned"`` work, so a test (or a
    ``DistributedTable``) can put GPU-tier shards on the workers::

        def test_distributed_on_device_tier(emu_cluster):
            table = DistributedTable.create(emu_cluster, spec, tier="device")
            ...

        def on_worker():  # runs in a worker: the emulation is there
            import cupy
            return cupy.__version__        # "emulated"

        assert set(emu_cluster.run(on_worker).values()) == {"emulated"}

    The client process itself is *not* emulated (use the ``emulated`` fixture in the test as
    well if it needs CuPy locally).  Fake device arrays that cross the comm travel pickled, as
    host copies (``ndarray.__reduce__`` calls ``get()``): distributed's CuPy serializers
    (``distributed.protocol.cupy``, device frames over UCX) are registered for ``cupy.ndarray``
    and never see the fake, so this checks what reaches the other side, not how it travels.

    The workers find ``cuda_emu`` and this checkout's gear_flow through ``PYTHONPATH`` (set here
    to the tests folder and the repository root, ahead of the inherited value).  One cluster per
    test module (``scope="module"``), 1 thread per worker; for another shape,
    ``with cuda_emu.preload.emulated_local_cluster(n_workers=3, threads_per_worker=2) as client:``
    (extra keywords go to ``LocalCluster``).
    """
    if compiler() is None:
        pytest.skip("no C++ compiler for the CUDA emulation")
    from .preload import emulated_local_cluster

    with emulated_local_cluster(n_workers=2) as client:
        yield client
