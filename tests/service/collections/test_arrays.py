"""``sorted_unique`` answers as ``np.unique`` (ascending distinct values) on the arrays the search paths give it."""

from __future__ import annotations

import numpy as np
import pytest

from service.collections.arrays import sorted_unique


@pytest.mark.parametrize(
    "a",
    [
        np.empty(0, np.int64),
        np.array([7], np.int64),
        np.array([3, 3, 3], np.int64),
        np.array([-5, 9, -5, 0, 9, 2**62], np.int64),
        np.random.default_rng(0).integers(0, 1000, 5000),
        np.random.default_rng(1).permutation(100_000).astype(np.int64),
    ],
)
def test_sorted_unique_is_numpys_unique(a):
    got = sorted_unique(a)
    assert got.dtype == a.dtype and np.array_equal(got, np.unique(a))
