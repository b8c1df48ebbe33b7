"""Real processes for the cluster and deployment tests: each started in its own session (process
group), logged to a file, stopped in a ``finally``; and what they listen on, read from their sockets."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"


def free_port() -> int:
    """A port free on 127.0.0.1 below the kernel's ephemeral range: a port the kernel handed out (a bind to
    port 0) could go to another process's bind to port 0 (a test's LocalCluster) before the process told of
    it binds it ("Address already in use", a scheduler of the launch scripts that did not start)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(min(10_000, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below {low} on 127.0.0.1")


class Processes:
    """Processes started in their own session (process group); ``stop()`` ends every group."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, name: str, cmd: list[str], env: dict) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        f = open(log, "w")
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=self.tmp)  # fmt: skip
        f.close()
        self.procs.append((p, log))
        return p

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Print the logs if the block failed; stop every group; none may be left behind."""
        if exc_type is not None:
            print(self.logs())
        self.stop()
        if exc_type is None:
            assert not self.group_members(), "processes left behind"

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in self.procs if log.exists())

    def group_members(self) -> list[psutil.Process]:
        pgids = {p.pid for p, _ in self.procs}
        out = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) in pgids and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except (ProcessLookupError, psutil.Error):
                pass
        return out

    def stop(self, grace: float = 20.0) -> None:
        for p, _ in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while self.group_members() and time.monotonic() < deadline:
            for p, _ in self.procs:
                p.poll()
            time.sleep(0.2)
        for p, _ in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
        # a worker ended by a signal leaves its shared segments and lane directory, as after a crash; the next
        # worker on the machine sweeps them (gear_flow.storage.shared.sweep), and so does this, so that the
        # suite's check for leftovers does not depend on another test starting a worker after this one
        from gear_flow.storage.shared import sweep

        sweep()


def cluster_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "GEAR_FLOW_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def launch_env(tmp: Path, protocol: str) -> tuple[dict, str]:
    """Environment for the launch scripts of a one-machine cluster (a copy of the shipped config, no
    GEAR_FLOW_HOST, dashboards on a free port since 8787 may be taken) and its scheduler address."""
    port = free_port()
    (tmp / "config").mkdir()
    (tmp / "config" / "gear-flow.yaml").write_text((CLUSTER / "config" / "gear-flow.yaml").read_text())
    env = cluster_env(DASK_CONFIG=tmp / "config", GEAR_FLOW_PROTOCOL=protocol, GEAR_FLOW_SCHEDULER_PORT=port,
                      GEAR_FLOW_DASHBOARD=":0", GEAR_FLOW_MEMORY_LIMIT="1GB", GEAR_FLOW_NTHREADS=1,
                      GEAR_FLOW_LOCAL_DIRECTORY=tmp / "scratch")  # fmt: skip
    return env, f"{protocol}://127.0.0.1:{port}"


def gear_flow_cli(*args, env, timeout=60) -> str:
    r = subprocess.run([sys.executable, "-m", "gear_flow", *map(str, args)], env=env, capture_output=True,
                       text=True, timeout=timeout)  # fmt: skip
    assert r.returncode == 0, f"gear-flow {args[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def listening(procs: list[psutil.Process]) -> set[tuple[str, int]]:
    """Every (address, port) the processes listen on (TCP, IPv4 and IPv6), from their own sockets."""
    out = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="inet") if hasattr(p, "net_connections") else p.connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        out |= {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return out


def workers_of(client) -> dict:
    """The scheduler's workers, asked directly: ``scheduler_info()`` hands back its cached identity,
    which has no workers, when the request fails with an OSError (a loaded machine)."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def port_of(address: str) -> int:
    """The port of a Dask address (``tls://127.0.0.1:8786``)."""
    return int(address.rsplit(":", 1)[1])


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = 60) -> re.Match:
    """The first match of ``pattern`` in a log as it is written (fails if the process ends first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text() if log.exists() else "")
        if m:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not in {log.name} (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
