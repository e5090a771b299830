"""Crash safety: the service is SIGKILLed while a separate process upserts (and deletes) in a loop.

After a restart every acknowledged upsert is stored and searchable, every acknowledged
delete stays deleted, and the collection's count agrees with SQLite. Snapshots are
made every few writes here, so the restart exercises snapshot load + replay.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import REPO_ROOT, free_port, run_server

WRITER = r"""
import json, os, sys, httpx
url, name, log_path = sys.argv[1], sys.argv[2], sys.argv[3]
words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()
log = open(log_path, "a")
def ack(rec):
    log.write(json.dumps(rec) + "\n"); log.flush(); os.fsync(log.fileno())
i = 0
with httpx.Client(base_url=url, timeout=30) as c:
    while True:
        pts = [{"id": i + j, "text": f"record {i + j}: " + " ".join(words[(i + j) // 16 ** k % 16] for k in range(4)),
                "payload": {"n": i + j}} for j in range(8)]
        try:
            r = c.put(f"/collections/{name}/points", json={"points": pts})
        except httpx.HTTPError:
            break
        if r.status_code != 200:
            break
        ack({"upserted": [p["id"] for p in pts]})
        if i % 40 == 32:  # now and then delete two acknowledged ids
            try:
                r = c.post(f"/collections/{name}/points/delete", json={"ids": [i - 30, i - 29]})
            except httpx.HTTPError:
                break
            if r.status_code != 200:
                break
            ack({"deleted": [i - 30, i - 29]})
        i += 8
"""


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_sigkill_mid_stream_loses_no_acknowledged_write(default_artifact: Path, tmp_path: Path, kind: str):
    port = free_port()
    env = {"EMBED_COLLECTIONS_SNAPSHOT_EVERY": "25", "EMBED_COLLECTIONS_MAINTENANCE_INTERVAL_S": "0.1"}
    acks = tmp_path / "acks.jsonl"
    coll_dir = tmp_path / "data" / "collections" / "crash"
    with run_server(default_artifact.parent, workdir=tmp_path, port=port, env=env) as s:
        assert httpx.put(f"{s.url}/collections/crash", json={"index": kind}).status_code == 200
        writer = subprocess.Popen([sys.executable, "-c", WRITER, s.url, "crash", str(acks)], cwd=REPO_ROOT)
        try:
            deadline = time.monotonic() + 120
            while True:  # run until enough writes are acknowledged, some of them after the latest snapshot
                n_acked = len(acks.read_text().splitlines()) if acks.exists() else 0  # = writes = sequence numbers
                snaps = [int(p.name[6:26]) for p in coll_dir.glob("index-*.snap")]
                if n_acked >= 60 and snaps and n_acked - max(snaps) >= 5:
                    break
                assert writer.poll() is None, "writer stopped early"
                assert time.monotonic() < deadline, f"only {n_acked} acknowledged writes in 120s"
                time.sleep(0.1)
            s.kill()  # SIGKILL mid-stream: the writer has a request in flight or about to be
            assert writer.wait(timeout=60) == 0
        finally:
            if writer.poll() is None:
                writer.kill()

    upserted: set[int] = set()
    deleted: set[int] = set()
    for line in acks.read_text().splitlines():
        rec = json.loads(line)
        upserted.update(rec.get("upserted", []))
        deleted.update(rec.get("deleted", []))
    live = upserted - deleted
    assert len(upserted) >= 400 and deleted

    with run_server(default_artifact.parent, workdir=tmp_path, port=port, env=env) as s:
        with httpx.Client(base_url=s.url, timeout=120) as c:
            info = c.get("/collections/crash").json()
            with sqlite3.connect(coll_dir / "points.sqlite3") as db:
                n_sql = db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
                rows = {
                    json.loads(k): np.frombuffer(v, dtype=np.float32)
                    for k, v in db.execute("SELECT key, vector FROM points")
                }
            assert info["count"] == n_sql == len(rows)
            # restored from a snapshot plus replay of the later writes, not by the rebuild-from-SQLite fallback
            load = [ln for ln in s.log().splitlines() if "collection crash:" in ln and " points, " in ln]
            m = re.search(r"snapshot seq (\d+) \+ replay of (\d+) removals, (\d+) rows", load[0]) if load else None
            assert m and int(m.group(3)) > 0, load
            assert info["index"]["vectors"] - info["index"]["tombstones"] == n_sql
            # acknowledged upserts are stored, acknowledged deletes are gone; at most the one
            # unacknowledged in-flight batch (8 points) may additionally be present
            assert live <= set(rows), sorted(live - set(rows))[:10]
            assert not (deleted & set(rows))
            assert len(set(rows) - live) <= 8
            # every acknowledged point is searchable through the index: its own vector finds it first
            ids = sorted(live)
            for i in range(0, len(ids), 200):
                part = ids[i : i + 200]
                r = c.post(
                    "/collections/crash/search/batch",
                    json={
                        "searches": [
                            {"query": rows[j].tolist(), "top_k": 1, "with_payload": False, "with_text": False}
                            for j in part
                        ]
                    },
                )
                assert r.status_code == 200, r.text
                assert [h[0]["id"] for h in r.json()] == part
            # and by text, through the service's embedding path
            j = ids[len(ids) // 2]
            p = c.get(f"/collections/crash/points/{j}").json()
            assert p["payload"] == {"n": j}
            r = c.post("/collections/crash/search", json={"query": p["text"], "top_k": 1})
            assert r.json()[0]["id"] == j
