"""Numbers at the edge of the float range in a score-boosting formula (:mod:`service.collections.formula`), through
the real parser and evaluator: an integer literal past the float range (JSON bounds none; Python's ``float()`` raises
``OverflowError`` on one) as a constant, a ``mult`` operand, a default, a payload value or a geo coordinate, a decay
scale whose square underflows to 0, a ``$score[N]`` index of thousands of digits. Each is an answer or an
:class:`InvalidCollectionRequest` (a 422 in ``service.http.errors.ERROR_TABLE``), never another exception (a 500).
"""

from __future__ import annotations

import pytest

from service.collections.errors import InvalidCollectionRequest
from service.collections.formula import FormulaSpec, parse

HUGE = 10**400
TINY = 5e-324  # the smallest positive float: its square is 0.0


def formula(expression, defaults=None):
    return parse(FormulaSpec(expression, defaults or {}), lambda raw, at: None)


@pytest.mark.parametrize(
    "expression",
    [
        HUGE,
        -HUGE,
        {"mult": [HUGE, "$score"]},
        {"sum": [1, {"neg": HUGE}]},
        {"geo_distance": {"origin": {"lat": HUGE, "lon": 0}, "to": "g"}},
        {"geo_distance": {"origin": {"lat": 0, "lon": -HUGE}, "to": "g"}},
        {"div": {"left": 1, "right": "$score", "by_zero_default": HUGE}},
        {"gauss_decay": {"x": "$score", "scale": HUGE}},
        {"lin_decay": {"x": "$score", "midpoint": HUGE}},
    ],
)
def test_integer_literals_past_the_float_range_are_refused(expression):
    with pytest.raises(InvalidCollectionRequest, match="must be a finite number"):
        formula(expression)


@pytest.mark.parametrize(
    ("expression", "defaults", "payload"),
    [
        ("x", {"x": HUGE}, {}),  # a default
        ("x", {"x": -HUGE}, {}),
        ("$score[1]", {"$score[1]": HUGE}, {}),  # a score default
        ({"mult": [2, "x"]}, {"x": HUGE}, {}),
        ("x", {}, {"x": HUGE}),  # a payload value
        ({"sum": ["x", 1]}, {}, {"x": -HUGE}),
    ],
)
def test_huge_integer_values_are_non_finite_scores(expression, defaults, payload):
    with pytest.raises(InvalidCollectionRequest, match="produced a non-finite number"):
        formula(expression, defaults).score([0.5], payload, 1)


def test_huge_values_not_reached_or_not_numbers_are_no_error():
    assert formula({"mult": [0, "x"]}, {"x": HUGE}).score([0.5], {}, 1) == 0.0  # stops at the zero factor
    assert formula({"div": {"left": 0, "right": "x"}}, {"x": HUGE}).score([0.5], {}, 1) == 0.0
    geo = formula({"geo_distance": {"origin": {"lat": 0, "lon": 0}, "to": "g"}})
    for g in ({"lat": HUGE, "lon": 0}, {"lat": 0, "lon": -HUGE}):
        with pytest.raises(InvalidCollectionRequest, match="Expected geo point value for g"):
            geo.score([0.5], {"g": g}, 1)
    assert geo.score([0.5], {"g": {"lat": 0, "lon": 0}}, 1) == 0.0


@pytest.mark.parametrize("decay", ["gauss_decay", "exp_decay", "lin_decay"])
def test_a_scale_whose_square_underflows(decay):
    f = formula({decay: {"x": "$score", "target": 0.25, "scale": TINY}})
    assert f.score([0.25], {}, 1) == 1.0  # at the target: 1, whatever the scale
    assert f.score([0.5], {}, 1) == 0.0  # anywhere else: 0 (the scale is as good as zero)
    assert f.score([-1e300], {}, 1) == 0.0
    normal = formula({decay: {"x": "$score", "target": 0.25, "scale": 2.0}})
    assert 0.0 < normal.score([0.5], {}, 1) < 1.0 and normal.score([0.25], {}, 1) == 1.0


def test_a_score_index_of_thousands_of_digits_is_refused():
    for expression, defaults in ((f"$score[{'9' * 5000}]", {}), ("$score", {f"$score[{'9' * 5000}]": 1.0})):
        with pytest.raises(InvalidCollectionRequest, match="invalid score pattern"):
            formula(expression, defaults)
    assert formula("$score[12]", {"$score[12]": 3}).score([0.5], {}, 1) == 3.0  # an index past the prefetches
