"""Payload checks of a write (service/collections/payload_checks.py): the size cap counts a payload's bytes as
compact UTF-8 JSON (non-ASCII as UTF-8, not escapes), names the first payload over it, and still measures what
orjson cannot encode (an integer past 64 bits, which the value check then refuses)."""

from __future__ import annotations

import json

import pytest

from service.collections.errors import InvalidCollectionRequest
from service.collections.payload_checks import check_payload_sizes, check_payload_values


def test_the_cap_counts_compact_utf8_json_bytes():
    p = {"city": "Zürich", "n": [1, 2, 3]}
    size = len(json.dumps(p, ensure_ascii=False, separators=(",", ":")).encode())
    check_payload_sizes([p, None, {}], size)  # exactly at the cap: accepted
    with pytest.raises(InvalidCollectionRequest, match=r"points\[1\]\.payload is 30 bytes") as e:
        check_payload_sizes([{}, p], size - 1)
    assert size == 30 and e.value.param == "points[1].payload"


def test_an_integer_past_64_bits_is_measured_then_refused_by_the_value_check():
    p = {"big": 2**70}
    check_payload_sizes([p], 100)
    with pytest.raises(InvalidCollectionRequest):
        check_payload_sizes([p], 10)
    with pytest.raises(ValueError, match="outside the signed 64-bit range"):
        check_payload_values(p)
