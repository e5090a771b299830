"""A polygon tested on NumPy arrays of its edges answers as the reference ray casting does, point for point:
vertices, points on edges (both answers of ``on_edge``), inside and outside, on integer grids (exact ties) and on
random coordinates."""

from __future__ import annotations

import random

import pytest

from service.collections.geo_area import VECTOR_EDGES, any_inside, in_ring, ring_holds


def _ring(rng: random.Random, n: int, grid: bool) -> tuple[tuple[float, float], ...]:
    if grid:
        pts = [(float(rng.randint(-5, 5)), float(rng.randint(-5, 5))) for _ in range(n - 1)]
    else:
        pts = [(rng.uniform(-60, 60), rng.uniform(-170, 170)) for _ in range(n - 1)]
    return (*pts, pts[0])


def _points(rng: random.Random, ring: tuple[tuple[float, float], ...], grid: bool) -> list[tuple[float, float]]:
    out = []
    for _ in range(30):
        r = rng.random()
        if r < 0.2:
            out.append(rng.choice(ring))  # a vertex
        elif r < 0.4:  # a midpoint: on an edge when the two vertices are consecutive
            i = rng.randrange(len(ring) - 1)
            (a, b), (c, d) = ring[i], ring[i + 1 if r < 0.3 else rng.randrange(len(ring))]
            out.append(((a + c) / 2, (b + d) / 2))
        elif grid:
            out.append((float(rng.randint(-6, 6)), float(rng.randint(-6, 6))))
        else:
            out.append((rng.uniform(-70, 70), rng.uniform(-180, 180)))
    return out


@pytest.mark.parametrize("grid", [True, False])
def test_numpy_ray_casting_answers_as_the_reference(grid):
    rng = random.Random(7)
    seen = set()
    for _ in range(300):
        ring = _ring(rng, rng.choice([VECTOR_EDGES, VECTOR_EDGES + 7, 200]), grid)
        for p in _points(rng, ring, grid):
            for on_edge in (False, True):
                want = in_ring(p, ring, on_edge)
                assert ring_holds(p, ring, on_edge) == want, (p, ring, on_edge)
                seen.add(want)
    assert seen == {True, False}


def test_a_polygon_with_a_hole_over_an_array_of_locations():
    square = lambda a: tuple((float(x), float(y)) for x, y in ((-a, -a), (-a, a), (a, a), (a, -a), (-a, -a)))  # noqa: E731
    big = tuple((-10.0 + 20 * i / 40, -10.0) for i in range(40)) + ((10.0, -10.0), (10.0, 10.0), (-10.0, 10.0))
    big += ((-10.0, -10.0),)
    assert len(big) >= VECTOR_EDGES
    hole = square(2)
    locs = [{"lat": 0, "lon": 0}, {"lat": 2, "lon": 0}]  # in the hole; on the hole's edge (in the hole)
    assert not any_inside("polygon", (big, hole), locs)
    assert any_inside("polygon", (big, hole), [*locs, {"lat": 5, "lon": 5}])
    assert not any_inside("polygon", (big, hole), [{"lat": -10, "lon": 0}, {"lat": 11, "lon": 0}, True, None])
