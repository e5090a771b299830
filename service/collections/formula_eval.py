"""Evaluation of a parsed score-boosting formula (:func:`.formula.parse`; grammar and semantics in
:mod:`.formula`'s docstring): :class:`Formula` scores one point, :func:`rescore` re-scores the points a query's
prefetches found.

Every error is an :class:`~.errors.InvalidCollectionRequest` naming the request field.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from service.collections.conditions import geo_distance, parse_datetime, values_at
from service.collections.errors import InvalidCollectionRequest
from service.collections.filter_match import matches
from service.collections.filters import And, Filter, HasVector, Ids, MinShould, Nested, Not, Or
from service.collections.point_reads import PointReads
from service.collections.stopping import every, for_collection
from service.collections.vector_backend import Hit

DECAYS = ("lin_decay", "exp_decay", "gauss_decay")
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


def _non_finite(expr: str, param: str) -> InvalidCollectionRequest:
    return InvalidCollectionRequest(f"The expression {expr} produced a non-finite number", param)


def _wrong(kind: str, key: str, why: str, param: str) -> InvalidCollectionRequest:
    return InvalidCollectionRequest(
        f"Expected {kind} value for {key} in the payload and/or in the formula defaults. Error: {why}", param
    )


def is_number(v: Any) -> bool:
    """A JSON number (not a boolean)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def as_float(v: int | float) -> float:
    """A JSON number as a float: an integer past the float range (JSON has no bound on integer literals, Python's
    ``float()`` raises ``OverflowError`` on one) is an infinity of its sign."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


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
            return got if got is not None else as_float(d) if is_number(d) else 0.0
        if op == "v":
            v = self._lookup(t[1], payload, "number")
            if not is_number(v):
                raise _wrong("number", t[1], "Value is not a number", self.param)
            return as_float(v)
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
            lat, lon = (as_float(lat), as_float(lon)) if is_number(lat) and is_number(lon) else (math.nan, math.nan)
            if not (math.isfinite(lat) and math.isfinite(lon)):
                raise _wrong("geo point", t[3], "Value is not a geo point {lat, lon}", self.param)
            return geo_distance(t[1], t[2], lat, lon)
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
        d = x - target
        if d == 0.0:  # every decay is 1 at its target, whatever the scale (a tiny one makes the rate infinite)
            return 1.0
        if op == "lin_decay":
            lam = (1.0 - midpoint) / scale
            return max(0.0, -lam * abs(d) + 1.0)
        if op == "exp_decay":
            return math.exp(math.log(midpoint) / scale * abs(d))
        square = scale * scale  # 0.0 for a scale below 1e-162: the rate is then -infinity, the decay 0 off target
        lam = math.log(midpoint) / square if square > 0.0 else -math.inf
        return math.exp(lam * d * d)


async def rescore(
    reads: PointReads,
    name: str,
    formula: Formula,
    sources: Sequence[Sequence[Hit]],
    limit: int,
    score_threshold: float | None,
    with_payload: bool,
) -> list[Hit]:
    """The points of ``sources`` (the prefetches' hits, best first, each hit with its point's payload) re-scored by
    ``formula``, best first: the first ``limit``, then those scoring at least ``score_threshold``; hits carry their
    payload when ``with_payload``. ``reads`` reads which of the points hold the vectors that
    ``$has_vector`` conditions name.

    Raises:
        InvalidCollectionRequest: as :meth:`Formula.score`, for the first point (in the order first seen) it fails.
    """
    first: dict[int | str, Hit] = {}
    for h in itertools.chain.from_iterable(sources):
        first.setdefault(h.id, h)
    scores = [{h.id: h.score for h in hits} for hits in sources]
    if names := formula.vector_names():  # the points holding the vectors $has_vector names
        holders = {}
        for vname in sorted(names):
            held = await reads.retrieve(
                name, list(first), with_payload=False, with_text=False, where={"$has_vector": vname}
            )
            holders[vname] = tuple(p["id"] for p in held)
        formula = formula.bind_vectors(holders)

    def evaluate() -> list[Hit]:  # off the event loop, stopped with its request
        hits = []
        for i, (pid, h) in enumerate(first.items()):
            every(i)
            score = formula.score([s.get(pid) for s in scores], h.payload or {}, pid)
            hits.append(Hit(pid, score, h.text, h.payload if with_payload else None))
        return hits

    out = await reads.backend.run(for_collection(name, evaluate))
    out.sort(key=lambda h: h.score, reverse=True)
    return [h for h in out[:limit] if score_threshold is None or h.score >= score_threshold]
