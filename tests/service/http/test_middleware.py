"""``service.http.middleware.ServiceMiddleware`` as pure ASGI, in-process (``httpx.ASGITransport``, no network).

Two apps sit behind it:

* the real service app (``service.app.create_app`` with real settings, no lifespan, so no model is loaded) for
  API keys, the admin key check and the body rules in front of real routes;
* a small Starlette app whose routes record what they see (the replayed body, their own cancellation) for the
  body replay, the time budget, client disconnects and the metrics.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from artifact_contract import load_manifest
from service.app import create_app
from service.http.middleware import ServiceMiddleware
from service.metrics import Metrics
from service.settings import Settings

pytestmark = pytest.mark.timeout(120)

USER = {"Authorization": "Bearer user-key"}
ADMIN = {"Authorization": "Bearer admin-key"}
JSON = {"Content-Type": "application/json"}
LIMIT = 1000
BUDGET_S = 0.2


def count(metrics: Metrics, route: str, method: str, status: int) -> float:
    v = metrics.registry.get_sample_value(
        "embed_requests_total", {"route": route, "method": method, "status": str(status)}
    )
    return v or 0.0


def call(app, scenario) -> None:
    """``asyncio.run(scenario(client))`` with an httpx client speaking ASGI to ``app``."""

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
            await scenario(client)

    asyncio.run(main())


# --------------------------------------------------------------------------------------------- the real service app
@pytest.fixture
def service(default_artifact, tmp_path):
    settings = Settings(
        models_dir=str(default_artifact.parent),
        data_dir=str(tmp_path / "data"),
        api_keys=["user-key"],
        admin_api_keys=["admin-key"],
        max_payload_bytes=LIMIT,
        qdrant_max_payload_bytes=2 * LIMIT,
    )
    return create_app(settings)


def test_api_keys(service, default_artifact):
    metrics = service.state.metrics
    version = load_manifest(default_artifact).version

    async def scenario(c: httpx.AsyncClient) -> None:
        r = await c.get("/v1/models")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key" and "missing API key" in r.json()["error"]["message"]
        for auth in ("Bearer wrong-key", "Basic dXNlci1rZXk6", "Bearer ", "user-key"):
            r = await c.get("/v1/models", headers={"Authorization": auth})
            assert r.status_code == 401 and r.json()["error"]["message"] == "invalid API key", auth
        for headers in (USER, ADMIN, {"Authorization": "bearer   user-key "}):  # admin keys work everywhere
            r = await c.get("/v1/models", headers=headers)
            assert r.status_code == 200 and r.json()["object"] == "list"
        # user key on /admin: past the middleware, refused by the admin check
        r = await c.post("/admin/models/reload", headers=USER)
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_permissions"
        r = await c.post("/admin/models/reload", headers=ADMIN)
        assert r.status_code == 200 and f"{default_artifact.name}:{version}" in r.json()["available"]
        # open without a key: health, readiness, metrics, the console's static files
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ready")).status_code == 503  # open, and honest: no model loaded (no lifespan)
        assert "embed_requests_total" in (await c.get("/metrics")).text
        r = await c.get("/console/")
        assert r.status_code == 200 and "<html" in r.text.lower()
        assert (await c.post("/console/", content=b"{}", headers=JSON)).status_code == 401  # only GET/HEAD open
        assert (await c.options("/v1/embeddings")).status_code == 405  # preflight: not asked for a key
        for path in ("/", "/ping"):  # TEI's liveness aliases: open to GET only
            assert (await c.get(path)).json() == {"status": "ok"}
        for path in ("/", "/embed", "/embeddings", "/tokenize", "/decode"):  # TEI's routes too: never open
            r = await c.post(path, json={"inputs": "x", "ids": [1]}, headers=JSON)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path

    call(service, scenario)
    assert count(metrics, "other", "GET", 401) == 5  # refused before routing: no route template
    assert count(metrics, "/v1/models", "GET", 200) == 3
    assert count(metrics, "/admin/models/reload", "POST", 403) == 1
    assert count(metrics, "/admin/models/reload", "POST", 200) == 1
    assert count(metrics, "/health", "GET", 200) == 1 and count(metrics, "/ready", "GET", 503) == 1


def test_admin_routes_are_disabled_without_keys(default_artifact, tmp_path):
    app = create_app(Settings(models_dir=str(default_artifact.parent), data_dir=str(tmp_path / "data")))

    async def scenario(c: httpx.AsyncClient) -> None:
        assert (await c.get("/v1/models")).status_code == 200  # no keys configured: no auth
        r = await c.post("/admin/models/reload", headers=ADMIN)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"

    call(app, scenario)


def test_body_rules_in_front_of_the_real_routes(service):
    metrics = service.state.metrics

    async def scenario(c: httpx.AsyncClient) -> None:
        async def post(content, headers=None, path="/v1/embeddings"):
            r = await c.post(path, content=content, headers={**USER, **JSON, **(headers or {})})
            return r.status_code, r.json()["error"]

        status, err = await post(b'{"input": "a"}', {"Content-Type": "text/plain"})
        assert (status, err["code"]) == (415, "unsupported_media_type") and "'text/plain'" in err["message"]
        status, err = await post(b'{"input": "caf\\udcff"}')
        assert (status, err["code"]) == (422, "invalid_text") and "\\udcff" in err["message"]
        status, err = await post(b'{"input": ["ok", "\\ud83d then text"]}', path="/similarity")
        assert (status, err["code"]) == (422, "invalid_text") and "\\ud83d" in err["message"]
        status, err = await post(b'{"input": "' + b"x" * 2 * LIMIT + b'"}')
        assert (status, err["code"]) == (413, "payload_too_large")
        assert f"is {2 * LIMIT + 13} bytes; the limit is {LIMIT} bytes" in err["message"]
        status, err = await post(b'{"input": "a"}', {"Content-Length": "fourteen"})
        assert (status, err["code"]) == (400, "invalid_request")

        async def chunks():
            for _ in range(3):
                yield b" " * 400  # no Content-Length: found too large while reading

        status, err = await post(chunks())
        assert (status, err["code"]) == (413, "payload_too_large") and "more than 1199 bytes" in err["message"]
        r = await c.post("/v1/embeddings", content=b"x" * 2 * LIMIT, headers=JSON)  # no key: auth comes first
        assert r.status_code == 401

    call(service, scenario)
    assert count(metrics, "other", "POST", 413) == 2 and count(metrics, "other", "POST", 401) == 1
    assert count(metrics, "other", "POST", 422) == 2 and count(metrics, "other", "POST", 415) == 1


# --------------------------------------------------------------------------------------------- a small recording app
class Probe:
    """A Starlette app behind the middleware, recording the bodies it read and the requests cancelled in it."""

    def __init__(self, request_timeout_s: float = BUDGET_S) -> None:
        self.bodies: list[bytes] = []
        self.cancelled: list[str] = []
        self.entered = asyncio.Event()
        self.metrics = Metrics()
        routes = [
            Route("/echo", self.echo, methods=["POST", "PUT"]),
            Route("/items/{item_id}", self.item),
            Route("/slow", self.hang),
            Route("/hang", self.hang, methods=["POST"]),
            Route("/admin/slow", self.admin_slow),
            Route("/collections/c/snapshots/s", self.admin_slow),  # a download as long as the data
            Route("/stream", self.stream),
        ]
        self.app = ServiceMiddleware(
            Starlette(routes=routes),
            metrics=self.metrics,
            api_keys=[],
            max_payload_bytes=LIMIT,
            request_timeout_s=request_timeout_s,
        )

    async def echo(self, request: Request) -> JSONResponse:
        body = await request.body()
        self.bodies.append(body)
        return JSONResponse({"n": len(body)})

    async def item(self, request: Request) -> JSONResponse:
        return JSONResponse({"id": request.path_params["item_id"]})

    async def hang(self, request: Request) -> JSONResponse:
        await request.body()
        self.entered.set()
        try:
            await asyncio.Event().wait()  # never set: only cancellation ends it
        except asyncio.CancelledError:
            self.cancelled.append(request.url.path)
            raise
        raise AssertionError("unreachable")

    async def admin_slow(self, request: Request) -> JSONResponse:
        await asyncio.sleep(3 * BUDGET_S)
        return JSONResponse({"done": True})

    async def stream(self, request: Request) -> StreamingResponse:
        async def parts():
            yield b"first part;"
            await asyncio.Event().wait()

        return StreamingResponse(parts(), media_type="text/plain")


VALID_BODIES = [
    (b'{"t": "\\ud83d\\ude00"}', JSON),  # a paired surrogate is text
    (b'{"t": "\\\\udcff"}', JSON),  # an escaped backslash, then the letters udcff: text
    (b'{"t": 1}', {"Content-Type": "application/json; charset=utf-8"}),
    (b'{"t": 2}', {"Content-Type": "application/vnd.api+json"}),
    (b'{"t": 3}', {}),  # no Content-Type: taken as JSON
    (b"", {"Content-Type": "text/plain"}),  # no body: nothing to refuse
]


def test_the_app_reads_exactly_the_body_that_was_sent():
    probe = Probe()

    async def scenario(c: httpx.AsyncClient) -> None:
        async def chunks():
            for i in range(3):
                yield bytes([48 + i]) * 300

        for body, headers in VALID_BODIES:
            r = await c.post("/echo", content=body, headers=headers)
            assert r.status_code == 200 and r.json() == {"n": len(body)}, body
        r = await c.put("/echo", content=chunks(), headers=JSON)  # chunked, under the limit
        assert r.status_code == 200 and r.json() == {"n": 900}
        r = await c.post("/echo", content=b"{" + b" " * (LIMIT - 2) + b"}", headers=JSON)  # exactly the limit
        assert r.status_code == 200 and r.json() == {"n": LIMIT}

    call(probe.app, scenario)
    assert probe.bodies[:-2] == [b for b, _ in VALID_BODIES]
    assert probe.bodies[-2] == b"0" * 300 + b"1" * 300 + b"2" * 300
    assert count(probe.metrics, "/echo", "POST", 200) == 7 and count(probe.metrics, "/echo", "PUT", 200) == 1


def test_metrics_count_route_templates_and_statuses():
    probe = Probe()

    async def scenario(c: httpx.AsyncClient) -> None:
        for i in (1, 2, 3):
            assert (await c.get(f"/items/{i}")).json() == {"id": str(i)}
        assert (await c.get("/no/such/path")).status_code == 404
        assert (await c.get("/echo")).status_code == 405
        assert (await c.post("/echo", content=b"x" * (LIMIT + 1), headers=JSON)).status_code == 413

    call(probe.app, scenario)
    m = probe.metrics
    assert count(m, "/items/{item_id}", "GET", 200) == 3 and count(m, "/items/1", "GET", 200) == 0
    assert count(m, "other", "GET", 404) == 1 and count(m, "/echo", "GET", 405) == 1
    assert count(m, "other", "POST", 413) == 1 and probe.bodies == []  # refused before the app
    hist = m.registry.get_sample_value
    assert hist("embed_request_duration_seconds_count", {"route": "/items/{item_id}", "method": "GET"}) == 3


def test_past_the_budget_the_app_is_cancelled_and_503_answers():
    probe = Probe()

    async def scenario(c: httpx.AsyncClient) -> None:
        r = await c.get("/slow")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "request_timeout" and f"request_timeout_s={BUDGET_S:g}" in r.text
        assert probe.cancelled == ["/slow"]
        r = await c.get("/admin/slow")  # /admin has no time budget: it runs past it and answers
        assert r.status_code == 200 and r.json() == {"done": True}
        r = await c.get("/collections/c/snapshots/s")  # nor have snapshots
        assert r.status_code == 200 and r.json() == {"done": True}

    call(probe.app, scenario)
    assert count(probe.metrics, "/slow", "GET", 503) == 1 and count(probe.metrics, "/admin/slow", "GET", 200) == 1


async def raw(app, method: str, path: str, body: bytes, gone: asyncio.Event) -> list[dict]:
    """Drive ``app`` with hand-made ASGI messages: the body, then ``http.disconnect`` once ``gone`` is set.

    Returns the messages the app sent (httpx's ASGITransport cannot show a cut-short response or a client leaving).
    """
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("service", 80),
    }
    await app(scope, receive, send)
    return sent


def test_a_response_already_started_is_cut_short_without_a_503():
    probe = Probe()
    sent = asyncio.run(raw(probe.app, "GET", "/stream", b"", asyncio.Event()))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"first part;" and sent[1]["more_body"]
    assert count(probe.metrics, "/stream", "GET", 200) == 1 and count(probe.metrics, "/stream", "GET", 503) == 0


def test_a_client_that_disconnects_has_its_app_cancelled():
    probe = Probe(request_timeout_s=60.0)

    async def main() -> list[dict]:
        gone = asyncio.Event()
        request = asyncio.ensure_future(raw(probe.app, "POST", "/hang", b'{"input": "x"}', gone))
        await asyncio.wait_for(probe.entered.wait(), 30)  # the app is running, the body read
        gone.set()
        return await asyncio.wait_for(request, 30)

    sent = asyncio.run(main())
    assert probe.cancelled == ["/hang"] and sent == []  # cancelled; nobody left to answer
    assert count(probe.metrics, "/hang", "POST", 499) == 1


def test_qdrant_api_key_header_and_error_envelope(service):
    """Qdrant's ``api-key`` header (what qdrant-client's ``api_key=`` sends) is a key like ``Authorization: Bearer``;
    refusals under /qdrant come in Qdrant's error envelope, elsewhere in OpenAI's."""

    async def scenario(c: httpx.AsyncClient) -> None:
        r = await c.get("/qdrant/collections")
        assert r.status_code == 401 and set(r.json()) == {"status", "time"} and "API key" in r.json()["status"]["error"]
        r = await c.get("/qdrant/collections", headers={"api-key": "wrong-key"})
        assert r.status_code == 401 and r.json()["status"]["error"] == "invalid API key"
        r = await c.get("/qdrant", headers={"api-key": "user-key"})
        assert r.status_code == 200 and r.json()["title"].startswith("qdrant")
        r = await c.get("/v1/models", headers={"api-key": "user-key"})
        assert r.status_code == 200
        r = await c.post("/qdrant/collections/x/points/count", content=b"x" * (LIMIT + 1), headers={**JSON, **USER})
        assert r.status_code != 413  # /qdrant takes Qdrant's larger limit
        r = await c.post("/qdrant/collections/x/points/count", content=b"x" * (2 * LIMIT + 1), headers={**JSON, **USER})
        assert r.status_code == 413 and "(qdrant_max_payload_bytes)" in r.json()["status"]["error"]
        assert (await c.get("/v1/nothing", headers=USER)).json()["error"]["code"] == "not_found"

    call(service, scenario)
