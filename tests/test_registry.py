"""Selectors and rate limiters of one's own, registered once and usable everywhere; limiters per table.

Also: ``gear_flow.DistributedTable`` is importable from the package, lazily.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from custom_parts import FlooredPrioritized, Late, WarmUp
from helpers import episode, make_spec, registered_kinds

import gear_flow as gf
from gear_flow.registry import custom, register_rate_limiter, register_selector


@pytest.fixture(autouse=True, scope="module")
def registered():
    with registered_kinds({"floored_prioritized": FlooredPrioritized}, {"warm_up": WarmUp}):
        yield


def test_distributed_table_from_the_package_lazily():
    code = (
        "import sys, gear_flow as gf\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('distributed', 'torch', 'bokeh')], 'eager'\n"
        "from gear_flow.distributed import DistributedTable\n"
        "assert gf.DistributedTable is DistributedTable and 'DistributedTable' in dir(gf)\n"
        "assert gf.GearFlowDashboard.__name__ == 'GearFlowDashboard'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    doc = subprocess.run(
        [sys.executable, "-m", "pydoc", "gear_flow.DistributedTable"], capture_output=True, text=True, timeout=120
    ).stdout
    assert "Help on class DistributedTable" in doc and "update_priorities(" in doc
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        gf.Nope  # noqa: B018


def test_registration_errors():
    register_selector("floored_prioritized", FlooredPrioritized)  # the same again: a no-op
    with pytest.raises(gf.SpecError, match="already registered"):
        register_selector("floored_prioritized", gf.Prioritized)
    with pytest.raises(gf.SpecError, match="already registered"):
        register_selector("uniform", Late)
    with pytest.raises(gf.SpecError, match="not a concrete Selector subclass"):
        register_selector("wrong_family", WarmUp)
    with pytest.raises(gf.SpecError, match="lower-case"):
        register_rate_limiter("Warm Up", WarmUp)

    class Local(gf.Uniform):
        pass

    with pytest.raises(gf.SpecError, match="inside a function"):
        register_selector("local_one", Local)
    assert custom()["selector"] == {"floored_prioritized": FlooredPrioritized}


def test_custom_parts_in_a_local_table_and_its_checkpoint(tmp_path):
    t = gf.LocalTable(make_spec(capacity=64), sampler=FlooredPrioritized(floor=0.5), rate_limiter=WarmUp(10))
    t.insert([episode(1, 8)], priorities=np.zeros(8))
    with pytest.raises(gf.RateLimitTimeout):
        t.sample(2, 1, timeout=0)  # 8 < 10: the custom limiter holds samples back
    t.insert([episode(2, 8)], priorities=np.zeros(8))
    b = t.sample(16, 1)  # every priority is 0: only the floor makes them drawable
    assert np.allclose(b.probabilities.numpy(), 1 / 16)
    t.checkpoint(tmp_path / "ck")
    r = gf.LocalTable.restore(tmp_path / "ck")
    assert type(r.sampler_proto) is FlooredPrioritized and r.sampler_proto.floor == 0.5
    assert type(r.rate_limiter) is WarmUp and r.rate_limiter.min_size_to_sample == 10
    assert np.allclose(r.sample(4, 1).probabilities.numpy(), 1 / 16)


def test_custom_parts_in_a_distributed_table(dist_client, tmp_path):
    from gear_flow.registry_share import share

    assert share(dist_client)
    t = gf.DistributedTable.create(
        dist_client, make_spec(capacity=64, num_shards=2), sampler=FlooredPrioritized(floor=2.0), rate_limiter=WarmUp(6)
    )
    try:
        t.insert([episode(1, 4)], priorities=np.zeros(4))
        with pytest.raises(gf.RateLimitTimeout):
            t.sample(2, 1, timeout=0)  # the coordinator's limiter is a WarmUp rebuilt on the scheduler
        t.insert([episode(2, 4)], priorities=np.zeros(4))
        b = t.sample(8, 1)  # drawn on the workers by FlooredPrioritized
        assert np.allclose(b.probabilities.numpy(), 1 / 8)
        assert t.info()["rate_limiter"]["kind"] == "WarmUp"
        t.checkpoint(tmp_path / "ck")
    finally:
        t.close()
    r = gf.DistributedTable.restore(dist_client, tmp_path / "ck")
    try:
        assert r.config.sampler.params() == {"alpha": 1.0, "beta": 0.0, "floor": 2.0}
        assert np.allclose(r.sample(4, 1).probabilities.numpy(), 1 / 8)
    finally:
        r.close()


def test_distributed_create_shares_registrations_itself(dist_client):
    with registered_kinds({"late": Late}):  # after the cluster got the other registrations
        t = gf.DistributedTable.create(dist_client, make_spec(capacity=32, num_shards=2), sampler=Late())
        try:
            t.insert([episode(1, 4)])
            assert len(t.sample(4, 1)) == 4
        finally:
            t.close()


def _tables_on_cluster(client) -> tuple:
    def coordinator(dask_scheduler):
        p = dask_scheduler.plugins.get("gear-flow-coordinator")
        return sorted(n for n, g in p.tables.items() if not g.closed) if p is not None else []

    def worker(dask_worker):
        p = dask_worker.plugins.get("gear-flow")
        return sorted(p.host.tables) if p is not None else []

    return client.run_on_scheduler(coordinator), sorted(set().union(*client.run(worker).values()))


def test_a_distributed_restore_this_process_cannot_build_leaves_nothing_on_the_cluster(dist_client, tmp_path):
    """A checkpoint of a table with a part that a restoring process has not registered (the cluster has, from
    another client): the restore built the table on the coordinator and every worker, then failed building
    the handle there (unknown kind) and left the table on the cluster, its name refused to a retry.  The
    configuration is now built by the restoring process first: refused before the cluster builds anything."""
    with registered_kinds({"late": Late}):
        t = gf.DistributedTable.create(dist_client, make_spec(capacity=32, num_shards=2), sampler=Late())
        t.insert([episode(1, 4)])
        t.checkpoint(tmp_path / "ck")
        t.close()
        before = _tables_on_cluster(dist_client)
        child = (  # a client of its own, without the registration
            "import sys, gear_flow as gf\nfrom distributed import Client\n"
            "with Client(sys.argv[1]) as c:\n"
            "    try:\n        gf.DistributedTable.restore(c, sys.argv[2], name='cannot-build')\n"
            "    except gf.errors.SpecError as e:\n        print('refused:', e)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", child, dist_client.scheduler.address, str(tmp_path / "ck")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert "refused: unknown selector kind 'late'" in out.stdout, out.stdout + out.stderr[-2000:]
        assert _tables_on_cluster(dist_client) == before and "cannot-build" not in before[0]
        r = gf.DistributedTable.restore(dist_client, tmp_path / "ck", name="cannot-build")  # the name is free
        assert r.size == 4
        r.close()


class _NoBeta(gf.Prioritized):
    """params() name beta (Prioritized's), the constructor takes none."""

    def __init__(self, alpha=0.9):
        super().__init__(alpha, 0.4)


class _NotJson(gf.Prioritized):
    def __init__(self, alpha=0.9, beta=0.4, extra=None):
        super().__init__(alpha, beta)
        self.extra = np.float32(1.5) if extra is None else extra

    def params(self):
        return {**super().params(), "extra": self.extra}


@pytest.mark.parametrize("part", [_NoBeta, _NotJson])
def test_a_part_its_own_params_cannot_rebuild_is_refused_before_anything_is_made(part, tmp_path, dist_client):
    """Each shard gets ``type(part)(**part.params())``, and checkpoints and distributed tables carry the params
    as JSON: a subclass whose params() were not its constructor's arguments failed with a bare TypeError while
    the shards were built (a disk table's files half made), params that were not JSON at the first checkpoint,
    naming neither.  Refused at once, naming the part, on every table, nothing made."""
    match = rf"sampler {part.__name__}: its params\(\) must be JSON-able keyword arguments"
    before = _tables_on_cluster(dist_client)  # (other tests' tables may be there)
    with pytest.raises(gf.errors.SpecError, match=match):
        gf.LocalTable(make_spec(capacity=32), sampler=part())
    with pytest.raises(gf.errors.SpecError, match=match):
        gf.LocalTable(make_spec(capacity=32), sampler=part(), tier="disk", path=tmp_path / "t")
    assert not (tmp_path / "t").exists()
    with pytest.raises(gf.errors.SpecError, match=match):
        gf.DistributedTable.create(dist_client, make_spec(capacity=32, num_shards=2), sampler=part())
    assert _tables_on_cluster(dist_client) == before


def test_a_part_the_cluster_cannot_import_is_refused_naming_it(dist_client, tmp_path, monkeypatch):
    """Registered classes travel to the scheduler and workers by reference: one whose module only this process
    can import failed inside Dask's plugin registration with a bare Exception(ModuleNotFoundError) and logged
    tracebacks.  It is refused naming the class and where it cannot be imported, nothing sent or built."""
    (tmp_path / "only_here.py").write_text("import gear_flow as gf\n\nclass Hidden(gf.Uniform):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here

    before = _tables_on_cluster(dist_client)
    with registered_kinds({"hidden": only_here.Hidden}):
        with pytest.raises(
            gf.errors.SpecError, match=r"\['only_here.Hidden'\] cannot be imported on (the scheduler|tcp://)"
        ):
            gf.DistributedTable.create(dist_client, make_spec(capacity=32, num_shards=2), sampler=only_here.Hidden())
    assert _tables_on_cluster(dist_client) == before


def test_a_limiter_given_to_two_tables_counts_for_each():
    lim = gf.SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=2, error_buffer=4)
    a = gf.LocalTable(make_spec(capacity=64), rate_limiter=lim)
    b = gf.LocalTable(make_spec(capacity=64), rate_limiter=lim)
    a.insert([episode(1, 6)])
    assert b.rate_limiter.state.inserts == 0 and lim.state.inserts == 0
    b.insert([episode(2, 2)])
    b.sample(2, 1, timeout=0)
    # a's own counters: 6 inserts, no samples, whatever b did
    assert (a.rate_limiter.state.inserts, a.rate_limiter.state.samples) == (6, 0)
    assert a.info()["rate_limiter"]["samples"] == 0


def test_nbytes_of_a_distributed_table_matches_a_local_one(dist_client):
    from gear_flow.distributed import info

    spec = make_spec(capacity=64, num_shards=2)
    local = gf.LocalTable(spec)
    t = gf.DistributedTable.create(dist_client, spec)
    try:
        for table in (local, t):
            table.insert([episode(1, 5), episode(2, 7)])
        assert t.client.sync(info.nbytes_async, t) == local.nbytes() and local.nbytes()["data"] > 0
        assert t.nbytes() == local.nbytes()
    finally:
        t.close()
