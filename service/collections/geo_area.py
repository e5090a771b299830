"""Qdrant's geo conditions on payload values (https://qdrant.tech/documentation/concepts/filtering/, "Geo"): a value
``{"lon": x, "lat": y}`` (finite numbers) within ``radius`` meters of a centre (haversine on a sphere of the IUGG
mean Earth radius, 6,371,008.8 m), inside a bounding box (``top_left``, ``bottom_right``; across the antimeridian
when ``top_left.lon > bottom_right.lon``), or inside a polygon (an ``exterior`` ring and optional ``interiors`` holes;
a point on an edge of either is outside). :mod:`.conditions` parses the areas; :func:`any_inside` tests a key's values.

A polygon is tested by ray casting (:func:`in_ring`); on a large ring the same arithmetic runs on NumPy arrays of
its edges (:func:`ring_holds`): the same IEEE operations in the same order, so the same answers, without a Python
step per edge (which held the GIL for a millisecond per point tested against a ring of 1,000 points).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

EARTH_RADIUS_M = 6371008.8
VECTOR_EDGES = 32  # a ring of this many points or more is tested with NumPy (:func:`ring_holds`)
Ring = tuple[tuple[float, float], ...]


def finite(v: Any) -> float | None:
    """``v`` as a finite float, or None: not a number (a bool is none), not finite, or an integer past any float
    (``float()`` raises ``OverflowError`` on 10^400, which JSON holds and Python reads exactly)."""
    if type(v) not in (int, float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def geo_point(x: Any) -> tuple[float, float] | None:
    """``(lat, lon)`` of a payload value ``{"lat", "lon"}`` holding finite numbers, else None."""
    if not isinstance(x, dict):
        return None
    lat, lon = finite(x.get("lat")), finite(x.get("lon"))
    return None if lat is None or lon is None else (lat, lon)


def geo_distance(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Meters between two points on a sphere of radius :data:`EARTH_RADIUS_M` (haversine)."""
    p1, p2, dp, dl = map(math.radians, (lat1, lat2, lat2 - lat1, lon2 - lon1))
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(math.sqrt(a))


def in_ring(pt: tuple[float, float], ring: Ring, on_edge: bool) -> bool:
    """Whether ``pt`` is inside ``ring`` by ray casting over ``(lat, lon)`` pairs (a closing point repeated is
    dropped); a point on an edge answers ``on_edge``."""
    if len(ring) > 1 and ring[0] == ring[-1]:
        ring = ring[:-1]
    inside, j = False, len(ring) - 1
    px, py = pt
    for i in range(len(ring)):
        (xi, yi), (xj, yj) = ring[i], ring[j]
        if (
            py * (xi - xj) + yi * (xj - px) + yj * (px - xi) == 0
            and (xi - px) * (xj - px) <= 0
            and (yi - py) * (yj - py) <= 0
        ):
            return on_edge
        if (yi > py) != (yj > py) and px < (xj - xi) * (py - yi) / (yj - yi) + xi:
            inside = not inside
        j = i
    return inside


_EDGES: dict[int, tuple[Ring, tuple[np.ndarray, ...]]] = {}  # id(ring) -> (the ring, its edge arrays)


def _edges(ring: Ring) -> tuple[np.ndarray, ...]:
    """``(xi, yi, xj, yj)``: each edge's end ``i`` and start ``j = i - 1`` (wrapping) as :func:`in_ring` walks
    them, made once per ring while it is in use (a filter is tested on many rows)."""
    got = _EDGES.get(id(ring))
    if got is None or got[0] is not ring:
        if len(_EDGES) > 1024:
            _EDGES.clear()
        a = np.array(ring[:-1] if len(ring) > 1 and ring[0] == ring[-1] else ring, dtype=np.float64).reshape(-1, 2)
        got = _EDGES[id(ring)] = (ring, (a[:, 0], a[:, 1], np.roll(a[:, 0], 1), np.roll(a[:, 1], 1)))
    return got[1]


def ring_holds(pt: tuple[float, float], ring: Ring, on_edge: bool) -> bool:
    """:func:`in_ring`, on NumPy arrays of the ring's edges when it has :data:`VECTOR_EDGES` points or more: the same
    operations in the same order on each edge (an edge's division is computed for every edge but used, as in
    :func:`in_ring`, only where the edge straddles the point's ``lon``, where its divisor is not 0)."""
    if len(ring) < VECTOR_EDGES:
        return in_ring(pt, ring, on_edge)
    xi, yi, xj, yj = _edges(ring)
    px, py = pt
    with np.errstate(all="ignore"):
        edge = (py * (xi - xj) + yi * (xj - px) + yj * (px - xi) == 0) & ((xi - px) * (xj - px) <= 0)
        edge &= (yi - py) * (yj - py) <= 0
        if edge.any():  # in_ring answers on_edge at the first edge the point is on, whatever it counted before
            return on_edge
        cross = ((yi > py) != (yj > py)) & (px < (xj - xi) * (py - yi) / (yj - yi) + xi)
    return bool(np.count_nonzero(cross) % 2)


def any_inside(kind: str, area: tuple[Any, ...], values: list[Any]) -> bool:
    """Whether one of ``values`` is a geo point (:func:`geo_point`) inside the area ``kind`` (``radius``: ``(lat,
    lon, meters)``; ``box``: ``(top_left_lat, top_left_lon, bottom_right_lat, bottom_right_lon)``; ``polygon``:
    ``(exterior ring, *interior rings)`` of ``(lat, lon)``), as the module docstring defines them."""
    points = (p for p in map(geo_point, values) if p is not None)  # read up to the first one inside
    if kind == "radius":
        return any(geo_distance(lat, lon, area[0], area[1]) < area[2] for lat, lon in points)
    if kind == "box":
        tl_lat, tl_lon, br_lat, br_lon = area
        return any(
            ((lon > tl_lon or lon < br_lon) if tl_lon > br_lon else tl_lon < lon < br_lon) and tl_lat > lat > br_lat
            for lat, lon in points
        )
    exterior, *holes = area  # an edge of the exterior is outside, an edge of a hole is in the hole
    return any(ring_holds(p, exterior, False) and not any(ring_holds(p, h, True) for h in holes) for p in points)
