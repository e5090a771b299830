"""Score boosting: the points a query's prefetches found, re-scored by an arithmetic expression over their prefetch
scores, payload values and filter conditions (Qdrant documentation, "Hybrid and Multi-Stage Queries", section "Score
boosting"; Qdrant API reference, "Query points": ``FormulaQuery``, ``Expression``, ``DecayParamsExpression``), with
the semantics of qdrant-client's local mode (the oracle the tests hold this to) and Qdrant's error messages.

Grammar (JSON: Qdrant's ``Expression``, its conditions written as filters of :mod:`.filters`; ``?``: optional)::

    EXPR := NUMBER | "$score" | "$score[N]" | KEY    # the point's score in prefetch N ($score: N = 0); the payload
          | {"filter": FILTER}                       # number at the key path KEY; 1.0 when the point matches FILTER
          | {"sum" | "mult" | "max" | "min": [EXPR, ...]}
          | {"neg" | "abs" | "sqrt" | "exp" | "log10" | "ln" | "acosh": EXPR}
          | {"div": {"left": EXPR, "right": EXPR, "by_zero_default": NUMBER?}}
          | {"pow": {"base": EXPR, "exponent": EXPR}}
          | {"geo_distance": {"origin": {"lat", "lon"}, "to": KEY}}    # meters (haversine)
          | {"datetime": DATETIME} | {"datetime_key": KEY}           # seconds since the Unix epoch
          | {"lin_decay" | "exp_decay" | "gauss_decay": {"x": EXPR, "target": EXPR?, "scale": NUMBER?,
                                                       "midpoint": NUMBER?}}
    DEFAULTS := {"$score[N]" | "$score" | KEY: value, ...}

* a point absent from prefetch N's hits scores there the default ``$score[N]`` (``$score`` is ``$score[0]``) or 0;
* ``KEY`` reads the values the path reaches (an array reached is unwrapped, :func:`.conditions.values_at`; none: the
  default of ``KEY``); one value must be a number, else (a string, ``null``, several values, no value) it is an error
  "Expected number value for KEY in the payload and/or in the formula defaults"; ``geo_distance``/``datetime_key``
  read a ``{lat, lon}`` object or a datetime string (:func:`.conditions.parse_datetime`) the same way;
* ``mult`` stops at a zero factor, ``div`` at a zero ``left``; ``div`` by 0 gives ``by_zero_default``, or without one
  is an error; so are ``sqrt`` of a negative number, ``ln``/``log10`` of a non-positive one, ``acosh`` below 1, and a
  ``div``/``pow``/``exp`` that is not finite: "The expression ... produced a non-finite number"; ``max``/``min`` skip
  NaN operands;
* decays of ``d = x - target`` (defaults: ``target`` 0, ``scale`` 1, ``midpoint`` 0.5): ``lin_decay`` ``max(0, 1 -
  (1 - midpoint) / scale * |d|)``, ``exp_decay`` ``exp(ln(midpoint) / scale * |d|)``, ``gauss_decay``
  ``exp(ln(midpoint) / scale^2 * d^2)``; ``midpoint`` in [0, 1] (lin) or (0, 1); ``scale`` above 0;
* a score is a float32 (Qdrant's score type), which must be finite; :func:`.formula_eval.rescore` scores every point of every
  prefetch (in the order first seen), best first (ties keep that order), keeps the first ``limit``, then those
  scoring at least ``score_threshold``.

Every error is an :class:`~.errors.InvalidCollectionRequest` naming the request field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.collections.conditions import parse_datetime, parse_path
from service.collections.errors import InvalidCollectionRequest
from service.collections.filters import Filter
from service.collections.formula_eval import DECAYS, Formula, as_float, is_number

MAX_DEPTH = 32  # nesting of an expression
MAX_NODES = 1024  # operators, operands and conditions of one expression
LISTS = ("sum", "mult", "max", "min")
UNARY = ("neg", "abs", "sqrt", "exp", "log10", "ln", "acosh")
#: each operator's operands that are expressions themselves (a list operator: every element)
OPERANDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(LISTS + UNARY, ()),
    "div": ("left", "right"),
    "pow": ("base", "exponent"),
    **dict.fromkeys(DECAYS, ("x", "target")),
    "geo_distance": (),
    "datetime": (),
    "datetime_key": (),
}
_bad = InvalidCollectionRequest  # (message, param)
_SCORE = re.compile(r"\$score(?:\[([0-9]{1,20})\])?\Z")  # N: an unsigned 64-bit index (Qdrant's usize)


@dataclass(frozen=True)
class FormulaSpec:
    """A formula query as requested: ``expression`` and ``defaults`` in the module docstring's grammar; ``param``:
    the request field holding it (errors name ``{param}.formula``/``{param}.defaults``)."""

    expression: Any
    defaults: dict[str, Any] = field(default_factory=dict)
    param: str = "query"


def map_conditions(raw: Any, condition: Callable[[dict[str, Any], str], Any], param: str, depth: int = 0) -> Any:
    """``raw``, an expression of the module docstring's grammar whose conditions are another grammar's, with each
    object that is not an operator (``{op: ...}`` of :data:`OPERANDS`) replaced by ``condition(object, param)``
    (e.g. Qdrant's ``Condition`` by ``{"filter": ...}``). Anything else is left for :func:`parse` to judge.

    Raises:
        InvalidCollectionRequest: nested deeper than :data:`MAX_DEPTH`; what ``condition`` raises.
    """
    if depth > MAX_DEPTH:
        raise _bad(f"{param}: the expression nests more than {MAX_DEPTH} deep", param)
    if not isinstance(raw, dict):
        return raw
    if len(raw) != 1 or next(iter(raw)) not in OPERANDS:
        return condition(raw, param)
    op, arg = next(iter(raw.items()))
    at = f"{param}.{op}"
    if op in LISTS and isinstance(arg, list):
        return {op: [map_conditions(e, condition, f"{at}[{i}]", depth + 1) for i, e in enumerate(arg)]}
    if op in UNARY:
        return {op: map_conditions(arg, condition, at, depth + 1)}
    if OPERANDS[op] and isinstance(arg, dict):
        return {
            op: {
                k: map_conditions(v, condition, f"{at}.{k}", depth + 1) if k in OPERANDS[op] else v
                for k, v in arg.items()
            }
        }
    return raw


def _variable(v: str, param: str) -> tuple[str, Any]:
    """``("s", N)`` of a score variable, ``("v", KEY)`` of a payload key path."""
    if v.startswith("$score"):
        m = _SCORE.match(v)
        if m is None:
            raise _bad(f'{param}: invalid score pattern {v!r} ("$score" or "$score[N]")', param)
        return "s", int(m.group(1) or 0)
    if not v or parse_path(v) is None:
        raise _bad(f"{param}: {v!r} is not a payload key path or a score variable", param)
    return "v", v


def _real(v: Any, what: str, param: str) -> float:
    """``v`` as a finite float (an integer literal past the float range is not one)."""
    if not is_number(v) or not math.isfinite(as_float(v)):
        raise _bad(f"{param}: {what} must be a finite number", param)
    return float(v)


class _Parser:
    def __init__(self, parse_filter: Callable[[Any, str], Filter | None]) -> None:
        self.parse_filter = parse_filter
        self.filters: list[Filter | None] = []
        self.nodes = 0

    def expr(self, raw: Any, at: str, depth: int) -> tuple:
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise _bad(f"{at}: an expression nests at most {MAX_DEPTH} deep and holds at most {MAX_NODES} terms", at)
        if is_number(raw):
            return "c", _real(raw, "a constant", at)
        if isinstance(raw, str):
            return _variable(raw, at)
        if not isinstance(raw, dict) or len(raw) != 1:
            raise _bad(f"{at}: an expression is a number, a variable or {{operator: operands}}", at)
        op, arg = next(iter(raw.items()))
        at = f"{at}.{op}"
        if op == "filter":
            self.filters.append(self.parse_filter(arg, at))
            return "f", len(self.filters) - 1
        if op in LISTS:
            if not isinstance(arg, list) or (not arg and op in ("max", "min")):
                raise _bad(f"{at} must be a list of expressions (max and min: at least one)", at)
            return op, tuple(self.expr(e, f"{at}[{i}]", depth + 1) for i, e in enumerate(arg))
        if op in UNARY:
            return op, self.expr(arg, at, depth + 1)
        if op == "datetime":
            dt = parse_datetime(arg)
            if dt is None:
                raise _bad(f"{at}: expected a datetime in a supported format, got {arg!r}", at)
            return "c", dt.timestamp()
        if op == "datetime_key":
            return "dt", self.key(arg, at)
        if op not in OPERANDS or not isinstance(arg, dict):
            raise _bad(f"{at}: not an operator of {', '.join(OPERANDS)}, filter; or its operands not an object", at)
        return self.compound(op, arg, at, depth)

    def key(self, v: Any, at: str) -> str:
        kind, key = _variable(v, at) if isinstance(v, str) else ("", None)
        if kind != "v":
            raise _bad(f"{at} must be a payload key path", at)
        return key

    def compound(self, op: str, arg: dict[str, Any], at: str, depth: int) -> tuple:
        need = {
            "div": ({"left", "right"}, {"by_zero_default"}),
            "pow": ({"base", "exponent"}, set()),
            "geo_distance": ({"origin", "to"}, set()),
        }.get(op, ({"x"}, {"target", "scale", "midpoint"}))
        if not need[0] <= set(arg) <= need[0] | need[1]:
            raise _bad(f"{at} takes {sorted(need[0])} and optionally {sorted(need[1])}", at)
        if op == "geo_distance":
            o = arg["origin"]
            if not isinstance(o, dict) or set(o) != {"lat", "lon"}:
                raise _bad(f"{at}.origin must be {{lat, lon}}", f"{at}.origin")
            lat, lon = _real(o["lat"], "lat", f"{at}.origin"), _real(o["lon"], "lon", f"{at}.origin")
            return "geo", lat, lon, self.key(arg["to"], f"{at}.to")

        def sub(k: str) -> tuple:
            return self.expr(arg[k], f"{at}.{k}", depth + 1)

        if op in ("div", "pow"):
            d = arg.get("by_zero_default")
            d = None if d is None else _real(d, "by_zero_default", f"{at}.by_zero_default")
            return ("div", sub("left"), sub("right"), d) if op == "div" else ("pow", sub("base"), sub("exponent"))
        midpoint = 0.5 if arg.get("midpoint") is None else _real(arg["midpoint"], "midpoint", f"{at}.midpoint")
        scale = 1.0 if arg.get("scale") is None else _real(arg["scale"], "scale", f"{at}.scale")
        if op == "lin_decay" and not 0.0 <= midpoint <= 1.0:
            raise _bad(f"Linear decay midpoint should be in the range [0.0, 1.0], got {midpoint}", f"{at}.midpoint")
        if op != "lin_decay" and not 0.0 < midpoint < 1.0:
            raise _bad(f"Decay midpoint should be in the range (0.0, 1.0), got {midpoint}", f"{at}.midpoint")
        if scale <= 0.0:
            raise _bad(f"Scale must be non-zero positive, got {scale}", f"{at}.scale")
        return op, sub("x"), None if arg.get("target") is None else sub("target"), midpoint, scale


def parse(spec: FormulaSpec, parse_filter: Callable[[Any, str], Filter | None]) -> Formula:
    """The :class:`Formula` of ``spec`` (module docstring's grammar); ``parse_filter(raw, param)`` parses the
    filter of a ``{"filter": ...}`` condition (None: every point matches), raising for a bad one.

    Raises:
        InvalidCollectionRequest: a malformed expression or default key, a bad datetime constant or decay
            parameter; what ``parse_filter`` raises.
    """
    p = _Parser(parse_filter)
    tree = p.expr(spec.expression, f"{spec.param}.formula", 0)
    raw = spec.defaults if spec.defaults is not None else {}
    if not isinstance(raw, dict):
        raise _bad(f"{spec.param}.defaults must be an object", f"{spec.param}.defaults")
    defaults: dict[str, Any] = {}
    for key, value in raw.items():  # keys parse as variables: "$score" and "$score[0]" share a default
        kind, k = _variable(key, f"{spec.param}.defaults") if key.startswith("$score") else ("v", key)
        defaults[f"$score[{k}]" if kind == "s" else k] = value
    return Formula(tree, defaults, p.filters, spec.param)
