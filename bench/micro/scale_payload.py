"""The payload indexes of the 10M dense scale bench (:mod:`bench.micro.scale_bench`): built through the HTTP API as a
user with filters would, timed, with one-point upserts sent beside each build (how long a build holds writes)."""

from __future__ import annotations

import threading
import time


def payload_indexes(c, name: str, again: bool = False, point: dict | None = None) -> dict[str, float]:
    """Index the payload keys ``g`` and ``h`` (integer) of the collection ``name`` unless indexed already
    (``again``: dropped and built again), as a user with filters would (a filter on an unindexed key reads every
    payload: seconds at 10M); returns the seconds each build took and, with ``point`` (a point to upsert), the longest a one-point upsert of it, sent
    every half second meanwhile, took (ms: how long a build holds writes)."""
    import httpx

    for key in ("g", "h") if again else ():
        c.delete(f"/collections/{name}/payload-indexes/{key}").raise_for_status()
    have = c.get(f"/collections/{name}").json().get("payload_indexes", {})
    took: dict[str, float] = {}
    waits: list[float] = []
    building = threading.Event()

    def writes() -> None:
        w = httpx.Client(base_url=str(c.base_url), timeout=3600)
        while building.is_set():
            t0 = time.perf_counter()
            w.put(f"/collections/{name}/points", json={"points": [point]}).raise_for_status()
            waits.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.5)

    for key in ("g", "h"):
        if key not in have:
            building.set()
            writer = threading.Thread(target=writes) if point is not None else None
            t0 = time.perf_counter()
            if writer is not None:
                writer.start()
            c.put(f"/collections/{name}/payload-indexes/{key}", json={"schema": "integer"}).raise_for_status()
            took[key] = round(time.perf_counter() - t0, 1)
            building.clear()
            if writer is not None:
                writer.join()
                took[f"{key}_longest_write_ms"] = round(max(waits, default=0.0), 1)
                waits.clear()
            print(f"payload index {key}: {took}", flush=True)
    return took
