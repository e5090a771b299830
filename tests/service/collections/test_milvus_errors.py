"""Milvus's "not ready / not available" answers are 503 ``backend_unavailable`` with ``Retry-After``, never a 500.

Reproduced on the real Milvus 2.3.5 server before the fix: Milvus SIGSTOPped for 30 s with no traffic, then resumed
under searches through one replica: Milvus quit ~2 s after SIGCONT (its embedded etcd had expired its sessions), and
meanwhile answered ``code=503 "channel lacks: channel not available"`` (and ``code=1 "service not ready: Abnormal"``),
which the replica passed on as 134 x 500 within 1.38 s. Here every code of the backend's one table
(:data:`service.collections.milvus.client.RETRY_LATER`, and the legacy codes of ``RETRY_LATER_LEGACY``) goes the way
Milvus sends it: a status on the wire, from a gRPC server speaking Milvus's protocol, through pymilvus's
``MilvusClient`` (which raises ``MilvusException``), the backend's bounded client and ``run``, to the HTTP answer of
``service.http.errors.ERROR_TABLE``. Other codes stay errors (a genuine bad request is not a 503).
"""

from __future__ import annotations

import asyncio
from concurrent import futures
from types import SimpleNamespace

import grpc
import pytest
from pymilvus import MilvusClient, MilvusException
from pymilvus.grpc_gen import common_pb2, milvus_pb2, milvus_pb2_grpc

from service.collections.errors import BackendUnavailable
from service.collections.milvus import MilvusBackend
from service.collections.milvus.client import RETRY_LATER, RETRY_LATER_LEGACY, BoundedClient, classify
from service.collections.vector_backend import CollectionSettings
from service.http.errors import to_api_error
from service.settings import Settings
from tests.server_utils import free_port


class FakeMilvus(milvus_pb2_grpc.MilvusServiceServicer):
    """Milvus's gRPC service as far as ``MilvusClient`` and a query need it: every query answered with
    :attr:`status`."""

    def __init__(self) -> None:
        self.status = common_pb2.Status()
        self.queries = 0

    def Connect(self, request, context):  # noqa: N802 (Milvus's RPC name)
        return milvus_pb2.ConnectResponse(status=common_pb2.Status(), identifier=1)

    def Query(self, request, context):  # noqa: N802
        self.queries += 1
        return milvus_pb2.QueryResults(status=self.status)

    def ShowCollections(self, request, context):  # noqa: N802 (the backend's reachability check of a slow call)
        return milvus_pb2.ShowCollectionsResponse(status=common_pb2.Status())


@pytest.fixture(scope="module")
def fake():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = FakeMilvus()
    milvus_pb2_grpc.add_MilvusServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    uri = f"http://127.0.0.1:{port}"
    client = MilvusClient(uri=uri, timeout=5)
    client.fake_uri = uri
    yield servicer, client
    client.close()
    server.stop(0)


class _Client(BoundedClient):
    """The backend's bounded client on the fake server; records reload requests (``not_loaded``)."""

    def __init__(self, client: MilvusClient) -> None:
        super().__init__(client, 1.0)
        self.loads: list[str] = []

    def load_collection(self, name: str, **kw) -> None:
        self.loads.append(name)


def _answer(backend: MilvusBackend, fn) -> tuple[int, str | None, str | None, Exception]:
    """Run ``fn`` through the backend's ``run`` and give the HTTP answer of what it raised:
    ``(status, code, Retry-After, exception)``."""

    async def go() -> Exception:
        try:
            await backend.run(fn)
        except Exception as e:  # noqa: BLE001 (the answer is what is tested)
            return e
        raise AssertionError("the call succeeded")

    exc = asyncio.run(go())
    err = to_api_error(exc)
    if err is None:
        return 500, None, None, exc
    return err.status, err.code, err.headers.get("Retry-After"), exc


def _backend(client: MilvusClient) -> MilvusBackend:
    b = MilvusBackend(CollectionSettings(Settings(collections_milvus_uri=client.fake_uri)))
    b.client = _Client(client)
    b.registry = SimpleNamespace(name="registry")
    return b


