"""A Milvus outage, on the session's real Milvus server (killed with SIGKILL, then restarted on the same data), seen
through two service replicas:

* every collection route answers 503 ``backend_unavailable`` with ``Retry-After`` within the Milvus call timeout
  (``collections_milvus_write_timeout_s``) + 1 s, and at once once the outage is known; never a 500;
* nothing else waits on Milvus: ``/health`` and a one-sentence embedding stay fast all along (the event loop never
  blocks on a Milvus call);
* a replica told to stop (SIGTERM) while Milvus is down exits within its drain + graceful timeout;
* once Milvus answers again, collection routes serve within 15 s (after "collection not loaded" 503s, not 500s),
  and every write acknowledged before the outage is there;
* no collection ever reads as absent: through both replicas, from before the kill until well after the restart,
  ``GET /collections/{name}`` of every collection answers 200 or 503, never 404 (row 3 of the reliability issue: a
  registry read that came back short after a restart made a collection 404 for a whole Milvus run).
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import backend_args
from tests.server_utils import run_server

# serial: make test runs it after the parallel part, alone on the machine (its recovery bounds are in seconds)
pytestmark = [pytest.mark.timeout(900), pytest.mark.serial]

WRITE_TIMEOUT_S = 5  # --collections-milvus-write-timeout-s here (shorter than backend_args' default: a shorter test)


class Prober(threading.Thread):
    """``/health`` and a one-sentence embedding, one after the other, until stopped: the worst latency of each."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.worst = url, threading.Event(), {"health": 0.0, "embed": 0.0}
        self.failures: list[str] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as c:
            while not self.stop.is_set():
                for what, call in (("health", lambda: c.get("/health")),
                                   ("embed", lambda: c.post("/v1/embeddings", json={"input": "A man plays a guitar."}))):  # fmt: skip
                    t0 = time.perf_counter()
                    r = call()
                    self.worst[what] = max(self.worst[what], time.perf_counter() - t0)
                    if r.status_code != 200:
                        self.failures.append(f"{what} {r.status_code}")
                time.sleep(0.05)


