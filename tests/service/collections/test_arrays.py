"""``sorted_unique`` answers as ``np.unique`` (ascending distinct values) on the arrays the search paths give it."""

from __future__ import annotations

import numpy as np
import pytest

from service.collections.arrays import sorted_unique

ARRAYS = {
    "empty": lambda: np.empty(0, np.int64),
    "one": lambda: np.array([7], np.int64),
    "all-equal": lambda: np.array([3, 3, 3], np.int64),
    "signed-and-large": lambda: np.array([-5, 9, -5, 0, 9, 2**62], np.int64),
    "many-repeats": lambda: np.random.default_rng(0).integers(0, 1000, 5000),
    "shuffled-distinct": lambda: np.random.default_rng(1).permutation(100_000).astype(np.int64),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_sorted_unique_is_numpys_unique(name):
    a = ARRAYS[name]()
    got = sorted_unique(a)
    assert got.dtype == a.dtype and np.array_equal(got, np.unique(a))
