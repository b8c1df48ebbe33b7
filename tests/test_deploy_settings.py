"""The deploy helpers' settings: dashboard addresses checked and "no HTTP server" meaning the same everywhere,
``python -m gear_flow.deploy`` refusing a bad scheduler file or address in one line, and a caller's own
LocalCluster arguments added to gear_flow's instead of refused or replacing them."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from processes import cluster_env

from gear_flow.deploy.local import cuda_cluster_kwargs, local_cluster
from gear_flow.deploy.net import http_address, http_off
from gear_flow.errors import SpecError

pytestmark = pytest.mark.timeout(120)
PRELOAD, NO_HTTP = "gear_flow.distributed.preload", "gear_flow.deploy.no_http"


@pytest.mark.parametrize(
    "value, expected",
    [(None, "127.0.0.1:8787"), ("", "127.0.0.1:8787"), (":0", "127.0.0.1:0"), ("9000", "127.0.0.1:9000"),
     ("10.0.0.5:8787", "10.0.0.5:8787"), ("[::1]:8787", "[::1]:8787"), ("none", None), ("OFF", None),
     ("false", None), ("no", None)],
)  # fmt: skip
def test_dashboard_addresses_that_are_taken(value, expected):
    assert http_address(value, "127.0.0.1", 8787) == expected
    assert http_off(value) == (expected is None)


@pytest.mark.parametrize("value", [":abc", "99999", ":-1", "10.0.0.5:port", "::1:8787", ":", "host:"])
def test_malformed_dashboard_addresses_are_refused_in_one_line(value):
    """They came back as addresses (status 0 from the launch scripts' settings), and Dask then failed with a
    50-line traceback when the scheduler started."""
    with pytest.raises(SpecError, match=r"^dashboard address ") as e:
        http_address(value, "127.0.0.1", 8787)
    assert "\n" not in str(e.value)


def deploy(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gear_flow.deploy", *args], env=cluster_env(**env),
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize("word", ["none", "off", "false", "no"])
def test_every_word_for_no_dashboard_leaves_the_workers_without_http_too(word):
    """GEAR_FLOW_DASHBOARD=off (false, no) switched off the scheduler's HTTP server but not the workers'."""
    for role in ("scheduler", "worker"):
        r = deploy("--role", role, "--scheduler", "tcp://127.0.0.1:8786", GEAR_FLOW_DASHBOARD=word)
        assert r.returncode == 0, r.stderr
        assert "gf_dashboard=''" in r.stdout.splitlines(), (role, r.stdout)


@pytest.mark.parametrize(
    "text, message",
    [("", "is not Dask's JSON"), ("[1, 2]", "names no address"), ('{"address": 5}', "names no address")],
)
def test_a_bad_scheduler_file_or_address_is_one_line_with_status_2(tmp_path, text, message):
    """An empty scheduler file (Dask writes it in place: a worker starting beside the scheduler can read it so),
    one that is not a JSON object, and an address that cannot be parsed ended in a traceback and status 1, which
    cluster/env.sh reported as a Python without gear_flow."""
    f = tmp_path / "scheduler.json"
    f.write_text(text)
    cases = [
        (("--role", "worker"), {"GEAR_FLOW_SCHEDULER_FILE": str(f)}, message),
        (("--role", "worker", "--scheduler", "tcp://[::1:8786"), {}, "scheduler address 'tcp://[::1:8786'"),
        (
            ("--role", "client"),
            {"GEAR_FLOW_SCHEDULER_ADDRESS": "ucx://[::1", "GEAR_FLOW_PROTOCOL": "ucx"},
            "ucx://[::1",
        ),
        (("--role", "scheduler"), {"GEAR_FLOW_DASHBOARD": ":abc"}, "dashboard address ':abc'"),
    ]
    for args, env, expected in cases:
        r = deploy(*args, **env)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and expected in lines[0], (args, r.returncode, r.stderr)


def test_a_callers_preloads_and_scheduler_arguments_are_added_to_gear_flows():
    """local_cluster(scheduler_kwargs=..., preload=...) failed with "got multiple values", and
    cuda_cluster_kwargs took them in place of gear_flow's: a scheduler without its coordinator."""
    kw = cuda_cluster_kwargs(2, scheduler_kwargs={"http_prefix": "/dask", "preload": "mine"}, preload=["other"])
    assert kw["scheduler_kwargs"] == {"dashboard": True, "preload": [PRELOAD, "mine"], "http_prefix": "/dask"}
    assert kw["preload"] == [PRELOAD, "other"]
    assert cuda_cluster_kwargs(dashboard_address="none")["scheduler_kwargs"]["preload"] == [PRELOAD, NO_HTTP]


def test_a_local_cluster_with_no_dashboard_address_serves_no_http_and_takes_a_callers_arguments():
    """dashboard_address="none" (a documented value) served Dask's whole dashboard on 8787 (or another port);
    it now means no HTTP server, as GEAR_FLOW_DASHBOARD=none does.  The caller's scheduler argument and
    worker preload go in beside gear_flow's: its tables work."""
    from distributed import Client

    import gear_flow as gf

    with local_cluster(1, 1, dashboard_address="none", scheduler_kwargs={"http_prefix": "/dask"},
                       preload=["gear_flow.deploy.no_http"], memory_limit="1GB") as cluster:  # fmt: skip
        with Client(cluster) as client:
            port = client.scheduler_info()["services"]["dashboard"]  # (opened, then stopped by no_http)
            with pytest.raises(urllib.error.URLError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/dask/status", timeout=5)
            spec = gf.TableSpec((gf.ColumnSpec("x", ()),), capacity=10)
            with gf.DistributedTable.create(client, spec, seed=0) as t:
                t.insert({"x": [1.0, 2.0]})
                assert t.size == 2
