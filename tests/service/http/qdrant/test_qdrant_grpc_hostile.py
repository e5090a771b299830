"""The Qdrant gRPC port (``qdrant_grpc_port``) against careless or hostile callers, through the real service with an
API key configured:

* a call without a valid key is refused ``UNAUTHENTICATED`` before its message is read: bytes that are not protobuf
  at all get that answer too, and a ~60 MB ``Points/Upsert`` without a key is refused at once while ``/health`` keeps
  answering (its conversion once held the event loop for seconds before the refusal);
* the health checks are open, as Qdrant's: ``qdrant.Qdrant/HealthCheck`` and gRPC's standard
  ``grpc.health.v1.Health/Check`` (checked on the wire: ``SERVING`` is the bytes ``08 01``; an unknown service
  ``NOT_FOUND``);
* a message that is not valid protobuf is ``INVALID_ARGUMENT``, its details free of Python type names;
* an authenticated message past the size parsed on a worker thread goes through like a small one (the bridge's
  encoding of a big one leaves the event loop ticking: tests/service/http/qdrant/test_grpc_bridge_encoding.py);
* a big REST body is parsed and validated on a worker thread: ``/health`` keeps answering meanwhile.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from tests.server_utils import free_port, run_server

pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402
from qdrant_client import grpc as g  # noqa: E402
from qdrant_client.conversions.conversion import RestToGrpc as R  # noqa: E402
from qdrant_client.grpc import qdrant_pb2_grpc  # noqa: E402

pytestmark = pytest.mark.timeout(300)

KEY = "hostile-grpc-key"
AUTH = [("api-key", KEY)]
BIG_BYTES = 60 * 1024 * 1024  # under the port's 64 MiB message limit


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    port = free_port()
    env = {"EMBED_QDRANT_GRPC_PORT": str(port), "EMBED_API_KEYS": KEY}
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("grpc-hostile"), env=env) as s:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]) as ch:
            yield s, port, ch


def raw_call(ch: grpc.Channel, method: str, request: bytes, metadata=None, timeout: float = 60) -> bytes:
    """A unary call with the request and the answer as bytes (no protobuf on this side)."""
    return ch.unary_unary(method)(request, metadata=metadata, timeout=timeout)


def refused(ch: grpc.Channel, method: str, request: bytes, metadata=None) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a raw call that must fail."""
    with pytest.raises(grpc.RpcError) as e:
        raw_call(ch, method, request, metadata)
    return e.value.code(), e.value.details() or ""


def test_health_checks_are_open(server):
    s, port, ch = server
    for metadata in (None, [("api-key", "wrong")]):
        reply = qdrant_pb2_grpc.QdrantStub(ch).HealthCheck(g.HealthCheckRequest(), metadata=metadata, timeout=30)
        assert reply.title == "qdrant - vector search engine" and reply.version
        assert raw_call(ch, "/grpc.health.v1.Health/Check", b"", metadata) == b"\x08\x01"  # status: SERVING
        named = b"\x0a\x0dqdrant.Qdrant"  # service: "qdrant.Qdrant"
        assert raw_call(ch, "/grpc.health.v1.Health/Check", named, metadata) == b"\x08\x01"
        code, _ = refused(ch, "/grpc.health.v1.Health/Check", b"\x0a\x04nope", metadata)
        assert code == grpc.StatusCode.NOT_FOUND
    code, _ = refused(ch, "/qdrant.Points/Count", b"\x0a\x01c")
    assert code == grpc.StatusCode.UNAUTHENTICATED  # the other methods still need the key


