"""Milvus standalone restarts after SIGKILL, repeated: how long until it answers and serves a loaded collection,
and what a slow one was waiting for.

The real ``milvus`` 2.3.5 server with the tests' settings (:mod:`harness.milvus`: its own network namespace,
authentication, ``common.session.ttl`` 10 s). A collection of ``--points`` vectors (flat index, loaded) is created
once; then ``--cycles`` times: SIGKILL the server and everything it started, restart it at once on the same data (one
try, no retry: the raw behaviour), and time (a) until it answers ``list_collections`` and (b) until a query on the
collection answers (Milvus loads no collection until the dead process's etcd session expires). A start that panics
or does not answer within ``--timeout`` is recorded with the last lines of Milvus's logs that name a wait
("waiting", "node not match", "session", "panic"), then the server is started again (retried, as :meth:`harness.milvus.MilvusServer.start` does).

    python -m bench.milvus.milvus_restart --cycles 8 --json /work/runs/milvus_restart.json

``--container NAME``: the same cycles against a running container instead (the Compose stack's Milvus, e.g.
``podman run -d --name milvus --restart unless-stopped -v milvus:/var/lib/milvus -p 127.0.0.1:19530:19530
redundancy-embed-milvus:2.3.5``, as ``docker/docker-compose.scale.yml`` runs it): SIGKILL of the container's main process from the host
(a crash: ``podman kill`` counts as a stop by hand, after which a restart policy does not act; ``--engine docker``
for Docker), then its restart policy brings it back (started by hand after 10 s if it did not, and said so); ``--uri`` / ``--token`` reach it.

Run it alone: it prints the CPU and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

from bench.lib.machine import cpu_model
from harness.milvus import milvus_client, milvus_server, ping

CLUES = re.compile(r"waiting|wait for|node not match|session|panic|retry|timeout", re.I)


def clues(data_dir: Path, n: int = 12) -> list[str]:
    """The last ``n`` lines of Milvus's own log and its stderr that name a wait, a session or a panic."""
    lines: list[str] = []
    for f in sorted((data_dir / "logs").glob("*.log")):
        lines += [
            f"{f.name}: {line[:300]}" for line in f.read_text(errors="replace").splitlines() if CLUES.search(line)
        ]
    return lines[-n:]


def serving(uri: str, token: str) -> bool:
    """A query on the bench collection answers (the collection is loaded)."""
    try:
        c = milvus_client(uri, token, timeout=3)
        c.query("bench", filter="id >= 0", limit=1)
        c.close()
        return True
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--points", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds a restart may take before it is retried")
    ap.add_argument("--container", help="a running Milvus container to SIGKILL instead of the tests' server")
    ap.add_argument("--engine", default="podman", help="podman or docker (with --container)")
    ap.add_argument("--uri", default="http://127.0.0.1:19530", help="the container's proxy (with --container)")
    ap.add_argument("--token", default="", help="its token (with --container)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    print(f"CPU: {cpu_model()}; load average before: {os.getloadavg()}", flush=True)
    if a.container:
        rows = container_cycles(a)
    else:
        rows = server_cycles(a)
    print(f"load average after: {os.getloadavg()}\n")
    print("| cycle | answers (s) | serves the collection (s) | note |\n|---:|---:|---:|---|")
    for r in rows:
        note = r.get("note", "")
        if r.get("answers_s") is None and "failed_start_s" in r:
            note = f"no answer in {r['failed_start_s']} s; retried: {r['answers_after_retry_s']} s"
        print(f"| {r['cycle']} | {r.get('answers_s') or '-'} | {r['serves_s']} | {note} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))
    return 0


def _fill(uri: str, token: str, points: int) -> None:
    import numpy as np

    c = milvus_client(uri, token)
    if c.has_collection("bench"):
        c.drop_collection("bench")
    c.create_collection("bench", dimension=32, metric_type="COSINE", auto_id=False, id_type="int")
    vecs = np.random.default_rng(0).standard_normal((points, 32)).astype(np.float32)
    c.insert("bench", [{"id": i, "vector": v.tolist()} for i, v in enumerate(vecs)])
    c.flush("bench")
    c.close()


def container_cycles(a) -> list[dict]:
    """SIGKILL the container ``a.container`` ``a.cycles`` times; its restart policy restarts it."""
    import subprocess

    def running() -> bool:
        r = subprocess.run([a.engine, "inspect", "-f", "{{.State.Running}}", a.container], capture_output=True,
                           text=True)  # fmt: skip
        return r.stdout.strip() == "true"

    _fill(a.uri, a.token, a.points)
    assert serving(a.uri, a.token)
    rows = []
    for n in range(1, a.cycles + 1):
        pid = subprocess.run([a.engine, "inspect", "-f", "{{.State.Pid}}", a.container], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        os.kill(int(pid), 9)  # a crash: the engine's restart policy applies (after `kill`/`stop` it would not)
        t0 = time.monotonic()
        row: dict = {"cycle": n, "note": "restart policy"}
        time.sleep(1.0)
        while not running() and time.monotonic() - t0 < 10:
            time.sleep(0.2)
        if not running():
            subprocess.run([a.engine, "start", a.container], check=True, capture_output=True)
            row["note"] = "not restarted by its policy within 10 s: started by hand"
        while not ping(a.uri, a.token) and time.monotonic() - t0 < a.timeout:
            time.sleep(0.5)
        row["answers_s"] = round(time.monotonic() - t0, 1)
        while not serving(a.uri, a.token) and time.monotonic() - t0 < a.timeout:
            time.sleep(0.5)
        row["serves_s"] = round(time.monotonic() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def server_cycles(a) -> list[dict]:
    """SIGKILL the tests' Milvus server ``a.cycles`` times and restart it (see the module docstring)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="milvus_restart-") as tmp, milvus_server(Path(tmp)) as srv:
        _fill(srv.uri, srv.token, a.points)
        assert serving(srv.uri, srv.token)
        for n in range(1, a.cycles + 1):
            srv.kill()
            t0 = time.monotonic()
            row: dict = {"cycle": n}
            try:
                srv.start(timeout=a.timeout, tries=1)
                row["answers_s"] = round(time.monotonic() - t0, 1)
            except RuntimeError:
                row.update(answers_s=None, failed_start_s=round(time.monotonic() - t0, 1), clues=clues(srv.data_dir))
                srv.start(timeout=a.timeout, tries=3)
                row["answers_after_retry_s"] = round(time.monotonic() - t0, 1)
            while not serving(srv.uri, srv.token) and time.monotonic() - t0 < 600:
                time.sleep(0.5)
            row["serves_s"] = round(time.monotonic() - t0, 1)
            if (row.get("answers_s") or 1e9) > 60:
                row.setdefault("clues", clues(srv.data_dir))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
