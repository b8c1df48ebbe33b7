"""cluster/k8s: the Dask operator manifests, checked as far as a machine without Kubernetes can:
their structure and cross-references, the commands their pods run (through the launch scripts'
dry run and the real option parsers), and, with dask-kubernetes and jsonschema installed (the
``cluster`` extra), the operator's CustomResourceDefinitions including unknown fields, as
``kubectl apply --validate=strict`` would."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "cluster" / "k8s"
sys.path.insert(0, str(Path(__file__).parent))
from test_cluster_config import parse_cuda_worker, parse_scheduler, parse_worker  # noqa: E402

MANIFESTS = {"daskcluster.yaml": "DaskCluster", "cpu-workers.yaml": "DaskWorkerGroup"}
IMAGE_ROOT = "/opt/gear-flow/cluster/"


def load(name):
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    assert len(docs) == 1 and docs[0]["kind"] == MANIFESTS[name], name
    return docs[0]


def pods(doc):
    """(role, pod spec) of a DaskCluster or DaskWorkerGroup."""
    if doc["kind"] == "DaskCluster":
        return [("worker", doc["spec"]["worker"]["spec"]), ("scheduler", doc["spec"]["scheduler"]["spec"])]
    return [("worker", doc["spec"]["worker"]["spec"])]


def test_manifests_fit_together():
    cluster, cpu = load("daskcluster.yaml"), load("cpu-workers.yaml")
    name = cluster["metadata"]["name"]
    assert cpu["spec"]["cluster"] == name
    svc = cluster["spec"]["scheduler"]["service"]
    assert svc["selector"] == {"dask.org/cluster-name": name, "dask.org/component": "scheduler"}
    ports = {p["name"]: p["port"] for p in svc["ports"]}
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}
    for doc in (cluster, cpu):
        for role, pod in pods(doc):
            vols = {v["name"]: v for v in pod["volumes"]}
            assert vols["tls"]["secret"]["secretName"] == "gear-flow-tls"
            assert pod["securityContext"]["runAsNonRoot"] is True
            for c in pod["containers"]:
                env = container_env(c)
                mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
                assert env["GEAR_FLOW_TLS_DIR"] == mounts["tls"]
                assert c["args"][0] == IMAGE_ROOT + ("start-worker.sh" if role == "worker" else "start-scheduler.sh")
                named = {p["name"] for p in c["ports"]}
                for probe in ("readinessProbe", "livenessProbe"):
                    if probe in c:
                        assert c[probe]["httpGet"]["port"] in named
                # every pod listens on its own address (workers) or its own interfaces (scheduler) only
                assert env["GEAR_FLOW_HOST"] == ("10.1.2.3" if role == "worker" else "0.0.0.0")
                if role == "worker":
                    # set explicitly: the operator would inject a tcp:// address
                    assert env["DASK_SCHEDULER_ADDRESS"] == f"tls://{name}-scheduler:{ports['tcp-comm']}"
                else:
                    assert {"tcp-comm", "http-dashboard"} <= named
                    assert "distributed.http.scheduler.api" in env["DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES"]
    gpu_worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    assert gpu_worker["resources"]["limits"]["nvidia.com/gpu"] == "1" and "--kind" in gpu_worker["args"]
    assert gpu_worker["args"][gpu_worker["args"].index("--kind") + 1] == "gpu"


def container_env(c: dict) -> dict:
    """A container's environment as the pod sees it; the downward API gives the pod's address."""
    pod = {"status.podIP": "10.1.2.3"}
    return {e["name"]: e["value"] if "value" in e else pod[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in c["env"]}


def _expand(value: str, env: dict) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), value)


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_pod_commands_dry_run(name, tmp_path):
    """Each container's args through the launch scripts' --dry-run, as the pod would run them."""
    sys.path.insert(0, str(ROOT / "cluster" / "tls"))
    import make_certs

    certs = tmp_path / "tls"
    make_certs.make_certs(certs)  # stands in for the mounted Secret
    for role, pod in pods(load(name)):
        c = pod["containers"][0]
        env = container_env(c)
        env.setdefault("DASK_WORKER_NAME", "gear-flow-default-worker-0")  # injected by the operator
        args = [_expand(a, env) for a in c["args"]]
        script = ROOT / "cluster" / args[0][len(IMAGE_ROOT) :]
        path = os.path.dirname(sys.executable) + ":/usr/bin:/bin"  # the image's Python has gear_flow
        run_env = {k: v for k, v in env.items()} | {"GEAR_FLOW_TLS_DIR": str(certs), "PATH": path}
        r = subprocess.run(["bash", str(script), "--dry-run", *args[1:]], env=run_env, capture_output=True,
                           text=True, timeout=30)  # fmt: skip
        assert r.returncode == 0, r.stderr
        cmd = shlex.split(r.stdout)[1:]
        if role == "scheduler":
            p = parse_scheduler(cmd[2:])
            assert (p["protocol"], p["host"], p["dashboard_address"]) == ("tls", "0.0.0.0", "0.0.0.0:8787")
        elif cmd[1] == "cuda":
            p = parse_cuda_worker(cmd[3:])
            assert p["scheduler"] == env["DASK_SCHEDULER_ADDRESS"] and p["name"] == env["DASK_WORKER_NAME"]
            assert (p["host"], p["dashboard_address"]) == ("10.1.2.3", "10.1.2.3:8788")
            assert (p["resources"], p["rmm_pool_size"], p["protocol"]) == ("replay=1,learner=1", "0.5", "tls")
        else:
            p = parse_worker(cmd[2:])
            assert (p["scheduler"], p["resources"], p["protocol"]) == (env["DASK_SCHEDULER_ADDRESS"], "replay=1", "tls")
        assert "gear_flow.distributed.preload" in str(p["preload"]) and p["tls_ca_file"] == str(certs / "ca.pem")


# -- against the operator's CRDs ------------------------------------------------------------------
def _crd_schema(kind: str) -> dict:
    pytest.importorskip("jsonschema")
    spec = importlib.util.find_spec("dask_kubernetes")
    if spec is None:
        pytest.skip("dask-kubernetes (the cluster extra) is not installed")
    crds = Path(spec.origin).parent / "operator" / "deployment" / "helm" / "dask-kubernetes-operator" / "crds"
    crd = yaml.safe_load((crds / f"{kind.lower()}.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    return crd["spec"]["group"] + "/" + version["name"], version["schema"]["openAPIV3Schema"]


def unknown_fields(obj, schema: dict, path: str = "") -> list[str]:
    """Fields of ``obj`` that the structural schema would prune (``kubectl --validate=strict`` rejects them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out = []
    if isinstance(obj, dict):
        props, more = schema.get("properties"), schema.get("additionalProperties")
        for k, v in obj.items():
            if props is not None and k in props:
                out += unknown_fields(v, props[k], f"{path}.{k}")
            elif isinstance(more, dict):
                out += unknown_fields(v, more, f"{path}.{k}")
            elif props is not None or more is False:
                out.append(f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            out += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_manifests_match_the_operator_crds(name):
    doc = load(name)
    api_version, schema = _crd_schema(doc["kind"])
    import jsonschema

    assert doc["apiVersion"] == api_version
    jsonschema.validate({k: v for k, v in doc.items() if k != "metadata"}, schema)
    assert not unknown_fields(doc["spec"], schema["properties"]["spec"], "spec")


def test_strict_check_catches_a_typo():
    """The unknown-field check is what catches a misspelt field (the schema alone allows extra fields)."""
    _, schema = _crd_schema("DaskCluster")
    import jsonschema

    doc = load("daskcluster.yaml")
    doc["spec"]["worker"]["spec"]["containers"][0]["resource"] = {"limits": {"nvidia.com/gpu": 1}}
    jsonschema.validate({k: v for k, v in doc.items() if k != "metadata"}, schema)
    assert unknown_fields(doc["spec"], schema["properties"]["spec"], "spec") == [
        "spec.worker.spec.containers[0].resource"
    ]
    doc["spec"]["worker"]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in doc.items() if k != "metadata"}, schema)
