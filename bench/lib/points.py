"""A collection of random unit vectors with small payloads, filled through the Qdrant-compatible API: what the Qdrant
read and snapshot benchmarks measure on."""

from __future__ import annotations

import time

import httpx
import numpy as np

D, BATCH, GENRES, TAGS = 384, 256, 10, 20  # 256 points of 6-decimal floats: ~1 MB, under the 2 MB body cap


def fill(c: httpx.Client, name: str, n: int) -> float:
    """Create ``name`` and upsert ``n`` points; returns the seconds the upserts took."""
    r = c.put(f"/qdrant/collections/{name}", json={"vectors": {"size": D, "distance": "Cosine"}})
    r.raise_for_status()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        x = rng.standard_normal((min(BATCH, n - start), D)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        pts = [{"id": start + i, "vector": [round(float(f), 6) for f in v],
                "payload": {"genre": f"g{(start + i) % GENRES}", "row": start + i,
                            "tags": [f"t{(start + i) % TAGS}", f"t{(start + i) * 7 % TAGS}"]}}
               for i, v in enumerate(x)]  # fmt: skip
        c.put(f"/qdrant/collections/{name}/points", json={"points": pts}).raise_for_status()
    return time.perf_counter() - t0
