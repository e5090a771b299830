"""Server-side ``qdrant/bm25`` document vectors made in worker processes (``sparse_workers``): the same vectors as
the serving process makes (and as fastembed's), the same vectors stored whatever the path (worker processes, the
serving process, or the client sending them), malformed client vectors refused as before, and workers that do not
outlive the service (SIGKILL included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

pytest.importorskip("fastembed")

from service.collections.schema import VectorsConfig, point_vectors, sparse_vec  # noqa: E402
from service.collections.sparse_inputs import unpacked  # noqa: E402
from service.inference.sparse import Bm25, Lazy, _as_dict, open_sparse_models  # noqa: E402
from service.inference.sparse.pool import MIN_TEXTS, ProcessPooled  # noqa: E402
from tests.server_utils import run_server  # noqa: E402
from tests.service.inference.test_bm25_documents import EDGES, corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def test_worker_processes_make_the_serving_process_vectors_and_fastembeds():
    pooled = open_sparse_models(SimpleNamespace(sparse_bm25_path=None, sparse_workers=2))["qdrant/bm25"]
    assert isinstance(pooled, ProcessPooled)
    local = Bm25()
    try:
        for texts in (corpus(120, 3) + EDGES, corpus(MIN_TEXTS - 1, 4), []):  # split over 2 workers; in process
            want = [_as_dict(e.indices, e.values) for e in local.model.raw_embed(texts)]
            assert pooled.documents(texts) == want == local.documents(texts)
            got, ref = pooled.document_arrays(texts), local.document_arrays(texts)
            for a, b, dtype in zip(got, ref, (np.uint32, np.float32, np.int64)):
                assert a.dtype == dtype and np.array_equal(a, b)
            made = unpacked(got, len(texts), "qdrant/bm25")  # what a write stores: the client's vector, checked
            for vec, w in zip(made, want):
                client = sparse_vec(w["indices"], w["values"], "v")
                assert np.array_equal(vec.indices, client.indices) and np.array_equal(vec.values, client.values)
        texts = corpus(MIN_TEXTS, 7)
        for pid in list(pooled._get()._processes):  # workers killed: the batch is made here, then a new pool
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        assert pooled.documents(texts) == local.documents(texts) == pooled.documents(texts)
    finally:
        pooled.close()


def test_the_default_is_one_worker_process_where_there_are_two_cores():
    def model(workers: int | None) -> object:
        return open_sparse_models(SimpleNamespace(sparse_bm25_path=None, sparse_workers=workers))["qdrant/bm25"]

    assert isinstance(model(None), ProcessPooled) == ((os.cpu_count() or 1) > 1)
    assert isinstance(model(0), Lazy) and isinstance(model(3), ProcessPooled)


def test_packed_vectors_are_checked_once_and_kept_by_point_vectors():
    idx, vals, off = np.array([1, 5, 2, 3], np.uint32), np.array([0.5, 1, 2, 3], np.float32), np.array([0, 2, 4])
    made = unpacked((idx, vals, off), 2, "m")
    assert [v.indices.tolist() for v in made] == [[1, 5], [2, 3]]
    cfg = VectorsConfig.from_json({"sparse": {"s": {"modifier": "idf", "model": None}}})
    assert point_vectors(cfg, [{"s": made[0]}])[0]["s"] is made[0]  # made by the service: not checked again
    for bad in (
        (np.array([5, 1, 2, 3], np.uint32), vals, off),  # not increasing within a vector
        (idx, np.array([0.5, np.nan, 2, 3], np.float32), off),  # not finite
        (idx, vals, np.array([0, 2, 5])),  # offsets past the end
        (idx, vals, np.array([0, 4])),  # one vector for two texts
    ):
        with pytest.raises(RuntimeError):
            unpacked(bad, 2, "m")
    assert isinstance(unpacked((idx[:0], vals[:0], np.zeros(1, np.int64)), 0, "m"), list)
    with pytest.raises(Exception, match="not an integer"):
        point_vectors(cfg, [{"s": {"indices": [1, True], "values": [1.0, 2.0]}}])


def test_workers_exit_when_the_service_is_killed(tmp_path):
    code = (
        "import os, sys\n"
        "from service.inference.sparse.pool import MIN_TEXTS, ProcessPooled\n"
        "from service.inference.sparse import Bm25, Lazy\n"
        "from functools import partial\n"
        "p = ProcessPooled(partial(Bm25, None), 2, Lazy(partial(Bm25, None)))\n"
        "p.document_arrays(['a b c'] * MIN_TEXTS)\n"
        "print(' '.join(str(x) for x in p._get()._processes), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(x) for x in proc.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (not reaped yet by init) has exited
        return f.read().split(")")[1].split()[0] != "Z"


def test_the_same_vectors_are_stored_whatever_the_path(default_artifact: Path, tmp_path):
    texts = corpus(MIN_TEXTS + 8, 5) + corpus(3, 6)  # one batch for the workers, one made in the server's process
    given = Bm25().documents(texts)
    with run_server(default_artifact.parent, workdir=tmp_path, env={"EMBED_SPARSE_WORKERS": "1"}) as s:
        c = httpx.Client(base_url=f"{s.url}/qdrant", timeout=120)
        r = c.put("/collections/w", json={"sparse_vectors": {"bm25": {"modifier": "idf"}}})
        assert r.status_code == 200, r.text
        n, big = len(texts), MIN_TEXTS + 8
        for part in (range(big), range(big, n)):
            doc = [{"id": i, "vector": {"bm25": {"text": texts[i], "model": "qdrant/bm25"}}} for i in part]
            own = [{"id": n + i, "vector": {"bm25": given[i]}} for i in part]
            for pts in (doc, own):
                r = c.put("/collections/w/points?wait=true", json={"points": pts})
                assert r.status_code == 200, r.text
        r = c.post("/collections/w/points", json={"ids": list(range(2 * n)), "with_vector": True})
        got = {p["id"]: p["vector"]["bm25"] for p in r.json()["result"]}
        for i in range(n):
            assert got[i]["indices"] == got[n + i]["indices"] == given[i]["indices"]
            assert got[i]["values"] == got[n + i]["values"]
            assert np.allclose(got[i]["values"], given[i]["values"], rtol=1e-6)
        bad = {"points": [{"id": 0, "vector": {"bm25": {"indices": [1, 1], "values": [1.0, 2.0]}}}]}
        assert c.put("/collections/w/points?wait=true", json=bad).status_code == 422
        kids = subprocess.run(["pgrep", "-P", str(s.proc.pid), "-f", "spawn_main"], capture_output=True, text=True)
        assert len(kids.stdout.split()) == 1  # the big batch was made by the one worker process