class Visibility(threading.Thread):
    """``GET /collections/{name}`` of each name through each client, round after round, until stopped: every status
    seen (404 must never be one)."""

    def __init__(self, urls: list[str], names: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls, self.names, self.stop, self.seen = urls, names, threading.Event(), {}

    def run(self) -> None:
        clients = [httpx.Client(base_url=u, timeout=30) for u in self.urls]
        while not self.stop.is_set():
            for i, c in enumerate(clients):
                for name in self.names:
                    try:
                        code = c.get(f"/collections/{name}").status_code
                    except httpx.HTTPError:
                        code = 0  # the replica stopped (SIGTERMed by the test)
                    self.seen.setdefault((i, name, code), time.monotonic())
            time.sleep(0.2)
        for c in clients:
            c.close()


def _calls(c: httpx.Client, i: int) -> list[tuple[str, httpx.Response, float]]:
    out = []
    for what, fn in (
        ("list", lambda: c.get("/collections")),
        ("info", lambda: c.get("/collections/f")),
        ("get", lambda: c.get("/collections/f/points/1")),
        ("search", lambda: c.post("/collections/f/search", json={"query": [0.05] * 384, "top_k": 3})),
        ("upsert", lambda: c.put("/collections/f/points", json={"points": [{"id": 1000 + i, "text": "late"}]})),
        ("delete", lambda: c.post("/collections/f/points/delete", json={"ids": [5]})),
    ):
        t0 = time.perf_counter()
        r = fn()
        out.append((what, r, time.perf_counter() - t0))
    return out


def test_a_milvus_outage_gives_bounded_503s_and_the_service_recovers(milvus, default_artifact, tmp_path):
    if milvus is None:
        pytest.skip("needs the session's own Milvus server (EMBED_TEST_MILVUS_URI names an external one)")
    args = [*backend_args("milvus", milvus.uri, f"x{uuid.uuid4().hex[:10]}_", WRITE_TIMEOUT_S), "--log-level", "info",
            "--drain-s", "1", "--graceful-timeout-s", "5"]  # fmt: skip
    models = default_artifact.parent
    with (
        run_server(models, workdir=tmp_path / "a", args=args) as a,
        run_server(models, workdir=tmp_path / "b", args=args) as b,
        httpx.Client(base_url=a.url, timeout=120) as ca,
        httpx.Client(base_url=b.url, timeout=120) as cb,
    ):
        assert ca.put("/collections/f", json={}).status_code == 200
        pts = [{"id": i, "text": f"sentence number {i}", "payload": {"i": i}} for i in range(50)]
        assert ca.put("/collections/f/points", json={"points": pts}).status_code == 200
        assert cb.get("/collections/f").json()["count"] == 50
        names = ["f"]
        for n in ("g0", "g1"):
            assert cb.put(f"/collections/{n}", json={}).status_code == 200
            assert cb.put(f"/collections/{n}/points", json={"points": pts[:20]}).status_code == 200
            names.append(n)
        prober, visible = Prober(a.url), Visibility([a.url, b.url], names)
        prober.start()
        visible.start()
        time.sleep(0.5)

        milvus.kill()
        # every collection route, through both replicas at once: bounded 503s, never a 500
        with ThreadPoolExecutor(4) as ex:
            rounds = list(ex.map(lambda ic: _calls(ic[1], ic[0]), enumerate([ca, cb, ca, cb])))
        for what, r, dt in (x for rnd in rounds for x in rnd):
            assert r.status_code == 503, (what, r.status_code, r.text)
            e = r.json()["error"]
            assert e["code"] == "backend_unavailable" and int(r.headers["retry-after"]) >= 1, (what, e)
            assert dt < WRITE_TIMEOUT_S + 1 + 2, (what, dt)  # the call's timeout, its last attempt, HTTP
        # once the outage is known, answered at once
        for what, r, dt in _calls(ca, 99):
            assert r.status_code == 503 and dt < 1.0, (what, r.status_code, dt)

        # a replica stopped while Milvus is down exits within drain + graceful timeout (1 + 5 s)
        t0 = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        b.proc.wait(timeout=60)
        assert time.monotonic() - t0 < 1 + 5 + 2, f"SIGTERM took {time.monotonic() - t0:.1f} s"

        # same data, same port; a restart that does not answer in 90 s is tried again (it takes ~10 s here; once, in
        # CI, one hung for 180 s)
        milvus.start(timeout=90)
        up = time.monotonic()
        seen: list[int] = []

        def serving() -> bool:
            codes = [r.status_code for _, r, _ in _calls(ca, 200 + len(seen))]
            seen.extend(codes)
            return all(code == 200 for code in codes)

        while not serving():
            assert time.monotonic() - up < 15, f"collections not back 15 s after Milvus answered: {seen[-6:]}"
            time.sleep(0.5)
        assert set(seen) <= {200, 503}, seen  # "collection not loaded" is a 503 too, never a 500
        time.sleep(3.0)  # a few more refreshes of the registry after the restart, under the visibility check
        prober.stop.set()
        visible.stop.set()
        prober.join()
        visible.join()
        assert not [k for k in visible.seen if k[2] == 404], sorted(visible.seen)  # never absent
        assert {(0, n, 200) for n in names} <= set(visible.seen)  # and seen serving
        assert not prober.failures, prober.failures[:5]
        assert prober.worst["health"] < 1.0 and prober.worst["embed"] < 2.0, prober.worst  # not blocked by Milvus
        # every write acknowledged before the outage is there
        got = ca.post("/collections/f/search", json={"query": "sentence number", "top_k": 100}).json()
        assert {h["id"] for h in got} >= {i for i in range(50) if i != 5}
        assert ca.get("/collections/f/points/17").json()["payload"] == {"i": 17}
