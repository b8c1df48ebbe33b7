"""Every user error of ``gear-flow`` is one line on stderr (what, why, what to do) with status 2,
in a real process: no traceback, no log noise, unless ``--debug``. The errors that need a live
cluster are in test_deploy_listeners.py; ``gear-flow local`` on a busy port is here."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest
from processes import Processes, cluster_env, free_port, listening, wait_for_line

from gear_flow import cli

pytestmark = pytest.mark.timeout(120)


def run(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "gear_flow", *map(str, args)], env=env or cluster_env(),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def one_line(r, command: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gear-flow {command}: "), r.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args, env, expected",
    [
        # a plain-TCP address in a shell that requires TLS (what `source cluster/env.sh` sets up)
        (["list", "--scheduler", "tcp://127.0.0.1:1"], {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"},
         "tcp://127.0.0.1:1 is not a TLS address, but this shell requires encryption"),
        (["create", "--scheduler", "tcp://127.0.0.1:1", "--columns", "obs:float33[4]", "--capacity", "10"], {},
         "SpecError: column 'obs': dtype 'float33' is not a numpy dtype; use one like float32"),
        (["create", "--scheduler", "tcp://127.0.0.1:1", "--obs-dim", "4", "--action-dtype", "float33",
          "--capacity", "10"], {}, "--action-dtype: dtype 'float33' is not a numpy dtype"),
        (["ingest", "--scheduler", "tcp://127.0.0.1:1", "--table", "t", "data/nowhere"], {},
         "data/nowhere does not exist on this machine: check the path; if only the workers see it (they read "
         "the files), pass --format minari|d4rl|parquet"),
        (["info", "--scheduler", "tcp://127.0.0.1:1", "--table", "t", "--timeout", "1s"], {},
         "cannot reach the scheduler at tcp://127.0.0.1:1 within 1 s"),
        (["create", "--spec", "missing.yaml"], {}, "table file missing.yaml does not exist"),
        (["local", "--workers", "-1"], {}, "argument --workers: -1 must be at least 1"),
        (["local", "--threads", "0"], {}, "argument --threads: 0 must be at least 1"),
        (["local", "--port", "70000"], {}, "argument --port: 70000 is not a port (0 for any free one, up to 65535)"),
        (["info", "--scheduler", "tcp://127.0.0.1:1"], {}, "the following arguments are required: --table"),
        # an empty host (an unset "$GEAR_FLOW_HOST") bound every listener to every interface
        (["local", "--host", "", "--port", "0"], {},
         "host '' must be an address of this machine (default 127.0.0.1); an empty one would listen on every "
         "interface: give 0.0.0.0 if that is meant"),
        # a malformed dashboard address met Dask's traceback ("unexpected RuntimeError")
        (["local", "--dashboard-address", ":abc", "--port", "0"], {},
         "dashboard address ':abc': port 'abc' must be a number from 0 to 65535"),
        # 192.0.2.1 (TEST-NET-1) is on no machine
        (["local", "--host", "192.0.2.1", "--port", "0"], {},
         "cannot listen on 192.0.2.1:0 (Cannot assign requested address): pass --host an address of this machine"),
    ],
)  # fmt: skip
def test_user_errors_are_one_line(args, env, expected, tmp_path):
    line = one_line(run(*args, env=cluster_env(**env)), args[0])
    assert expected in line, line


def test_debug_shows_the_traceback():
    r = run("create", "--debug", "--scheduler", "tcp://127.0.0.1:1", "--columns", "obs:float33", "--capacity", "1")
    assert r.returncode == 1 and "Traceback" in r.stderr and "SpecError" in r.stderr


def test_explain_finds_the_cause_in_a_chain():
    try:
        try:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        except OSError as e:
            raise RuntimeError("Cluster failed to start") from e
    except RuntimeError as e:
        assert cli.explain(e).startswith("an address is already in use ([Errno 98] Address already in use)")
    assert cli.explain(KeyError("x")) == "unexpected KeyError: 'x' (rerun with --debug for the traceback)"


def test_gear_flow_local_listens_on_its_host_and_reports_a_busy_port(tmp_path):
    """Defaults of `gear-flow local` (dashboard on): every listener on 127.0.0.1; a second one on the
    same port says so in one line."""
    port = free_port()
    procs = Processes(tmp_path)
    with procs:
        p = procs.start("local", [sys.executable, "-m", "gear_flow", "local", "--workers", "1", "--threads", "1",
                                  "--port", str(port), "--dashboard-address", ":0", "--memory-limit", "1GB"],
                        cluster_env())  # fmt: skip
        m = wait_for_line(tmp_path / "local.log", r"dashboard at (\S+)", p)
        assert m[1].startswith("http://127.0.0.1:"), m[1]
        wait_for_line(tmp_path / "local.log", r"Ctrl-C stops it", p)
        socks = listening(procs.group_members())
        assert {ip for ip, _ in socks} == {"127.0.0.1"} and len(socks) >= 5, socks  # + 2 HTTP servers
        line = one_line(run("local", "--port", port, "--workers", "1"), "local")
        assert line == (f"gear-flow local: scheduler port {port} on 127.0.0.1 is already in use (another gear-flow "
                        "local or Dask scheduler?): stop it, or pass --port 0 for any free port")  # fmt: skip
