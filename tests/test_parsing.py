"""Selector, limiter and column strings and the default shard count: library functions the CLI uses."""

from __future__ import annotations

import numpy as np
import pytest
from custom_parts import FlooredPrioritized
from helpers import registered_kinds

import gear_flow as gf
from gear_flow.parsing import default_num_shards, parse_columns, parse_rate_limiter, parse_selector


@pytest.mark.parametrize(
    "family, cfg, message",
    [
        ("selector", {"kind": "prioritized", "params": {"gamma": 1}},
         "selector 'prioritized' has no parameter gamma; its parameters: alpha=0.6, beta=0.4"),
        ("selector", {"kind": "fifo", "params": {"size": 3}}, "selector 'fifo' has no parameter size; it takes none"),
        ("rate_limiter", {"kind": "min_size", "params": {"foo": 1}},
         "rate limiter 'min_size' has no parameter foo; its parameters: min_size_to_sample=1"),
        ("rate_limiter", {"kind": "sample_to_insert_ratio", "params": {"samples_per_insert": 2}},
         "rate limiter 'sample_to_insert_ratio' needs min_size_to_sample, error_buffer; "
         "its parameters: samples_per_insert, min_size_to_sample, error_buffer"),
        ("rate_limiter", {"kind": "queue"}, "rate limiter 'queue' needs size; its parameters: size"),
        ("rate_limiter", {"kind": "queue", "params": [3]}, "the params of rate limiter 'queue' must be a mapping"),
    ],
)  # fmt: skip
def test_from_config_names_the_parameters_a_kind_takes(family, cfg, message):
    from gear_flow import rate_limiters, selectors

    registry = selectors if family == "selector" else rate_limiters
    with pytest.raises(gf.SpecError) as e:
        registry.from_config(cfg)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    # the right parameters still build it
    assert type(selectors.from_config({"kind": "prioritized", "params": {"alpha": 0.5}})) is gf.Prioritized


def test_selector_and_limiter_strings():
    s = parse_selector("prioritized:alpha=0.5,beta=0.25")
    assert type(s) is gf.Prioritized and s.params() == {"alpha": 0.5, "beta": 0.25}
    assert type(parse_selector("fifo")) is gf.Fifo
    lim = parse_rate_limiter("sample_to_insert_ratio:samples_per_insert=2,min_size_to_sample=10,error_buffer=[0,40]")
    assert type(lim) is gf.SampleToInsertRatio and (lim.min_diff, lim.max_diff) == (0.0, 40.0)
    with registered_kinds({"floored_prioritized": FlooredPrioritized}):
        assert parse_selector("floored_prioritized:floor=0.5").floor == 0.5  # registered kinds parse too
    with pytest.raises(gf.SpecError, match="unknown selector kind 'prioritised'"):
        parse_selector("prioritised:alpha=0.5")
    with pytest.raises(gf.SpecError, match="names no kind"):
        parse_rate_limiter(":size=3")
    cols = parse_columns("obs:float32[4, 2],action:int64,done:bool")
    spec = gf.TableSpec.from_dict(
        {"columns": cols, "capacity": 8, "num_shards": 1, "item_unit": "step", "max_size": None}
    )
    assert [(c.name, c.shape, c.dtype) for c in spec.columns] == [
        ("obs", (4, 2), np.dtype("float32")),
        ("action", (), np.dtype("int64")),
        ("done", (), np.dtype("bool")),
    ]


def test_default_num_shards(dist_client):
    workers = sorted(dist_client.nthreads())
    assert default_num_shards(dist_client) == len(workers) == 2
    assert default_num_shards(dist_client, workers=workers[:1]) == 1
    with pytest.raises(gf.GearFlowError):
        default_num_shards(dist_client, resources="no-such-resource")
