"""cluster/: the Dask config file, the launch scripts' commands (dry run, parsed by the real
``dask scheduler`` / ``dask worker`` / ``dask cuda worker`` option parsers), the SLURM job scripts of
dask-jobqueue, the TLS certificate maker and the preload's settings."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
from pathlib import Path

import dask.config
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
sys.path.insert(0, str(CLUSTER / "tls"))
import make_certs  # noqa: E402

#: `dask cuda worker` options of dask-cuda 26.10 (the RAPIDS release of the gpu extras), for machines
#: without dask-cuda; where it is installed its own parser checks the commands instead
CUDA_WORKER_FLAGS = {
    "--dashboard", "--no-dashboard", "--enable-cudf-spill", "--disable-cudf-spill", "--enable-infiniband",
    "--disable-infiniband", "--enable-nvlink", "--disable-nvlink", "--enable-rdmacm", "--disable-rdmacm",
    "--enable-tcp-over-ucx", "--disable-tcp-over-ucx", "--rmm-async", "--no-rmm-async", "--rmm-managed-memory",
    "--no-rmm-managed-memory", "--rmm-track-allocations", "--no-rmm-track-allocations",
}  # fmt: skip
CUDA_WORKER_VALUES = {
    "--contact-address", "--cudf-spill-stats", "--dashboard-address", "--dashboard-prefix", "--death-timeout",
    "--device-memory-limit", "--host", "--interface", "--listen-address", "--local-directory", "--memory-limit",
    "--multiprocessing-method", "--name", "--nthreads", "--pid-file", "--pre-import", "--preload", "--protocol",
    "--resources", "--rmm-log-directory", "--rmm-maximum-pool-size", "--rmm-pool-size", "--rmm-release-threshold",
    "--scheduler-file", "--set-rmm-allocator-for-libs", "--tls-ca-file", "--tls-cert", "--tls-key",
    "--worker-class", "--worker-port",
}  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    make_certs.make_certs(out)
    return out


# -- parsing commands with the real option parsers ------------------------------------------------
def parse_scheduler(args):
    from distributed.cli.dask_scheduler import main

    return main.make_context("dask scheduler", list(args)).params


def parse_worker(args):
    from distributed.cli.dask_worker import main

    return main.make_context("dask worker", list(args)).params


def parse_cuda_worker(args) -> dict:
    if _importable("dask_cuda"):
        from dask_cuda.cli import worker

        return worker.make_context("dask cuda worker", list(args)).params
    params, it = {"scheduler": None}, iter(args)
    for a in it:
        if not a.startswith("-") and params["scheduler"] is None:
            params["scheduler"] = a
        elif a in CUDA_WORKER_FLAGS:
            params[a.lstrip("-").replace("-", "_")] = True
        elif a == "--preload":  # repeatable, as in dask-cuda
            params["preload"] = params.get("preload", ()) + (next(it),)
        elif a in CUDA_WORKER_VALUES:
            params[a.lstrip("-").replace("-", "_")] = next(it)
        else:
            raise AssertionError(f"`dask cuda worker` (dask-cuda 26.10) has no option {a!r}: {args}")
    return params


def dry_run(script, *args, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "GEAR_FLOW_"))}
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")  # gear_flow's Python
    e.update({k: str(v) for k, v in env.items()})
    r = subprocess.run(["bash", str(CLUSTER / script), "--dry-run", *map(str, args)], env=e, capture_output=True,
                       text=True, timeout=30)  # fmt: skip
    return r


def command(r) -> tuple[dict, list[str]]:
    """(the environment it sets, the command) of a --dry-run: ``DASK_CONFIG=... [VAR=...] dask ...``."""
    assert r.returncode == 0, r.stderr
    words = shlex.split(r.stdout)
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert "DASK_CONFIG" in env, r.stdout
    return env, words


# -- the config file ------------------------------------------------------------------------------
def _leaves(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, prefix + (k,))
        else:
            yield prefix + (k,)


def _has(tree, path) -> bool:
    for p in path:
        if not isinstance(tree, dict):
            return False
        keys = {k.replace("_", "-"): k for k in tree}
        if p.replace("_", "-") not in keys:
            return False
        tree = tree[keys[p.replace("_", "-")]]
    return True


def test_every_key_of_the_cluster_config_exists_in_the_defaults():
    import distributed  # noqa: F401  (loads its defaults)

    import gear_flow.config  # noqa: F401
    from gear_flow.distributed.preload import SETTINGS

    defaults = {}
    for d in dask.config.defaults:
        dask.config.update(defaults, d, priority="old")
    ucxx = importlib.util.find_spec("distributed_ucxx")  # its defaults, without importing UCX
    if ucxx is not None:
        text = (Path(ucxx.origin).parent / "distributed-ucxx.yaml").read_text()
        dask.config.update(defaults, yaml.safe_load(text), priority="old")
    for key in SETTINGS:
        dask.config.update(defaults, _nest(key.split("."), None), priority="old")
    cfg = yaml.safe_load((CLUSTER / "config" / "gear-flow.yaml").read_text())
    unknown = [".".join(p) for p in _leaves(cfg) if not _has(defaults, p)]
    if ucxx is None:
        unknown = [u for u in unknown if not u.startswith("distributed-ucxx.")]
    assert not unknown, f"keys in cluster/config/gear-flow.yaml that no package defines (typos?): {unknown}"


def _importable(mod) -> bool:
    return importlib.util.find_spec(mod) is not None


def _nest(path, value):
    return {path[0]: _nest(path[1:], value)} if path else value


def test_cluster_config_values_are_valid_and_reach_a_process():
    from gear_flow.table.routing import ROUTINGS

    cfg = yaml.safe_load((CLUSTER / "config" / "gear-flow.yaml").read_text())["gear-flow"]
    assert cfg["table"]["boundary"] in ("strict", "pad_tail", "pad_head")
    assert cfg["table"]["tier"] in ("host", "pinned", "device")
    assert cfg["table"]["routing"] in ROUTINGS
    code = ("import dask.config, distributed, gear_flow.config as c; from gear_flow.distributed.preload import "
            "worker_plugin; p = worker_plugin(); print(dask.config.get('distributed.worker.preload'), "
            "dask.config.get('distributed.scheduler.preload'), c.get('table.timeout'), p.threads)")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    r = subprocess.run([sys.executable, "-c", code], env={**env, "DASK_CONFIG": str(CLUSTER / "config")},
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    pre = "['gear_flow.distributed.preload']"
    assert r.stdout.split() == [pre, pre, str(cfg["table"]["timeout"]), str(cfg["worker"]["threads"])]


def test_preload_settings_are_validated():
    from gear_flow.distributed.preload import worker_plugin

    with dask.config.set({"gear-flow.worker.threads": 3, "gear-flow.worker.tier": "pinned"}):
        p = worker_plugin()
        assert (p.threads, p.tier) == (3, "pinned")
    with dask.config.set({"gear-flow.worker.threads": 0}), pytest.raises(ValueError, match="threads"):
        worker_plugin()
    with dask.config.set({"gear-flow.worker.tier": "gpu"}), pytest.raises(ValueError, match="tier"):
        worker_plugin()


# -- launch scripts -------------------------------------------------------------------------------
def test_scheduler_script_commands(certs):
    env, cmd = command(dry_run("start-scheduler.sh", GEAR_FLOW_TLS_DIR=certs, GEAR_FLOW_SCHEDULER_PORT=9786))
    assert env["DASK_CONFIG"] == str(CLUSTER / "config") and cmd[:2] == ["dask", "scheduler"]
    p = parse_scheduler(cmd[2:])
    assert (p["protocol"], str(p["port"]), p["preload"]) == ("tls", "9786", ("gear_flow.distributed.preload",))
    assert (p["tls_ca_file"], p["tls_cert"]) == (str(certs / "ca.pem"), str(certs / "scheduler.pem"))
    # without certificates: plain TCP, and the dashboard can be turned off
    _, cmd = command(dry_run("start-scheduler.sh", "--", "--idle-timeout", "1h", GEAR_FLOW_TLS_DIR="/nonexistent",
                             GEAR_FLOW_DASHBOARD="none"))  # fmt: skip
    p = parse_scheduler(cmd[2:])
    assert (p["protocol"], p["tls_ca_file"], p["dashboard"], p["idle_timeout"]) == ("tcp", None, False, "1h")
    r = dry_run("start-scheduler.sh", GEAR_FLOW_PROTOCOL="tls", GEAR_FLOW_TLS_DIR="/nonexistent")
    assert r.returncode == 2 and "make_certs.py" in r.stderr


def test_cpu_worker_script_commands(certs):
    _, cmd = command(dry_run("start-worker.sh", "--kind", "cpu", "tls://10.0.0.5:8786", "--", "--no-nanny",
                             GEAR_FLOW_TLS_DIR=certs, GEAR_FLOW_NWORKERS=2, GEAR_FLOW_INTERFACE="ib0"))  # fmt: skip
    assert cmd[:2] == ["dask", "worker"]
    p = parse_worker(cmd[2:])
    assert p["scheduler"] == "tls://10.0.0.5:8786" and p["preload"] == ("gear_flow.distributed.preload",)
    assert (p["resources"], p["n_workers"], p["interface"], p["nanny"]) == ("replay=1,learner=1", "2", "ib0", False)
    assert (p["tls_cert"], p["tls_key"]) == (str(certs / "worker.pem"), str(certs / "worker-key.pem"))
    # the scheduler from the environment or a scheduler file; without either, a clear error
    _, cmd = command(dry_run("start-worker.sh", "--kind=cpu", GEAR_FLOW_SCHEDULER_FILE="/shared/s.json"))
    assert parse_worker(cmd[2:])["scheduler_file"] == "/shared/s.json"
    r = dry_run("start-worker.sh", "--kind", "cpu")
    assert r.returncode == 2 and "no scheduler" in r.stderr
    r = dry_run("start-worker.sh", "--kind", "tpu", "tcp://x:1")
    assert r.returncode == 2 and "--kind" in r.stderr


def test_gpu_worker_script_commands(certs):
    """The GPU launch path: `dask cuda worker` with the preload, resources, RMM pool, TLS or UCX."""
    _, cmd = command(dry_run("start-worker.sh", "--kind", "gpu", "tls://10.0.0.5:8786", GEAR_FLOW_TLS_DIR=certs,
                             GEAR_FLOW_RMM_POOL_SIZE="0.8"))  # fmt: skip
    assert cmd[:3] == ["dask", "cuda", "worker"]
    p = parse_cuda_worker(cmd[3:])
    assert p["scheduler"] == "tls://10.0.0.5:8786" and "gear_flow.distributed.preload" in str(p["preload"])
    assert (p["resources"], p["rmm_pool_size"], p["protocol"]) == ("replay=1,learner=1", "0.8", "tls")
    assert p["tls_cert"] == str(certs / "worker.pem")
    _, cmd = command(dry_run("start-worker.sh", "--kind", "gpu", "ucx://10.0.0.5:8786", GEAR_FLOW_PROTOCOL="ucx",
                             GEAR_FLOW_UCX_TRANSPORTS="nvlink,infiniband,rdmacm", GEAR_FLOW_INTERFACE="ib0"))  # fmt: skip
    p = parse_cuda_worker(cmd[3:])
    assert p["protocol"] == "ucx" and p["interface"] == "ib0" and "tls_cert" not in {k for k, v in p.items() if v}
    assert p["enable_nvlink"] and p["enable_infiniband"] and p["enable_rdmacm"]
    # auto picks cpu where nvidia-smi lists no GPU
    if not shutil.which("nvidia-smi"):
        _, cmd = command(dry_run("start-worker.sh", "tcp://x:8786"))
        assert cmd[:2] == ["dask", "worker"]


def test_every_listener_is_bound_to_one_address():
    """Scheduler, workers and their dashboards on GEAR_FLOW_HOST (default: loopback for the scheduler, the
    address reaching the scheduler for workers); "none" is no HTTP server at all."""
    _, cmd = command(dry_run("start-scheduler.sh", GEAR_FLOW_TLS_DIR="/nonexistent", GEAR_FLOW_HOST="10.0.0.5"))
    p = parse_scheduler(cmd[2:])
    assert (p["host"], p["dashboard_address"]) == ("10.0.0.5", "10.0.0.5:8787")
    r = dry_run("start-scheduler.sh", GEAR_FLOW_TLS_DIR="/nonexistent")
    p = parse_scheduler(command(r)[1][2:])
    assert (p["host"], p["dashboard_address"]) == ("127.0.0.1", "127.0.0.1:8787")
    assert "listening on 127.0.0.1 only (GEAR_FLOW_HOST is not set)" in r.stderr
    _, cmd = command(dry_run("start-scheduler.sh", GEAR_FLOW_TLS_DIR="/nonexistent", GEAR_FLOW_HOST="0.0.0.0",
                             GEAR_FLOW_DASHBOARD=":9000"))  # fmt: skip
    assert parse_scheduler(cmd[2:])["dashboard_address"] == "0.0.0.0:9000"  # every interface, when asked
    _, cmd = command(dry_run("start-scheduler.sh", GEAR_FLOW_TLS_DIR="/nonexistent", GEAR_FLOW_INTERFACE="lo"))
    p = parse_scheduler(cmd[2:])
    assert (p["interface"], p["host"], p["dashboard_address"]) == ("lo", "", "127.0.0.1:8787")
    for script, args in (("start-scheduler.sh", []), ("start-worker.sh", ["--kind", "cpu", "tcp://127.0.0.1:1"])):
        _, cmd = command(dry_run(script, *args, GEAR_FLOW_TLS_DIR="/nonexistent", GEAR_FLOW_DASHBOARD="none"))
        p = (parse_scheduler if script == "start-scheduler.sh" else parse_worker)(cmd[2:])
        assert p["dashboard"] is False and "gear_flow.deploy.no_http" in p["preload"], cmd
    _, cmd = command(dry_run("start-worker.sh", "--kind", "cpu", "tcp://127.0.0.1:1", GEAR_FLOW_TLS_DIR="/x"))
    p = parse_worker(cmd[2:])
    assert (p["host"], p["dashboard_address"]) == ("127.0.0.1", "127.0.0.1:0")
    _, cmd = command(dry_run("start-worker.sh", "--kind", "gpu", "tcp://127.0.0.1:1", GEAR_FLOW_TLS_DIR="/x",
                             GEAR_FLOW_HOST="10.0.0.7"))  # fmt: skip
    p = parse_cuda_worker(cmd[3:])
    assert (p["host"], p["dashboard_address"]) == ("10.0.0.7", "10.0.0.7:0")
    # an interface this machine lacks: a dry run shows a placeholder (the command is for another node)
    r = dry_run("start-worker.sh", "--kind", "cpu", "tcp://127.0.0.1:1", GEAR_FLOW_INTERFACE="nope0")
    assert "network interface 'nope0' does not exist" in r.stderr
    assert parse_worker(command(r)[1][2:])["dashboard_address"] == "ADDRESS_OF_THIS_NODE:0"


def test_ucx_settings_follow_the_node():
    """No CUDA context without a GPU (it crashes a CPU-only scheduler), loopback devices for a loopback
    deployment; values set by the user are kept."""
    from gear_flow.deploy.gpu import has_gpu
    from gear_flow.deploy.ucx import ucx_environment

    env, cmd = command(dry_run("start-scheduler.sh", GEAR_FLOW_PROTOCOL="ucx"))
    assert env["DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT"] == str(has_gpu())
    assert env["UCX_NET_DEVICES"] == "lo" and parse_scheduler(cmd[2:])["protocol"] == "ucx"
    env, _ = command(dry_run("start-worker.sh", "--kind", "cpu", "ucx://10.0.0.5:8786", GEAR_FLOW_PROTOCOL="ucx",
                             GEAR_FLOW_HOST="10.0.0.6", DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT="True"))  # fmt: skip
    assert "UCX_NET_DEVICES" not in env and "DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT" not in env  # kept as set
    assert ucx_environment("127.0.0.1", gpu=True, environ={}) == {
        "DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT": "True", "UCX_NET_DEVICES": "lo"
    }  # fmt: skip
    assert ucx_environment("10.0.0.5", gpu=False, environ={"UCX_NET_DEVICES": "mlx5_0:1"}) == {
        "DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT": "False"
    }
    cfg = yaml.safe_load((CLUSTER / "config" / "gear-flow.yaml").read_text())
    assert cfg["distributed-ucxx"]["create-cuda-context"] is None  # decided per node, not in the shared file


def test_clients_need_only_the_client_certificate(certs, tmp_path):
    """A client machine holds ca.pem, client.pem and client-key.pem, never the scheduler's or workers' keys."""
    client_only = tmp_path / "client-certs"
    client_only.mkdir()
    for f in ("ca.pem", "client.pem", "client-key.pem"):
        shutil.copy(certs / f, client_only / f)
    code = "from distributed import Security; s = Security(); print(s.require_encryption, s.tls_client_cert, s.tls_worker_key)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "GEAR_FLOW_"))}
    r = subprocess.run(["bash", "-c", f"source {CLUSTER / 'env.sh'} && {shlex.quote(sys.executable)} -c '{code}'"],
                       env={**env, "GEAR_FLOW_TLS_DIR": str(client_only)}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", str(client_only / "client.pem"), "None"]
    # a worker node without its key: the launch script says which file is missing
    r = dry_run("start-worker.sh", "--kind", "cpu", "tls://10.0.0.5:8786", GEAR_FLOW_TLS_DIR=client_only)
    assert r.returncode == 2 and f"a worker needs {client_only / 'worker.pem'}" in r.stderr
    os.remove(client_only / "client-key.pem")
    r = subprocess.run(["bash", "-c", f"source {CLUSTER / 'env.sh'}"], env={**env, "GEAR_FLOW_TLS_DIR": str(client_only)},
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and f"a client needs {client_only / 'client-key.pem'}" in r.stderr


def test_env_sh_gives_clients_the_certificates(certs):
    code = "from distributed import Security; s = Security(); print(s.require_encryption, s.tls_client_cert)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "GEAR_FLOW_"))}
    r = subprocess.run(["bash", "-c", f"source {CLUSTER / 'env.sh'} && {shlex.quote(sys.executable)} -c '{code}'"],
                       env={**env, "GEAR_FLOW_TLS_DIR": str(certs), "GEAR_FLOW_SCHEDULER_ADDRESS": "tls://h:1"},
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", str(certs / "client.pem")]


# -- TLS certificates -----------------------------------------------------------------------------
def _handshake(certs: Path, server: str, client: str, client_ca: Path | None = None) -> None:
    sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    sctx.load_cert_chain(certs / f"{server}.pem", certs / f"{server}-key.pem")
    sctx.load_verify_locations(certs / "ca.pem")
    sctx.verify_mode = ssl.CERT_REQUIRED
    cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cctx.check_hostname = False
    cctx.load_verify_locations(client_ca or certs / "ca.pem")
    cctx.load_cert_chain(certs / f"{client}.pem", certs / f"{client}-key.pem")
    a, b = socket.socketpair()
    errors = []

    def serve():
        try:
            with sctx.wrap_socket(a, server_side=True) as s:
                s.sendall(s.recv(5))
        except (ssl.SSLError, OSError) as e:
            errors.append(e)

    t = threading.Thread(target=serve)
    t.start()
    try:
        with cctx.wrap_socket(b) as c:
            c.sendall(b"hello")
            assert c.recv(5) == b"hello"
    finally:
        t.join(10)
    if errors:
        raise errors[0]


@pytest.mark.parametrize("backend", sorted(make_certs.BACKENDS))
def test_make_certs_gives_a_working_mutual_tls_setup(tmp_path, backend):
    if backend == "openssl" and not shutil.which("openssl"):
        pytest.skip("no openssl command")
    if backend == "cryptography":
        pytest.importorskip("cryptography")
    files = make_certs.make_certs(tmp_path, hosts=["node-7", "10.1.2.3"], backend=backend)
    assert sorted(Path(f).name for f in files.values()) == sorted(make_certs.FILES)
    for f in files.values():
        mode = stat.S_IMODE(os.stat(f).st_mode)
        assert mode == 0o600 if f.endswith("-key.pem") else mode & 0o077 != 0o077, (f, oct(mode))
    for server, client in (
        ("scheduler", "worker"),
        ("worker", "worker"),
        ("scheduler", "client"),
        ("worker", "client"),
    ):
        _handshake(tmp_path, server, client)
    der = ssl.PEM_cert_to_DER_cert((tmp_path / "worker.pem").read_text())
    assert b"node-7" in der and bytes([10, 1, 2, 3]) in der and b"localhost" in der
    with pytest.raises(FileExistsError):
        make_certs.make_certs(tmp_path, backend=backend)
    make_certs.make_certs(tmp_path, backend=backend, force=True)


def test_certificates_of_another_ca_are_refused(tmp_path, certs):
    make_certs.make_certs(tmp_path)
    with pytest.raises(ssl.SSLError):
        _handshake(certs, "scheduler", "client", client_ca=tmp_path / "ca.pem")


def test_make_certs_command_line(tmp_path):
    r = subprocess.run([sys.executable, str(CLUSTER / "tls" / "make_certs.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and "ca.pem" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, str(CLUSTER / "tls" / "make_certs.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "--force" in r.stderr


# -- SLURM (dask-jobqueue) ------------------------------------------------------------------------
def test_jobqueue_sections_are_complete():
    jq = pytest.importorskip("dask_jobqueue")
    base = yaml.safe_load((Path(jq.__file__).parent / "jobqueue.yaml").read_text())["jobqueue"]["slurm"]
    ours = yaml.safe_load((CLUSTER / "slurm" / "jobqueue.yaml").read_text())["jobqueue"]
    for section in ("slurm", "slurm-gpu"):
        missing = sorted(set(base) - set(ours[section]))
        unknown = sorted(set(ours[section]) - set(base))
        assert not missing and not unknown, (section, missing, unknown)


def _slurm_dry_run(*args) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "GEAR_FLOW_"))}
    r = subprocess.run([sys.executable, str(CLUSTER / "slurm" / "slurm_cluster.py"), "--dry-run", *map(str, args)],
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout


def _check_job_script(script: str, tmp_path: Path) -> list[str]:
    (tmp_path / "job.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")]).returncode == 0, script
    assert script.startswith("#!/usr/bin/env bash\n") and "#SBATCH -t 08:00:00" in script
    assert 'export DASK_CONFIG="${GEAR_FLOW_CLUSTER_DIR' in script
    line = next(x for x in script.splitlines() if " -m " in x)
    words = shlex.split(line)
    assert Path(words[0]).name.startswith("python") and words[1] == "-m"
    return words[2:]


def test_slurm_gpu_job_script(tmp_path, certs):
    pytest.importorskip("dask_jobqueue")
    script = _slurm_dry_run("--kind", "gpu", "--tls-dir", certs)
    assert "#SBATCH --gpus-per-node=8" in script and "#SBATCH -p gpu" in script
    words = _check_job_script(script, tmp_path)
    assert words[:3] == ["dask", "cuda", "worker"]  # python -m dask cuda worker: dask-cuda's dask_cli command
    p = parse_cuda_worker(words[3:])
    assert p["scheduler"] == "tls://SCHEDULER_HOST:8786" and "gear_flow.distributed.preload" in str(p["preload"])
    assert (p["resources"], p["rmm_pool_size"], p["interface"]) == ("replay=1,learner=1", "0.5", "ib0")
    assert "gear_flow.deploy.no_http" in str(p["preload"]) and p.get("no_dashboard", not p.get("dashboard"))
    assert (p["tls_ca_file"], p["tls_cert"]) == (str(certs / "ca.pem"), str(certs / "worker.pem"))
    words = _check_job_script(_slurm_dry_run("--kind", "gpu", "--ucx"), tmp_path)
    assert parse_cuda_worker(words[3:])["scheduler"] == "ucx://SCHEDULER_HOST:8786"


def test_slurm_cpu_job_script(tmp_path, certs):
    pytest.importorskip("dask_jobqueue")
    words = _check_job_script(_slurm_dry_run("--kind", "cpu", "--tls-dir", certs), tmp_path)
    assert words[0] == "distributed.cli.dask_worker"
    p = parse_worker(words[1:])
    assert (p["resources"], p["n_workers"], p["nthreads"]) == ("replay=1,learner=1", "2", 8)
    assert p["preload"] == ("gear_flow.distributed.preload", "gear_flow.deploy.no_http")
    assert p["tls_key"] == str(certs / "worker-key.pem")
    # listeners: the configured interface only, and no HTTP server at all
    assert (p["interface"], p["dashboard"]) == ("eth0", False)


def test_slurm_script_refuses_ucx_with_tls(certs):
    r = subprocess.run([sys.executable, str(CLUSTER / "slurm" / "slurm_cluster.py"), "--dry-run", "--ucx",
                        "--tls-dir", str(certs)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "UCX does not encrypt" in r.stderr


def test_gpu_worker_rmm_settings():
    """GEAR_FLOW_RMM_POOL_SIZE / GEAR_FLOW_RMM_LIBS reach `dask cuda worker` as dask-cuda's own RMM options
    (its RMMSetup makes the pool as the worker starts); a bad library, or libraries without a pool, is a
    one-line error instead of being dropped; a CPU worker says it ignores them."""
    from gear_flow.distributed.gpu_memory import check_libraries, check_pool_size

    def libs(p):
        v = p.get("rmm_allocator_external_lib_list", p.get("set_rmm_allocator_for_libs"))
        return ",".join(v) if isinstance(v, (list, tuple)) else v

    _, cmd = command(dry_run("start-worker.sh", "--kind", "gpu", "tcp://10.0.0.5:8786", GEAR_FLOW_RMM_POOL_SIZE="100GB",
                             GEAR_FLOW_RMM_LIBS="cupy,torch"))  # fmt: skip
    p = parse_cuda_worker(cmd[3:])
    assert (p["rmm_pool_size"], libs(p)) == ("100GB", "cupy,torch")
    p = parse_cuda_worker(command(dry_run("start-worker.sh", "--kind", "gpu", "tcp://10.0.0.5:8786",
                                          GEAR_FLOW_RMM_POOL_SIZE="0.8"))[1][3:])  # fmt: skip
    assert (p["rmm_pool_size"], libs(p)) == ("0.8", "cupy")
    p = parse_cuda_worker(command(dry_run("start-worker.sh", "--kind", "gpu", "tcp://10.0.0.5:8786"))[1][3:])
    assert p.get("rmm_pool_size") is None and not libs(p)
    r = dry_run(
        "start-worker.sh",
        "--kind",
        "gpu",
        "tcp://127.0.0.1:1",
        GEAR_FLOW_RMM_POOL_SIZE="0.8",
        GEAR_FLOW_RMM_LIBS="numba",
    )
    assert (
        r.returncode == 2
        and r.stderr.strip() == "start-worker.sh: GEAR_FLOW_RMM_LIBS: unknown library 'numba' (cupy, torch)"
    )
    r = dry_run("start-worker.sh", "--kind", "gpu", "tcp://127.0.0.1:1", GEAR_FLOW_RMM_LIBS="torch")
    assert r.returncode == 2 and "GEAR_FLOW_RMM_LIBS needs GEAR_FLOW_RMM_POOL_SIZE" in r.stderr
    r = dry_run("start-worker.sh", "--kind", "cpu", "tcp://127.0.0.1:1", GEAR_FLOW_RMM_POOL_SIZE="0.8")
    assert r.returncode == 0 and "ignored by a CPU worker" in r.stderr
    assert "--rmm-pool-size" not in command(r)[1]
    # the config file's GPU settings are ones the GpuMemory plugin accepts
    gpu = yaml.safe_load((CLUSTER / "config" / "gear-flow.yaml").read_text())["gear-flow"]["gpu"]
    check_pool_size(gpu["rmm-pool-size"]), check_libraries(gpu["rmm-for"])
