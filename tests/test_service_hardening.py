"""Hostile input against the real service: unpaired surrogates, non-JSON bodies, admin rights, key files.

Each case gets its 4xx with a JSON error body naming what is wrong, and the server keeps answering.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from service.middleware import unpaired_surrogate
from tests.server_utils import run_server
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(300)

USER, ADMIN = "user-key-1", "admin-key-1"


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    work = tmp_path_factory.mktemp("hardening")
    keys = work / "keys.txt"
    keys.write_text(f"# user keys, one per line\n{USER}\n")
    args = ["--default-model", default_artifact.name, "--intra-op-threads", "1", "--log-level", "warning",
            "--api-keys-file", str(keys), "--admin-api-keys", ADMIN]  # fmt: skip
    with run_server(default_artifact.parent, workdir=work, args=args) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {USER}"}) as c:
        yield c


def _post_raw(c: httpx.Client, path: str, raw: str, method: str = "POST") -> httpx.Response:
    return c.request(method, path, content=raw.encode(), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    "method, path, raw",
    [
        ("POST", "/v1/embeddings", '{"input": "\\udcff"}'),
        ("POST", "/v1/embeddings", '{"input": ["fine", "half an emoji \\ud83d"]}'),
        ("POST", "/embed", '{"inputs": ["\\ud800"]}'),
        ("POST", "/similarity", '{"source_sentence": "a", "sentences": ["\\udfff b"]}'),
        ("PUT", "/collections/hostile/points", '{"points": [{"id": 1, "text": "ok", "payload": {"\\udcff": 1}}]}'),
        ("POST", "/collections/hostile/search", '{"text": "q", "filter": {"genre": "\\udcff"}}'),
        ("POST", "/collections/hostile/points/delete", '{"filter": {"\\ud800k": 1}}'),
    ],
)
def test_unpaired_surrogates_are_422_everywhere(client, method, path, raw):
    assert client.put("/collections/hostile", json={"index": "flat", "metric": "cosine"}).status_code in (200, 409)
    r = _post_raw(client, path, raw, method)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_text" and "surrogate" in err["message"]
    assert client.get("/health").status_code == 200


def test_paired_surrogates_are_text(client):
    r = _post_raw(client, "/v1/embeddings", '{"input": "a smile \\ud83d\\ude00 and an escaped \\\\udcff"}')
    assert r.status_code == 200, r.text
    assert len(r.json()["data"][0]["embedding"]) == 384


def test_non_json_content_type_is_415(client):
    r = client.post(
        "/v1/embeddings", content=b"input=hello", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    ok = client.post(
        "/v1/embeddings", content=b'{"input": "hello"}', headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert ok.status_code == 200


def test_user_key_on_admin_is_403_admin_key_passes(server):
    real = load_task("STSBenchmark").sent1[0]
    with httpx.Client(base_url=server.url, timeout=60) as c:
        user = {"Authorization": f"Bearer {USER}"}
        admin = {"Authorization": f"Bearer {ADMIN}"}
        r = c.post("/admin/models/reload", headers=user)
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_permissions"
        assert "lacks admin rights" in r.json()["error"]["message"]
        assert c.post("/admin/models/reload", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/admin/models/reload", headers=admin).status_code == 200
        # the key from --api-keys-file works for the API; no key is refused
        assert c.post("/v1/embeddings", json={"input": real}, headers=user).status_code == 200
        assert c.post("/v1/embeddings", json={"input": real}).status_code == 401


def test_surrogate_scanner_cases():
    assert unpaired_surrogate(b'{"a": "\\ud83d\\ude00"}') is None
    assert unpaired_surrogate(b'{"a": "\\\\udcff"}') is None  # an escaped backslash, then plain text
    assert unpaired_surrogate(b'{"a": "\\ud83d\\ud83d\\ude00"}') == "\\ud83d"
    assert unpaired_surrogate(b'{"a": "\\ud83d x"}') == "\\ud83d"
    assert unpaired_surrogate(b'{"a": "\\udcff"}') == "\\udcff"
