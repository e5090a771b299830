"""The request body parser: integers past 64 bits stay exact (the standard library's parse), bodies without such
literals, floats with long fractions included, stay on orjson (fast, releases the event loop sooner)."""

from __future__ import annotations

import json

import pytest

from service.http import kit


def test_integer_literals_past_64_bits_stay_exact() -> None:
    body = b'{"a": [123456789012345678901234, -123456789012345678901], "b": 1.5e3}'
    assert kit._loads(body) == {"a": [123456789012345678901234, -123456789012345678901], "b": 1500.0}
    assert kit._loads(b"12345678901234567890123") == 12345678901234567890123


@pytest.mark.parametrize(
    "body",
    [
        b'{"vector": [0.00012345678901234567, -0.000098765432109876543]}',
        b'{"id": 1844674407370955161, "vector": [1.00000000000000000000001e-3]}',
    ],
)
def test_long_fractions_stay_on_orjson(body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the standard library's parser was used")

    expected = json.loads(body)
    monkeypatch.setattr(kit.json, "loads", refuse)
    assert kit._loads(body) == expected


def test_responses_write_integers_past_64_bits_exactly() -> None:
    import numpy as np

    obj = {"payload": {"n": 10**30, "m": -(10**25)}, "vector": np.arange(3, dtype=np.float32), "s": np.int64(4)}
    r = kit.json_response(obj)
    assert r.status_code == 200
    assert json.loads(r.body) == {"payload": {"n": 10**30, "m": -(10**25)}, "vector": [0.0, 1.0, 2.0], "s": 4}
