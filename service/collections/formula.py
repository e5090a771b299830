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
* a score is a float32 (Qdrant's score type), which must be finite; :func:`rescore` scores every point of every
  prefetch (in the order first seen), best first (ties keep that order), keeps the first ``limit``, then those
  scoring at least ``score_threshold``.

Every error is an :class:`~.errors.InvalidCollectionRequest` naming the request field.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from service.collections.conditions import geo_distance, parse_datetime, parse_path, values_at
from service.collections.errors import InvalidCollectionRequest
from service.collections.filter_match import matches
from service.collections.filters import And, Filter, HasVector, Ids, MinShould, Nested, Not, Or
from service.collections.vector_backend import Hit

MAX_DEPTH = 32  # nesting of an expression
MAX_NODES = 1024  # operators, operands and conditions of one expression
LISTS = ("sum", "mult", "max", "min")
UNARY = ("neg", "abs", "sqrt", "exp", "log10", "ln", "acosh")
DECAYS = ("lin_decay", "exp_decay", "gauss_decay")
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
#: each unary operator's function and the operands it is defined for (None: all, and it cannot fail)
_UNARY: dict[str, tuple[Callable[[float], float], Callable[[float], bool] | None]] = {
    "neg": (operator.neg, None),
    "abs": (abs, None),
    "sqrt": (math.sqrt, lambda x: x >= 0),
    "exp": (math.exp, lambda x: True),
    "log10": (math.log10, lambda x: x > 0),
    "ln": (math.log, lambda x: x > 0),
    "acosh": (math.acosh, lambda x: x >= 1),
}
_bad = InvalidCollectionRequest  # (message, param)
_SCORE = re.compile(r"\$score(?:\[([0-9]+)\])?\Z")


@dataclass(frozen=True)
class FormulaSpec:
    """A formula query as requested: ``expression`` and ``defaults`` in the module docstring's grammar; ``param``:
    the request field holding it (errors name ``{param}.formula``/``{param}.defaults``)."""

    expression: Any
    defaults: dict[str, Any] = field(default_factory=dict)
    param: str = "query"


def _non_finite(expr: str, param: str) -> InvalidCollectionRequest:
    return _bad(f"The expression {expr} produced a non-finite number", param)


def _wrong(kind: str, key: str, why: str, param: str) -> InvalidCollectionRequest:
    return _bad(f"Expected {kind} value for {key} in the payload and/or in the formula defaults. Error: {why}", param)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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
    if not _number(v) or not math.isfinite(v):
        raise _bad(f"{param}: {what} must be a finite number", param)
    return float(v)


class Formula:
    """A parsed formula (:func:`parse`): :meth:`score` evaluates it for one point."""

    def __init__(self, tree: Any, defaults: dict[str, Any], filters: list[Filter | None], param: str) -> None:
        self.tree, self.defaults, self.filters, self.param = tree, defaults, filters, param

    def vector_names(self) -> set[str]:
        """The vectors its conditions ask points to hold (``$has_vector``), which :meth:`bind_vectors` resolves."""

        def walk(f: Any) -> set[str]:
            inner = [*getattr(f, "parts", ()), *([f.part] if isinstance(f, (Not, Nested)) else [])]
            return {f.name} if isinstance(f, HasVector) else set().union(*map(walk, inner))

        return set().union(*map(walk, self.filters))

    def bind_vectors(self, holders: dict[str, tuple[int | str, ...]]) -> Formula:
        """This formula with each ``$has_vector: NAME`` condition replaced by the ids of the points that hold the
        vector (``holders[NAME]``), so that :meth:`score` evaluates conditions on a payload and an id alone."""

        def bind(f: Any) -> Any:
            if isinstance(f, HasVector):
                return Ids(holders.get(f.name, ()))
            if isinstance(f, (And, Or, MinShould)):
                return replace(f, parts=tuple(bind(p) for p in f.parts))
            if isinstance(f, (Not, Nested)):
                return replace(f, part=bind(f.part))
            return f

        return Formula(self.tree, self.defaults, [bind(f) for f in self.filters], self.param)

    def score(self, scores: Sequence[float | None], payload: dict[str, Any], point_id: int | str) -> float:
        """The formula's score (a float32 value) of the point ``point_id`` with ``payload``, whose score in
        prefetch ``i`` is ``scores[i]`` (None: not among its hits).

        Raises:
            InvalidCollectionRequest: a value of the wrong type, a non-finite result (module docstring).
        """
        value = self._eval(self.tree, scores, payload, point_id)
        with np.errstate(over="ignore"):
            f32 = np.float32(value)
        if not np.isfinite(f32):
            raise _non_finite(f"{value} as f32 = {f32}", self.param)
        return float(f32)

    def _lookup(self, key: str, payload: dict[str, Any], kind: str) -> Any:
        value = values_at(payload, key) or self.defaults.get(key)  # several values: a list, no number
        if isinstance(value, list) and len(value) <= 1:
            value = value[0] if value else None
        if value is None:
            raise _wrong(kind, key, "no value in the payload nor in the formula defaults", self.param)
        return value

    def _eval(self, t: tuple, scores: Sequence[float | None], payload: dict[str, Any], pid: int | str) -> Any:
        op = t[0]
        ev = self._eval
        if op == "c":
            return t[1]
        if op == "s":
            got, d = scores[t[1]] if t[1] < len(scores) else None, self.defaults.get(f"$score[{t[1]}]")
            return got if got is not None else float(d) if _number(d) else 0.0
        if op == "v":
            v = self._lookup(t[1], payload, "number")
            if not _number(v):
                raise _wrong("number", t[1], "Value is not a number", self.param)
            return float(v) if abs(v) < 1e308 else math.copysign(math.inf, v)  # an integer past the float range
        if op == "f":
            return 1.0 if matches(self.filters[t[1]], payload, pid) else 0.0
        if op == "mult":
            factors = []
            for e in t[1]:
                if (x := ev(e, scores, payload, pid)) == 0.0:
                    return x  # the factors after a zero are not evaluated
                factors.append(x)
            return math.prod(factors)
        if op == "sum":
            return sum(ev(e, scores, payload, pid) for e in t[1])
        if op in ("max", "min"):
            acc, pick = (-math.inf, max) if op == "max" else (math.inf, min)
            for e in t[1]:
                acc = pick(acc, ev(e, scores, payload, pid))  # a NaN operand leaves acc as it is
            return acc
        if op in DECAYS:
            return self._decay(t, scores, payload, pid)
        if op in ("div", "pow"):
            return self._binary(t, scores, payload, pid)
        if op == "geo":
            g = self._lookup(t[3], payload, "geo point")
            lat, lon = (g.get("lat"), g.get("lon")) if isinstance(g, dict) else (None, None)
            if not (_number(lat) and _number(lon)):
                raise _wrong("geo point", t[3], "Value is not a geo point {lat, lon}", self.param)
            return geo_distance(t[1], t[2], float(lat), float(lon))
        if op == "dt":
            dt = parse_datetime(self._lookup(t[1], payload, "datetime"))
            if dt is None:
                raise _wrong("datetime", t[1], "Value is not a datetime string", self.param)
            return dt.timestamp()
        return self._unary(op, ev(t[1], scores, payload, pid))

    def _unary(self, op: str, x: Any) -> Any:
        fn, domain = _UNARY[op]
        if domain is None:
            return fn(x)
        try:
            y = fn(x) if domain(x) else None
        except OverflowError:
            y = None
        if y is not None and (op != "acosh" or math.isfinite(y)):  # sqrt, exp, ln, log10 of infinity: infinity
            return y
        raise _non_finite(f"√{x}" if op == "sqrt" else f"{op}({x})", self.param)

    def _binary(self, t: tuple, scores: Sequence[float | None], payload: dict[str, Any], pid: int | str) -> Any:
        a = self._eval(t[1], scores, payload, pid)
        if t[0] == "div" and a == 0.0:
            return a  # the divisor is not evaluated
        b = self._eval(t[2], scores, payload, pid)
        if t[0] == "div" and b == 0.0 and t[3] is not None:
            return t[3]
        try:  # OverflowError: too large for a float; ValueError: undefined (a negative base, a fractional exponent)
            r = math.pow(a, b) if t[0] == "pow" else a / b if b != 0.0 else math.inf
        except (OverflowError, ValueError):
            r = math.nan
        if math.isfinite(r):
            return r
        raise _non_finite(f"{a}^{b}" if t[0] == "pow" else f"{a}/{b}", self.param)

    def _decay(self, t: tuple, scores: Sequence[float | None], payload: dict[str, Any], pid: int | str) -> float:
        op, x, target, midpoint, scale = t
        x = self._eval(x, scores, payload, pid)
        target = 0.0 if target is None else self._eval(target, scores, payload, pid)
        if op == "lin_decay":
            lam = (1.0 - midpoint) / scale
            return max(0.0, -lam * abs(x - target) + 1.0)
        if op == "exp_decay":
            return math.exp(math.log(midpoint) / scale * abs(x - target))
        lam, d = math.log(midpoint) / (scale * scale), x - target
        return math.exp(lam * d * d)


class _Parser:
    def __init__(self, parse_filter: Callable[[Any, str], Filter | None]) -> None:
        self.parse_filter = parse_filter
        self.filters: list[Filter | None] = []
        self.nodes = 0

    def expr(self, raw: Any, at: str, depth: int) -> tuple:
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise _bad(f"{at}: an expression nests at most {MAX_DEPTH} deep and holds at most {MAX_NODES} terms", at)
        if _number(raw):
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


async def rescore(
    svc: Any,
    name: str,
    formula: Formula,
    sources: Sequence[Sequence[Hit]],
    limit: int,
    score_threshold: float | None,
    with_payload: bool,
) -> list[Hit]:
    """The points of ``sources`` (the prefetches' hits, best first, each hit with its point's payload) re-scored by
    ``formula``, best first: the first ``limit``, then those scoring at least ``score_threshold``; hits carry their
    payload when ``with_payload``. ``svc`` (the :class:`~.service.CollectionService`) reads which of the points
    hold the vectors that ``$has_vector`` conditions name.

    Raises:
        InvalidCollectionRequest: as :meth:`Formula.score`, for the first point (in the order first seen) it fails.
    """
    first: dict[int | str, Hit] = {}
    for h in itertools.chain.from_iterable(sources):
        first.setdefault(h.id, h)
    scores = [{h.id: h.score for h in hits} for hits in sources]
    if names := formula.vector_names():  # the points holding the vectors $has_vector names, read in pages of ids
        ids, holders = list(first), {}
        step = max(1, min(svc.settings.max_top_k, svc.settings.max_filter_values - 1))
        for vname in sorted(names):
            where = [{"$and": [{"$ids": ids[k : k + step]}, {"$has_vector": vname}]} for k in range(0, len(ids), step)]
            pages = [(await svc.scroll(name, None, step, w, False, None, False, False))[0] for w in where]
            holders[vname] = tuple(p["id"] for page in pages for p in page)
        formula = formula.bind_vectors(holders)
    out = [
        Hit(
            pid,
            formula.score([s.get(pid) for s in scores], h.payload or {}, pid),
            h.text,
            h.payload if with_payload else None,
        )
        for pid, h in first.items()
    ]
    out.sort(key=lambda h: h.score, reverse=True)
    return [h for h in out[:limit] if score_threshold is None or h.score >= score_threshold]
