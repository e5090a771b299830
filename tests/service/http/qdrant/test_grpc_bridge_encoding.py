"""The gRPC bridge's encoding of a large REST body (:func:`service.http.qdrant.grpc_bridge.encode`, run on a worker
thread as the bridge runs it) never holds the event loop: a ticker on the loop keeps ticking while an upsert of
1,024 points of 800 floats (16 MB of JSON) is converted and encoded, and the text is the standard library's."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
from qdrant_client import grpc as g
from qdrant_client import models
from qdrant_client.conversions.conversion import GrpcToRest as G
from qdrant_client.conversions.conversion import RestToGrpc as R

from service.http.qdrant.grpc_bridge import encode


def test_encoding_a_large_body_leaves_the_event_loop_ticking():
    rng = np.random.default_rng(0)
    points = [
        R.convert_point_struct(models.PointStruct(id=i, vector=rng.normal(size=800).tolist())) for i in range(1024)
    ]
    req = g.UpsertPoints(collection_name="c", points=points)

    def body() -> dict:
        return {"points": [G.convert_point_struct(p) for p in req.points]}

    async def main() -> tuple[bytes, float]:
        worst, last, done = 0.0, time.perf_counter(), False

        async def tick() -> None:
            nonlocal worst, last
            while not done:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                worst, last = max(worst, now - last), now

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0.05)
        out = await asyncio.to_thread(encode, body)
        done = True
        await ticker
        return out, worst

    out, worst = asyncio.run(main())
    expected = json.dumps({"points": [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in body()["points"]]},
                          ensure_ascii=False, separators=(",", ":")).encode()  # fmt: skip
    assert out == expected
    assert worst < 0.25, worst  # one json.dumps of the whole body held the GIL for about a second here
