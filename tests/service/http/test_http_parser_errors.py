"""Requests the HTTP server's parser refuses before the app sees them (row 12 of the reliability issue: a
100,000-character URL path got uvicorn's plain-text ``Invalid HTTP request received.``) answer 400 in the service's
JSON error envelope, and the service goes on serving."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.server_utils import run_server


@pytest.fixture(scope="module")
def server(default_artifact, tmp_path_factory):
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("http-parser")) as s:
        yield s


def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # a 100k-character path
        b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",  # a header line without a colon
    ],
    ids=["100k-path", "malformed-header"],
)
def test_parser_errors_answer_in_the_json_envelope(server, request_bytes):
    status, headers, body = _raw(server.port, request_bytes)
    assert status == 400
    assert headers["content-type"].startswith("application/json"), (headers, body[:200])
    err = json.loads(body)["error"]
    assert err["code"] == "invalid_http_request" and err["type"] == "invalid_request_error"
    assert err["message"].startswith("malformed HTTP request") and set(err) == {"message", "type", "param", "code"}
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200  # still serving
