"""The points the expensive-query tests and the hostile benchmark load: client vectors and payloads built so that
every expensive query kind (array keys, geo arrays, full-text, order_by on an array) has work to do, and Qdrant
``geo_polygon`` rings of any size."""

from __future__ import annotations

from typing import Any

import numpy as np

DIM, TAGS = 32, 20  # vector size; tags per point


def vector(rng: np.random.Generator, dim: int = DIM) -> list[float]:
    """A random Gaussian vector of ``dim`` floats, rounded to 4 decimals (a short JSON body)."""
    return rng.normal(size=dim).round(4).tolist()


def payload(i: int, rng: np.random.Generator) -> dict[str, Any]:
    """Point ``i``'s payload: ``tags`` (``TAGS`` keywords of 500), ``text`` (12 words of 300), ``n`` (``i``) and
    ``items`` (20 objects with a random ``loc`` within latitude ±60, longitude ±170)."""
    return {
        "tags": [f"t{(i * 7 + j) % 500}" for j in range(TAGS)],
        "text": " ".join(f"w{(i + j * 13) % 300}" for j in range(12)),
        "n": i,
        "items": [
            {"loc": {"lat": float(rng.uniform(-60, 60)), "lon": float(rng.uniform(-170, 170))}} for _ in range(20)
        ],
    }


def polygon(n: int, scale: float = 1.0) -> dict[str, Any]:
    """A closed ring of ``n`` points (an ellipse around (0, 0), ``scale`` x 50 degrees of latitude by ``scale`` x 150
    of longitude) as Qdrant's ``geo_polygon``."""
    a = np.linspace(0, 2 * np.pi, n - 1, endpoint=False)
    pts = [{"lat": float(50 * scale * np.sin(t)), "lon": float(150 * scale * np.cos(t))} for t in a]
    return {"exterior": {"points": [*pts, pts[0]]}}
