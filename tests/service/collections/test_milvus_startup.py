"""A replica on the milvus backend whose Milvus is not there yet, or stops answering, through a TCP gate in front of
the session's real Milvus server (no Milvus restart: the gate is closed, opened, or holds every byte):

* started while nothing answers at its Milvus address, the service starts all the same: ``/health`` 200,
  ``/ready`` 503 and collection routes 503 until Milvus answers, then ready and serving (row 9 of the reliability
  issue: it exited with "Application startup failed");
* while Milvus hangs, ``/metrics`` answers at once with the collection gauges' last values (row 10: a scrape took
  12.7 s during a Milvus outage while ``/health`` stayed fast).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid

import httpx
import pytest

from tests.conftest import backend_args
from tests.server_utils import free_port, run_server


class Gate:
    """A TCP forwarder from ``127.0.0.1:port`` to ``127.0.0.1:target``: closed (nothing listens: connection refused)
    until :meth:`open`; :meth:`hold` keeps every byte back in both directions (a hung server) until :meth:`release`.
    """

    def __init__(self, target: int) -> None:
        self.target, self.port = target, free_port()
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []

    def open(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self.flowing.clear()

    def release(self) -> None:
        self.flowing.set()

    def close(self) -> None:
        self.flowing.set()
        for s in [self.listener, *self.conns]:
            if s is not None:
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass


@pytest.fixture()
def gate(milvus_uri):
    g = Gate(int(milvus_uri.rsplit(":", 1)[1]))
    yield g
    g.close()


def _args(gate: Gate, timeout_s: float = 3.0) -> list[str]:
    return [*backend_args("milvus", f"http://127.0.0.1:{gate.port}", f"s{uuid.uuid4().hex[:10]}_", timeout_s),
            "--log-level", "info"]  # fmt: skip


def test_a_replica_started_before_milvus_serves_once_it_answers(gate, default_artifact, tmp_path):
    with run_server(default_artifact.parent, workdir=tmp_path, args=_args(gate), ready_path="/health") as s:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            for _ in range(3):  # started, alive, not ready; collections 503 (never a 500), embeddings served
                assert c.get("/health").status_code == 200
                r = c.get("/ready")
                assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
                assert c.get("/collections").status_code == 503
                assert c.post("/v1/embeddings", json={"input": "a guitar"}).status_code == 200
                time.sleep(1.0)
            assert s.alive()

            gate.open()  # Milvus answers now
            t0 = time.monotonic()
            while c.get("/ready").status_code != 200:
                assert s.alive() and time.monotonic() - t0 < 30, "not ready 30 s after Milvus answered"
                time.sleep(0.25)
            assert c.put("/collections/late", json={}).status_code == 200
            assert c.put("/collections/late/points", json={"points": [{"id": 1, "text": "x"}]}).status_code == 200
            assert c.get("/collections/late").json()["count"] == 1


def _gauge(text: str, name: str, collection: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and f'collection="{collection}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_never_wait_on_a_hung_milvus(gate, default_artifact, tmp_path):
    gate.open()
    with run_server(default_artifact.parent, workdir=tmp_path, args=_args(gate)) as s:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            for i, name in enumerate(("m0", "m1", "m2")):
                assert c.put(f"/collections/{name}", json={}).status_code == 200
                pts = [{"id": j, "text": f"sentence {j}"} for j in range(i + 2)]
                assert c.put(f"/collections/{name}/points", json={"points": pts}).status_code == 200
            t0 = time.monotonic()
            while _gauge(c.get("/metrics").text, "embed_collection_points", "m2") != 4:
                assert time.monotonic() - t0 < 10
                time.sleep(0.2)

            gate.hold()  # Milvus hangs: every call waits for its timeout (3 s here)
            try:
                for _ in range(4):
                    t0 = time.perf_counter()
                    r = c.get("/metrics")
                    dt = time.perf_counter() - t0
                    assert r.status_code == 200 and dt < 1.0, f"/metrics took {dt:.2f} s during the outage"
                    for i, name in enumerate(("m0", "m1", "m2")):  # the last known values
                        assert _gauge(r.text, "embed_collection_points", name) == i + 2
                    assert c.get("/health").status_code == 200
                    time.sleep(0.5)
                assert _gauge(r.text, "embed_collection_stats_age_seconds", "m0") >= 1.5  # and how old they are
            finally:
                gate.release()
            t0 = time.monotonic()
            while _gauge(c.get("/metrics").text, "embed_collection_stats_age_seconds", "m0") > 1.0:
                assert time.monotonic() - t0 < 30, "gauges not read again 30 s after Milvus answered"
                time.sleep(0.5)
