"""The parsed tree of a payload filter (:mod:`.filters` parses the grammar into it and defines its semantics; the
backends translate it). Leaves of Qdrant's richer conditions are defined in :mod:`.conditions`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from service.collections.conditions import Count, DateRange, Geo, Text


@dataclass(frozen=True)
class Match:
    """``payload[key]`` (or one element of it, when it is an array) equals one of ``values`` (JSON scalars)."""

    key: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Range:
    """``payload[key]`` is a number within the bounds given (None: unbounded on that side)."""

    key: str
    gt: float | int | None = None
    gte: float | int | None = None
    lt: float | int | None = None
    lte: float | int | None = None


@dataclass(frozen=True)
class Exists:
    """``payload`` has ``key`` (its value may be ``null``)."""

    key: str


@dataclass(frozen=True)
class Empty:
    """``payload[key]`` is missing, ``null`` or ``[]``."""

    key: str


@dataclass(frozen=True)
class Ids:
    """The point's id is one of ``ids`` (unsigned integers or strings)."""

    ids: tuple[int | str, ...]


@dataclass(frozen=True)
class HasVector:
    """The point holds the collection's named vector ``name`` (Qdrant's ``has_vector``); ``kind``: ``bound`` (the
    model-bound vector, which every point holds), ``dense`` or ``sparse`` (what the backends look it up in)."""

    name: str
    kind: str


@dataclass(frozen=True)
class And:
    """Every part holds."""

    parts: tuple[Filter, ...]


@dataclass(frozen=True)
class Or:
    """At least one part holds."""

    parts: tuple[Filter, ...]


@dataclass(frozen=True)
class Not:
    """The part does not hold."""

    part: Filter


@dataclass(frozen=True)
class MinShould:
    """At least ``count`` of the parts hold (Qdrant's ``min_should``)."""

    parts: tuple[Filter, ...]
    count: int


@dataclass(frozen=True)
class Nested:
    """One object element of the array at ``key`` satisfies ``part`` as a whole, ``part``'s keys relative to the
    element (Qdrant's ``nested``; ``key`` may end in ``[]``)."""

    key: str
    part: Filter


Filter = Union[  # noqa: UP007 (a runtime alias)
    Match, Range, Exists, Empty, Ids, HasVector, And, Or, Not, MinShould, Nested, Text, DateRange, Count, Geo
]