def test_calls_without_a_key_are_refused_before_their_message_is_read(server):
    s, port, ch = server
    for metadata in (None, [("api-key", "wrong")], [("authorization", "Bearer wrong")]):
        for request in (b"\x0a\x05ab", b"\xff\xff\xff"):  # truncated; not protobuf at all
            code, details = refused(ch, "/qdrant.Points/Upsert", request, metadata)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (metadata, request, details)
    one = R.convert_point_struct(models.PointStruct(id=1, vector=[0.5] * 256, payload={"k": "v"}))
    point = g.UpsertPoints(points=[one]).SerializeToString()  # the points field of one point; repeated, they add up
    big = g.UpsertPoints(collection_name="big").SerializeToString() + point * (BIG_BYTES // len(point))
    worst, stop = [0.0], threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                assert c.get("/health").status_code == 200
                worst[0] = max(worst[0], time.perf_counter() - t0)
                time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        t0 = time.perf_counter()
        code, _ = refused(ch, "/qdrant.Points/Upsert", big)
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        prober.join(30)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert elapsed < 5.0 and worst[0] < 1.0, (elapsed, worst[0])


def test_malformed_protobuf_is_invalid_argument(server):
    s, port, ch = server
    for method in ("/qdrant.Points/Count", "/qdrant.Points/Upsert", "/qdrant.Collections/Get"):
        for request in (b"\x0a\x05ab", b"\x0a\x02\xff\xfe", b"\x0f"):  # truncated; a string not UTF-8; wire type 7
            code, details = refused(ch, method, request, AUTH)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, request, code, details)
            assert details.startswith(f"Wrong input: the request is not a valid {method} message"), details
            assert "<class" not in details and "DecodeError" not in details and "Unexpected" not in details, details
    client = QdrantClient(url=f"{s.url}/qdrant", prefer_grpc=True, grpc_port=port, api_key=KEY, https=False)
    assert client.collection_exists("nope") is False


def test_a_large_authenticated_upsert_goes_through(server):
    s, port, ch = server
    url = f"{s.url}/qdrant"
    client = QdrantClient(url=url, prefer_grpc=True, grpc_port=port, api_key=KEY, https=False, timeout=120)
    client.create_collection("large", vectors_config=models.VectorParams(size=64, distance=models.Distance.DOT))
    points = [models.PointStruct(id=i, vector=[float(i % 7)] * 64, payload={"i": i, "w": "x" * 50}) for i in range(600)]
    client.upsert("large", points)  # ~0.5 MB: parsed, converted and encoded on worker threads
    assert client.count("large").count == 600
    got = client.scroll("large", limit=100, with_vectors=True)[0]  # an answer converted on a worker thread
    assert len(got) == 100 and got[5].payload == {"i": 5, "w": "x" * 50} and got[5].vector == [5.0] * 64


def test_a_big_rest_body_is_validated_off_the_event_loop(server):
    """A ~12 MB REST upsert of 512 points whose payloads hold 5,000 values each: its validation (pydantic and the
    payload checks, seconds of CPU) runs on a worker thread, so ``/health`` answers within a second meanwhile (before:
    ~2.6 s for 17 MB, 3.8 s for 25 MB); the same body made invalid answers the 422 a small invalid body gets."""
    s, _, _ = server
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    with httpx.Client(base_url=f"{s.url}/qdrant", timeout=300, headers=headers) as c:
        assert c.put("/collections/payloads", json={"vectors": {"size": 4, "distance": "Dot"}}).status_code == 200
        points = [{"id": i, "vector": [0.1, 0.2, 0.3, 0.4], "payload": {"v": list(range(5000))}} for i in range(512)]
        body = json.dumps({"points": points}, separators=(",", ":")).encode()
        assert 10 * 2**20 < len(body) < 32 * 2**20, len(body)
        worst, stop = [0.0], threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=s.url, timeout=60) as h:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    assert h.get("/health").status_code == 200
                    worst[0] = max(worst[0], time.perf_counter() - t0)
                    time.sleep(0.02)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        try:
            time.sleep(0.3)
            r = c.put("/collections/payloads/points", params={"wait": "true"}, content=body)
            time.sleep(0.3)
        finally:
            stop.set()
            prober.join(60)
        assert r.status_code == 200, r.text[:300]
        assert worst[0] < 1.0, worst
        assert c.post("/collections/payloads/points/count", json={"exact": True}).json()["result"]["count"] == 512
        # invalid: the last point's id is not an id; a big body answers as a small one
        small = {"points": [{"id": [1], "vector": [0.1, 0.2, 0.3, 0.4]}]}
        points[-1]["id"] = [1]
        big = c.put("/collections/payloads/points", content=json.dumps({"points": points}).encode())
        little = c.put("/collections/payloads/points", content=json.dumps(small).encode())
        assert big.status_code == little.status_code == 422, (big.text[:300], little.text[:300])
        norm = lambda t: t.replace("511", "N").replace("[0]", "[N]").replace(".0.", ".N.")  # noqa: E731
        assert norm(big.json()["status"]["error"])[:200] == norm(little.json()["status"]["error"])[:200]
