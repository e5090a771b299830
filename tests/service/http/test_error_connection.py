"""An unexpected error (a 500) over a kept-alive HTTP/1.1 connection, on uvicorn with the service's protocol class
(``service.http.protocol``), its error handlers (``service.http.errors.install_error_handlers``) and middleware.

Starlette raises such an error on to the server once the 500 is sent, and uvicorn then closes the connection; the
answer must say ``Connection: close`` (RFC 9112, section 9.6), else a client that reuses the connection for its next
request sees it reset. Answers other than that 500 (a 200, a handled 4xx or 5xx) keep the connection open.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from harness.ports import free_port
from service.collections.errors import BackendUnavailable
from service.http.errors import install_error_handlers
from service.http.middleware import ServiceMiddleware
from service.http.protocol import protocol_class
from service.http.qdrant import error_body as qdrant_error
from service.metrics import Metrics

pytestmark = pytest.mark.timeout(60)


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app, {"/qdrant": qdrant_error})

    @app.get("/ok")
    async def ok() -> dict:
        return {"ok": True}

    @app.get("/boom")
    @app.get("/qdrant/boom")
    async def boom() -> dict:
        raise RuntimeError("a bug")

    @app.get("/unavailable")
    async def unavailable() -> dict:
        raise BackendUnavailable("vector store down", 2.0)

    app.add_middleware(ServiceMiddleware, metrics=Metrics(), api_keys=[], max_payload_bytes=10_000)
    return app


@pytest.fixture(scope="module")
def port():
    port = free_port()
    config = uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_level="critical", http=protocol_class())
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield port
    server.should_exit = True
    thread.join(30)


def read_response(s: socket.socket, buf: bytes) -> tuple[int, dict[str, str], bytes, bytes]:
    """One response (Content-Length framed) from ``s``: status, headers, body, and the bytes read past it."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"connection closed before a response: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    n = int(headers["content-length"])
    while len(rest) < n:
        chunk = s.recv(65536)
        assert chunk, "connection closed inside a body"
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:n], rest[n:]


def closed_by_server(s: socket.socket, wait_s: float = 5.0) -> bool:
    """Whether the server closes ``s`` within ``wait_s`` (uvicorn's keep-alive timeout is 5 s)."""
    s.settimeout(wait_s)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("path", ["/boom", "/qdrant/boom"])
def test_a_500_says_connection_close_and_closes(port, path):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body, rest = read_response(s, b"")
        assert status == 200 and "close" not in headers.get("connection", "") and json.loads(body) == {"ok": True}
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())  # the same connection
        status, headers, body, rest = read_response(s, rest)
        assert status == 500 and "internal error (id " in body.decode(), body
        assert headers.get("connection", "").lower() == "close", headers
        assert rest == b"" and closed_by_server(s)


def test_handled_errors_keep_the_connection(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        rest = b""
        for path, want in (("/unavailable", 503), ("/nope", 404), ("/ok", 200)):
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status, headers, _, rest = read_response(s, rest)
            assert status == want and "close" not in headers.get("connection", ""), (path, headers)
        assert not closed_by_server(s, 0.5)


def test_a_client_reusing_its_connections_goes_on_after_a_500(port):
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
        for _ in range(3):
            assert c.get("/boom").status_code == 500
            assert c.get("/ok").json() == {"ok": True}