def _legacy_for(code: int) -> int:
    """The legacy ``error_code`` Milvus 2.3's ``merr.Status`` sends beside a code (``oldCode``), roughly."""
    return {1: common_pb2.NotReadyServe, 8: common_pb2.RateLimit, 11: common_pb2.TimeTickLongDelay,
            401: common_pb2.NoReplicaAvailable, 503: common_pb2.NoReplicaAvailable,
            905: common_pb2.NoReplicaAvailable}.get(code, common_pb2.UnexpectedError)  # fmt: skip


@pytest.mark.parametrize("code", sorted(RETRY_LATER))
def test_every_retry_later_code_from_the_wire_is_a_503_with_retry_after(fake, code):
    servicer, client = fake
    kind, name = RETRY_LATER[code]
    servicer.status = common_pb2.Status(code=code, reason=f"{name}[channel=by-dev-rootcoord-dml_0]",
                                        error_code=_legacy_for(code))  # fmt: skip
    backend = _backend(client)
    status, api_code, retry_after, exc = _answer(backend, lambda: backend.client.query("c", filter='key != ""'))
    assert (status, api_code) == (503, "backend_unavailable"), (code, name, status, exc)
    assert int(retry_after) >= 1, retry_after
    assert isinstance(exc, BackendUnavailable) and isinstance(exc.__cause__, MilvusException)
    assert exc.__cause__.code == code  # what pymilvus raised: Milvus's own code
    assert backend.breaker.open_since is None, "Milvus answered: it is reachable, the breaker stays closed"
    assert classify(exc.__cause__) == kind
    if kind == "not_loaded":  # and the backend asks Milvus to load its collections again
        backend._pool.shutdown(wait=True)
        assert backend.client.loads == ["registry"], backend.client.loads


@pytest.mark.parametrize("legacy", sorted(RETRY_LATER_LEGACY))
def test_every_legacy_retry_later_code_from_the_wire_is_a_503(fake, legacy):
    servicer, client = fake
    servicer.status = common_pb2.Status(code=0, error_code=legacy, reason=RETRY_LATER_LEGACY[legacy][1])
    backend = _backend(client)
    status, api_code, retry_after, exc = _answer(backend, lambda: backend.client.query("c", filter='key != ""'))
    assert (status, api_code) == (503, "backend_unavailable"), (legacy, status, exc)
    assert int(retry_after) >= 1
    assert backend.breaker.open_since is None


@pytest.mark.parametrize("code", [5, 100, 1100, 65535])  # internal, collection not found, bad parameter, unexpected
def test_other_codes_stay_errors(fake, code):
    servicer, client = fake
    servicer.status = common_pb2.Status(code=code, reason="something else", error_code=common_pb2.UnexpectedError)
    backend = _backend(client)
    status, _, _, exc = _answer(backend, lambda: backend.client.query("c", filter='key != ""'))
    assert status == 500 and isinstance(exc, MilvusException) and exc.code == code, (code, status, exc)
    assert classify(exc) is None


def test_the_table_raised_directly():
    """Every code as ``MilvusException(code=..., message=...)`` (how pymilvus's ``check_status`` raises it), and the
    legacy ones as ``compatible_code`` beside code 0; a retry timeout keeps its cause's code."""
    for code, (kind, name) in RETRY_LATER.items():
        assert classify(MilvusException(code=code, message=name)) == kind, code
    for legacy, (kind, name) in RETRY_LATER_LEGACY.items():
        assert classify(MilvusException(code=0, message=name, compatible_code=legacy)) == kind, legacy
    try:  # pymilvus's retry loop, past its timeout on a legacy rate limit: a new exception without the legacy code
        try:
            raise MilvusException(code=0, message="rate limit", compatible_code=common_pb2.RateLimit)
        except MilvusException as inner:
            raise MilvusException(code=0, message="Retry timeout: 1s, message=rate limit") from inner
    except MilvusException as outer:
        assert classify(outer) == "not_ready"
    assert {503, 1, 101} <= set(RETRY_LATER)
