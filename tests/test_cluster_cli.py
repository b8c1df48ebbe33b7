"""The ``gear-flow`` command line without a cluster: help texts, argument parsing, table files,
clear errors, ``bench`` and the ``dask gear-flow`` entry point (the commands against a real cluster
are in test_cluster_processes.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

from gear_flow import cli
from gear_flow.errors import SpecError
from gear_flow.spec import TableSpec

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (
    "local",
    "list",
    "info",
    "create",
    "ingest",
    "sample",
    "drop",
    "checkpoint",
    "restore-shard",
    "rebalance",
    "bench",
)


def test_top_level_help_lists_every_command_and_a_quickstart(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for c in COMMANDS:
        assert f"\n    {c} " in out or f"\n    {c}\n" in out, c
    assert "gear-flow local" in out and "Running on a cluster" in out and "--tls-dir" in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: gear-flow {command}")
    if command not in ("local",):
        assert "--scheduler" in out and "--tls-dir" in out


def test_parse_columns():
    cols = cli.parse_columns("obs:float32[3,84,84], action:int64,reward:float32,done:bool")
    spec = TableSpec.from_dict(
        {"columns": cols, "capacity": 10, "num_shards": 1, "item_unit": "step", "max_size": None}
    )
    assert [(c.name, c.shape, c.dtype) for c in spec.columns] == [
        ("obs", (3, 84, 84), np.dtype(np.float32)),
        ("action", (), np.dtype(np.int64)),
        ("reward", (), np.dtype(np.float32)),
        ("done", (), np.dtype(np.bool_)),
    ]
    with pytest.raises(ValueError, match="NAME:DTYPE"):
        cli.parse_columns("obs=float32")
    with pytest.raises(SpecError, match=r"column 'obs': dtype 'notadtype' is not a numpy dtype"):
        cli.parse_columns("obs:notadtype")


def test_parse_kind():
    assert cli.parse_kind("uniform") == {"kind": "uniform", "params": {}}
    assert cli.parse_kind("prioritized:alpha=0.6,beta=0.4") == {
        "kind": "prioritized",
        "params": {"alpha": 0.6, "beta": 0.4},
    }
    assert cli.parse_kind("sample_to_insert_ratio:samples_per_insert=4,min_size_to_sample=10,error_buffer=[2,30]") == {
        "kind": "sample_to_insert_ratio", "params": {"samples_per_insert": 4, "min_size_to_sample": 10, "error_buffer": [2, 30]}
    }  # fmt: skip
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cli.parse_kind("prioritized:alpha")


def test_example_table_file_builds_a_valid_table():
    from gear_flow import LocalTable, rate_limiters, selectors

    doc = cli.load_table_file(str(ROOT / "cluster" / "examples" / "cartpole-table.yaml"))
    spec = TableSpec.from_dict({"num_shards": 2, "max_size": None, **doc["spec"]})
    LocalTable(spec, sampler=selectors.from_config(doc["sampler"]), remover=selectors.from_config(doc["remover"]),
               rate_limiter=rate_limiters.from_config(doc["rate_limiter"]), boundary=doc["boundary"])  # fmt: skip
    from gear_flow.ingest import episode_columns

    assert spec.columns == episode_columns(4)  # what gear-flow ingest reads into it


def test_table_file_errors(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps({"spec": {}, "samplr": {"kind": "uniform"}}))
    with pytest.raises(ValueError, match=r"unknown keys \['samplr'\]"):
        cli.load_table_file(str(tmp_path / "t.json"))
    (tmp_path / "t.yaml").write_text("columns: []\n")
    with pytest.raises(ValueError, match="'spec' key"):
        cli.load_table_file(str(tmp_path / "t.yaml"))


def test_create_with_a_bad_selector_or_limiter_parameter_is_one_line_before_connecting(monkeypatch, capsys):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)  # refused before any connection is tried
    base = ["create", "--name", "x", "--obs-dim", "4", "--capacity", "100"]
    for opts, expected in (
        (["--rate-limiter", "min_size:foo=1"], "SpecError: rate limiter 'min_size' has no parameter foo; "
                                               "its parameters: min_size_to_sample=1"),
        (["--rate-limiter", "sample_to_insert_ratio:samples_per_insert=2"],
         "SpecError: rate limiter 'sample_to_insert_ratio' needs min_size_to_sample, error_buffer;"),
        (["--sampler", "prioritized:gamma=1"], "SpecError: selector 'prioritized' has no parameter gamma;"),
    ):  # fmt: skip
        assert cli.main(base + opts) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gear-flow create: {expected}") and err.count("\n") == 1, err


def test_messages_quote_what_the_user_typed_with_units(capsys):
    # --resources: the user's text, not the internal KIND: form it is parsed in
    for text in ("replay", "replay=x", "replay=1 gpu"):
        assert cli.main(["local", "--resources", text]) == 2
        err = capsys.readouterr().err
        assert err == f"gear-flow local: --resources {text!r}: give NAME=AMOUNT pairs (numbers), e.g. " \
                      "--resources replay=1,learner=1\n", err  # fmt: skip
    # a bare --timeout is seconds, and the message says so
    assert cli.main(["list", "--scheduler", "tcp://127.0.0.1:1", "--timeout", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the scheduler at tcp://127.0.0.1:1 within 0.5 s (" in err and err.count("\n") == 1, err


def test_connection_errors_are_clear(monkeypatch, capsys):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    for argv, expected in (
        (["list"], "gear-flow list: no scheduler given"),
        (["list", "--scheduler", "tls://127.0.0.1:1"], "uses TLS: pass --tls-dir"),
        (["list", "--scheduler", "tls://127.0.0.1:1", "--tls-dir", "/nonexistent"], "missing or unreadable"),
        (["local", "--protocol", "tls"], "gear-flow local: --protocol tls needs --tls-dir"),
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
    # --debug shows the exception itself
    with pytest.raises(cli.CLIError, match="no scheduler given"):
        cli.main(["list", "--debug"])


def test_bench_runs_a_pipelines_script(tmp_path):
    # the repository the gear_flow under test runs its pipelines/ from (a snapshot when PYTHONPATH says so)
    import gear_flow

    results = Path(gear_flow.__file__).resolve().parents[1] / "benchmarks" / "results"

    def recorded():
        return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in results.glob("*.json")}

    before = recorded()
    r = subprocess.run([sys.executable, "-m", "gear_flow", "bench", "local", "--", "--no-peers"],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = tmp_path.resolve() / "bench_local.json"
    assert f"bench_local.py --quick --out {out} --no-peers" in r.stdout and f"wrote {out}" in r.stdout
    assert json.loads(out.read_text())["args"]["quick"]
    # a quick run from the CLI leaves the recorded results (which docs/benchmarks.md draws) as they were
    assert recorded() == before


def test_bench_out_option_is_passed_to_the_script(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "distributed", "--full", "--out", "runs/d.json"]) == 0
    script = str(ROOT / "pipelines" / "bench_distributed.py")
    assert calls[0][1:] == [script, "--out", str(tmp_path.resolve() / "runs" / "d.json")]
    assert cli.main(["bench", "distributed"]) == 0
    assert calls[1][2:4] == ["--quick", "--out"] and calls[1][4] == str(tmp_path.resolve() / "bench_distributed.json")


def test_bench_passes_what_follows_double_dash_after_options(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    # the help's own example: `--` after an option
    assert cli.main(["bench", "distributed", "--full", "--", "--repeat", "10"]) == 0
    assert calls[-1][-2:] == ["--repeat", "10"] and "--quick" not in calls[-1]
    assert cli.main(["bench", "local", "--", "--no-peers"]) == 0
    assert calls[-1][-1] == "--no-peers"
    # what argparse does not know is still refused in one line, before anything runs
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "local", "--bogus", "--", "--no-peers"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus -- --no-peers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["list", "--", "x"])
    assert len(calls) == 2


def test_dask_subcommand_entry_point():
    eps = [ep for ep in entry_points(group="dask_cli") if ep.name == "gear-flow"]
    if not eps:
        pytest.skip("gear_flow's dask_cli entry point is not installed (pip install -e . registers it)")
    assert eps[0].load() is cli.dask_command
    r = subprocess.run([sys.executable, "-m", "dask", "gear-flow", "create", "--help"], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and "usage: gear-flow create" in r.stdout, r.stderr
