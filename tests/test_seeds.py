"""A part's generator (:func:`gear_flow.ops.seeds.generator`) is ``np.random.default_rng(seed)``, state for
state: owners and readers of a distributed table draw a part with it, and a seed must give the same batch
whoever draws it, as it did when both called NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from gear_flow.ops.seeds import _Words, generator

EDGES = [0, 1, 2**16, 2**32 - 1, 2**32, 2**32 + 1, 2**48 + 7, 2**63 - 1, 2**63, 2**64 - 1]


def test_every_seed_gives_numpys_state_and_draws():
    rng = np.random.default_rng(2026)
    seeds = EDGES + [int(s) for s in rng.integers(2**63, size=3000)] + [int(s) for s in rng.integers(2**32, size=500)]
    for seed in seeds:
        ours, numpys = generator(seed), np.random.default_rng(seed)
        assert ours.bit_generator.state == numpys.bit_generator.state, seed
    ours, numpys = generator(EDGES[-3]), np.random.default_rng(EDGES[-3])
    assert np.array_equal(ours.random(64), numpys.random(64))  # in order
    assert np.array_equal(ours.integers(0, 10**9, 64), numpys.integers(0, 10**9, 64))


@pytest.mark.parametrize("seed", [np.int64(5), 2**64, 2**70 + 3, None], ids=["numpy-int", "2**64", "2**70+3", "none"])
def test_a_seed_it_does_not_compute_goes_to_numpy(seed):
    ours = generator(seed)
    if seed is None:  # fresh entropy: a generator all the same
        assert isinstance(ours, np.random.Generator)
    else:
        assert ours.bit_generator.state == np.random.default_rng(seed).bit_generator.state


def test_a_negative_seed_is_refused_as_numpy_refuses_it():
    with pytest.raises(ValueError):
        generator(-1)


def test_the_words_are_only_pcg64s_request():
    with pytest.raises(ValueError, match="4 uint64"):
        _Words(np.zeros(4, np.uint64)).generate_state(8, np.uint32)
