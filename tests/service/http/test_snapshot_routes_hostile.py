"""Snapshot recovery and uploads against the real service, as a hostile client would try them with an ordinary key:
recovery from a location needs an admin key (Qdrant: global manage access) and its errors do not tell what the
server can reach; malformed locations are 422; an uploaded snapshot bound to a model that is not loaded loads nothing
(409); upload forms are bounded in parts, files, field sizes and file size; a drip upload times out (408); an upload
the client abandons, or a snapshot that is truncated, nested too deep or does not open, leaves no file behind (422
``invalid_snapshot``). The archives' own checks: tests/service/collections/test_snapshot_hostile.py."""

from __future__ import annotations

import io
import json
import socket
import sqlite3
import tarfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server_utils import run_server

pytestmark = pytest.mark.timeout(300)

USER, ADMIN = "user-key-1", "admin-key-1"
MAX_BYTES = 4 * 2**20


@pytest.fixture(scope="module")
def env(default_artifact: Path, int8_artifact: Path, tmp_path_factory):
    work = tmp_path_factory.mktemp("snapshot-hostile")
    args = [
        "--default-model",
        default_artifact.name,
        "--intra-op-threads",
        "1",
        "--log-level",
        "warning",
        "--api-keys",
        USER,
        "--admin-api-keys",
        ADMIN,
        "--collections-snapshot-idle-timeout-s",
        "1",
        "--collections-snapshot-max-bytes",
        str(MAX_BYTES),
    ]
    with run_server(default_artifact.parent, workdir=work, args=args) as srv:
        with (
            httpx.Client(base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {USER}"}) as user,
            httpx.Client(base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {ADMIN}"}) as admin,
        ):
            assert user.put("/collections/src", json={"index": "flat", "metric": "cosine"}).status_code == 200
            pts = [{"id": i, "text": t} for i, t in enumerate(["a cat", "a dog", "a ship"])]
            assert user.put("/collections/src/points", json={"points": pts}).status_code == 200
            snap = user.post("/collections/src/snapshots").json()
            data = user.get(f"/collections/src/snapshots/{snap['name']}").content
            yield {
                "srv": srv,
                "work": work,
                "user": user,
                "admin": admin,
                "snap": snap,
                "data": data,
                "int8": json.loads((int8_artifact / "manifest.json").read_text()),
            }
        assert srv.alive(), srv.log()[-3000:]


def _leftovers(env) -> list[str]:
    data = env["work"] / "data"
    downloads = data / "snapshots" / ".downloads"
    left = [p.name for p in downloads.iterdir()] if downloads.exists() else []
    return left + [p.name for p in (data / "collections").iterdir() if p.name.startswith(".")]


def _no_leftovers(env) -> None:
    deadline = time.monotonic() + 5
    while (left := _leftovers(env)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, left


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def _with_meta(members: dict[str, bytes], tmp: Path, edit, sql: str = "") -> dict[str, bytes]:
    """``members`` with the store's meta rows changed by ``edit(meta) -> meta`` (decoded JSON values), ``sql`` run."""
    db = tmp / f"edit-{time.monotonic_ns()}.sqlite3"
    db.write_bytes(members["points.sqlite3"])
    conn = sqlite3.connect(db)
    meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    with conn:
        for k, v in edit(meta).items():
            conn.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(v), k))
    if sql:
        conn.executescript(sql)
    conn.close()
    return {**members, "points.sqlite3": db.read_bytes()}


def _upload(c: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return c.post(f"/collections/{name}/snapshots/upload", files={"snapshot": ("s.snapshot", data)})


def _recover(c: httpx.Client, name: str, location: str, qdrant: bool = False, **headers) -> httpx.Response:
    path = f"/qdrant/collections/{name}/snapshots/recover" if qdrant else f"/collections/{name}/snapshots/recover"
    return c.put(path, json={"location": location}, headers=headers)


def _message(r: httpx.Response) -> str:
    body = r.json()
    return body["error"]["message"] if "error" in body else body["status"]["error"]


def test_recovery_from_a_location_needs_an_admin_key_and_tells_nothing_of_the_network(env):
    user, admin, srv = env["user"], env["admin"], env["srv"]
    location = f"file://{env['work'] / 'data' / 'snapshots' / 'src' / env['snap']['name']}"
    r = _recover(user, "copy", location)
    assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_permissions", r.text
    r = _recover(user, "copy", location, qdrant=True)
    assert r.status_code == 403, r.text
    r = httpx.put(
        f"{srv.url}/qdrant/collections/copy/snapshots/recover", json={"location": location}, headers={"api-key": USER}
    )
    assert r.status_code == 403, r.text
    assert user.get("/collections/copy").status_code == 404
    assert _recover(admin, "copy", location).json()["count"] == 3
    r = httpx.put(
        f"{srv.url}/qdrant/collections/copy2/snapshots/recover", json={"location": location}, headers={"api-key": ADMIN}
    )
    assert r.status_code == 200 and r.json()["result"] is True, r.text
    # a closed port, an open HTTP port that answers 401, a port that does not speak HTTP: one answer
    listener = socket.create_server(("127.0.0.1", 0))
    garbage_port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    messages: dict[bool, set[str]] = {False: set(), True: set()}
    for url in (
        f"http://127.0.0.1:{closed_port}/x",
        f"{srv.url}/collections/src/snapshots/none",
        f"http://127.0.0.1:{garbage_port}/x",
    ):
        for qdrant in (False, True):
            r = _recover(admin, "net", url, qdrant=qdrant)
            assert r.status_code == 422, (url, r.text)
            messages[qdrant].add(_message(r))
    listener.close()
    assert len(messages[False]) == len(messages[True]) == 1, messages
    for name in ("copy", "copy2"):
        assert admin.delete(f"/collections/{name}").status_code == 200
    _no_leftovers(env)


def test_malformed_locations_are_422(env):
    admin = env["admin"]
    for location in ("http://[::1", "http://" + "a" * 2**20, f"file://{env['work']}/data/snapshots/src/a%00b"):
        for qdrant in (False, True):
            r = _recover(admin, "bad", location, qdrant=qdrant)
            assert r.status_code == 422, (location[:40], qdrant, r.status_code, r.text[:300])


def test_an_upload_bound_to_a_model_that_is_not_loaded_loads_nothing(env, tmp_path):
    user, int8 = env["user"], env["int8"]
    other = {"name": int8["name"], "version": str(int8["version"]), "sha256": int8["sha256"]}

    def rebind(meta):
        meta["vectors"]["dense"][""]["model"] = other
        return {"model": other, "vectors": meta["vectors"]}

    foreign = _tar(_with_meta(_members(env["data"]), tmp_path, rebind))
    r = _upload(user, "foreign", foreign)
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_unavailable", r.text
    r = user.post("/qdrant/collections/foreign/snapshots/upload", files={"snapshot": ("s", foreign)})
    assert r.status_code == 409, r.text
    assert int8["name"] not in [m["id"] for m in user.get("/v1/models").json()["data"]]
    assert user.get("/collections/foreign").status_code == 404
    r = _upload(user, "honest", env["data"])  # bound to the loaded model: recovered
    assert r.status_code == 200 and r.json()["count"] == 3, r.text
    assert user.delete("/collections/honest").status_code == 200
    _no_leftovers(env)


def _form(parts: list[tuple[str, str | None, bytes]]) -> tuple[bytes, dict[str, str]]:
    out = []
    for name, filename, body in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out.append(b"--BND\r\nContent-Disposition: " + disp.encode() + b"\r\n\r\n" + body + b"\r\n")
    return b"".join(out) + b"--BND--\r\n", {"Content-Type": "multipart/form-data; boundary=BND"}


def test_upload_forms_are_bounded(env):
    user, data = env["user"], env["data"]
    cases = [
        ([("f", None, b"x")] * 16 + [("snapshot", "s", data)], 422),  # 17 parts
        ([("f", None, b"")] * 20_000 + [("snapshot", "s", data)], 422),  # 20,000 parts: no file opened for them
        ([("note", None, b"x" * 100_000), ("snapshot", "s", data)], 422),  # a 100 KB plain field
        ([("snapshot", "s", data), ("other", "o", b"x")], 422),  # a second file
        ([("snapshot", "s", data), ("snapshot", "s2", data)], 422),
        ([("snapshot", "s", bytes(MAX_BYTES + 1))], 413),
    ]
    for parts, status in cases:
        body, headers = _form(parts)
        r = user.post("/collections/formed/snapshots/upload", content=body, headers=headers)
        assert r.status_code == status, (len(parts), r.text[:300])
        _no_leftovers(env)
    # a body without a length, larger than the limit as it streams in
    body, headers = _form([("snapshot", "s", bytes(MAX_BYTES + 1))])
    r = user.post(
        "/collections/formed/snapshots/upload",
        content=iter([body[i : i + 65536] for i in range(0, len(body), 65536)]),
        headers=headers,
    )
    assert r.status_code == 413, r.text
    assert user.get("/collections/formed").status_code == 404
    _no_leftovers(env)


def _raw(env, body: bytes, length: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", env["srv"].port), timeout=10)
    s.sendall(
        b"POST /collections/drip/snapshots/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + USER.encode()
        + b"\r\nContent-Type: multipart/form-data; boundary=BND\r\nContent-Length: %d\r\n\r\n" % length
        + body
    )
    return s


def test_drips_and_abandoned_uploads_leave_nothing(env):
    body, _ = _form([("snapshot", "s", env["data"])])
    s = _raw(env, body[: len(body) // 2], len(body))  # half the body, then silence
    t0 = time.monotonic()
    answer = s.recv(4096)
    s.close()
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 5, answer[:200]
    _no_leftovers(env)
    s = _raw(env, body[: len(body) // 2], len(body))  # half the body, then the client leaves
    time.sleep(0.3)
    s.close()
    _no_leftovers(env)
    assert env["user"].get("/collections/drip").status_code == 404


def test_hostile_uploads_are_invalid_snapshots_and_leave_nothing(env, tmp_path):
    user, data = env["user"], env["data"]
    m = _members(data)

    def no_index(meta):
        meta["vectors"]["dense"][""]["index"] = "no-such-index"
        return {"vectors": meta["vectors"], "config": {**meta["config"], "index": "no-such-index"}}

    hostile = {
        "truncated": data[: len(data) // 2],
        "nested manifest": _tar({**m, "manifest.json": b"[" * 100_000 + b"]" * 100_000}),
        "no such index": _tar(_with_meta(m, tmp_path, no_index)),
        "does not open": _tar(_with_meta(m, tmp_path, lambda meta: {}, sql="DROP TABLE points;")),
    }
    for what, archive in hostile.items():
        r = _upload(user, "hostile", archive)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_snapshot", (what, r.text)
        assert user.get("/collections/hostile").status_code == 404
        _no_leftovers(env)
    r = _upload(user, "src", hostile["does not open"])  # over an existing collection: it stays as it was
    assert r.status_code == 422 and user.get("/collections/src").json()["count"] == 3, r.text
    _no_leftovers(env)
