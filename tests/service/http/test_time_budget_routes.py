"""Which requests the time budget (``request_timeout_s``) of ``service.http.middleware.ServiceMiddleware`` spares:
``/admin`` and the collection snapshot routes that take as long as their data (create, download, recover, upload),
matched as route templates, never as a substring of a path. A collection or alias whose name holds ``snapshots``
(``snapshots-x``) gets the budget on its other routes like any other.

Checked two ways: every route of the real app (``service.app.create_app``) against the exemption, with
``snapshots`` as each path parameter; and a slow request through the middleware in front of a small Starlette app
(pure ASGI, ``httpx.ASGITransport``) that answers 503 ``request_timeout`` past the budget.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from service.app import create_app
from service.http.middleware import ServiceMiddleware, untimed
from service.metrics import Metrics
from service.settings import Settings

pytestmark = pytest.mark.timeout(120)

BUDGET_S = 0.2
#: the endpoints that run without a budget (both dialects name theirs alike)
LONG_ENDPOINTS = {"create_snapshot", "download_snapshot", "recover_snapshot", "upload_snapshot"}


def api_routes(routes) -> Iterator[APIRoute]:
    """The API routes among ``routes``, those of included routers too (FastAPI keeps an included router whole, as
    one route holding the ``original_router``)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif getattr(route, "original_router", None) is not None:
            yield from api_routes(route.original_router.routes)


def test_the_real_apps_routes_and_the_exemption(default_artifact, tmp_path):
    app = create_app(Settings(models_dir=str(default_artifact.parent), data_dir=str(tmp_path / "data")))
    seen, n_routes = set(), 0
    for route in api_routes(app.routes):
        n_routes += 1
        for name in ("snapshots", "snapshots-x", "c"):  # every path parameter named like the snapshot routes
            path = re.sub(r"\{[^}]+\}", name, route.path)
            for method in route.methods:
                want = route.path.startswith("/admin") or route.endpoint.__name__ in LONG_ENDPOINTS
                assert untimed(method, path) == want, (method, route.path, path)
                if want and not route.path.startswith("/admin"):
                    seen.add((method, route.path))
    assert n_routes > 50 and len(seen) == 8, (n_routes, seen)  # 4 snapshot routes on the native API, 4 under /qdrant


class Slow:
    """A Starlette app whose routes (collection-like paths) answer after three budgets."""

    def __init__(self) -> None:
        paths = [
            ("/collections/{name}/points/count", ["POST"]),
            ("/qdrant/collections/{name}/points/count", ["POST"]),
            ("/collections/{name}/snapshots", ["GET", "POST"]),
            ("/collections/{name}/snapshots/{snapshot}", ["GET", "DELETE", "PUT"]),
            ("/qdrant/collections/{name}/snapshots/{snapshot}", ["GET", "PUT", "POST"]),
            ("/collections/{name}/snapshots/upload", ["POST"]),
        ]
        self.app = ServiceMiddleware(
            Starlette(routes=[Route(p, self.slow, methods=m) for p, m in paths]),
            metrics=Metrics(),
            api_keys=[],
            max_payload_bytes=1000,
            request_timeout_s=BUDGET_S,
        )

    async def slow(self, request: Request) -> JSONResponse:
        await request.body()
        await asyncio.sleep(3 * BUDGET_S)
        return JSONResponse({"done": True})


TIMED = [
    ("POST", "/collections/snapshots-x/points/count"),  # an alias or collection named like the routes
    ("POST", "/collections/snapshots/points/count"),
    ("POST", "/qdrant/collections/x-snapshots/points/count"),
    ("POST", "/qdrant/collections/snapshots/points/count"),
    ("GET", "/collections/snapshots/snapshots"),  # a list: quick
    ("DELETE", "/collections/c/snapshots/s"),
    ("PUT", "/collections/c/snapshots/s"),  # not the recover route
]
UNTIMED = [
    ("POST", "/collections/snapshots-x/snapshots"),  # create
    ("GET", "/collections/c/snapshots/s"),  # download
    ("PUT", "/collections/c/snapshots/recover"),
    ("POST", "/collections/c/snapshots/upload"),
    ("GET", "/qdrant/collections/snapshots/snapshots/s"),
    ("PUT", "/qdrant/collections/c/snapshots/recover"),
    ("POST", "/qdrant/collections/c/snapshots/upload"),
]


def test_slow_requests_past_the_budget_unless_exempt():
    slow = Slow()

    async def main() -> None:
        transport = httpx.ASGITransport(app=slow.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as c:
            for method, path in TIMED:
                r = await c.request(method, path, json={} if method != "GET" else None)
                assert r.status_code == 503 and r.json()["error"]["code"] == "request_timeout", (method, path, r.text)
            for method, path in UNTIMED:
                r = await c.request(method, path, json={} if method != "GET" else None)
                assert r.status_code == 200 and r.json() == {"done": True}, (method, path, r.text)

    asyncio.run(main())
