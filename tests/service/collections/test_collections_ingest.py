"""``python -m service.ingest`` against the real service: text and JSONL files, resume after a kill."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.server_utils import REPO_ROOT, run_server
from training.data.sts import load_task


def _ingest(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "service.ingest", *args, "--no-progress"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ingest_text_and_jsonl_with_resume(default_artifact: Path, tmp_path: Path):
    pairs = load_task("STSBenchmark")
    sentences = list(dict.fromkeys(pairs.sent1))[:400]
    text_file = tmp_path / "sentences.txt"
    text_file.write_text("\n".join(sentences[:200]) + "\n\n" + "\n".join(sentences[200:]) + "\n")  # a blank line 201
    jsonl_file = tmp_path / "points.jsonl"
    jsonl_file.write_text(
        "".join(
            json.dumps({"id": f"s{i}", "text": s, "payload": {"i": i}}) + "\n" for i, s in enumerate(sentences[:50])
        )
    )
    state = tmp_path / "state.json"
    with run_server(default_artifact.parent, workdir=tmp_path) as s:
        c = httpx.Client(base_url=s.url, timeout=60)
        # 1. interrupted run: killed once some batches are acknowledged
        p = _ingest(
            str(text_file),
            "--collection",
            "docs",
            "--url",
            s.url,
            "--create",
            "--index",
            "hnsw",
            "--batch-size",
            "10",
            "--state-file",
            str(state),
        )
        deadline = time.monotonic() + 120
        while not (state.exists() and json.loads(state.read_text())["last_line"] >= 60):
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        done_before = json.loads(state.read_text())["last_line"]
        assert 60 <= done_before < 401
        # 2. the same command resumes after the last acknowledged line
        p = _ingest(
            str(text_file),
            "--collection",
            "docs",
            "--url",
            s.url,
            "--create",
            "--index",
            "hnsw",
            "--batch-size",
            "64",
            "--state-file",
            str(state),
        )
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert f"resuming after line {done_before}" in err
        sent = int(err.strip().splitlines()[-1].split()[1])
        assert sent < 400 and sent >= 400 - done_before
        info = c.get("/collections/docs").json()
        assert info["count"] == 400 and info["index"]["type"] == "hnsw"
        # ids are line numbers (the blank line 201 is skipped, so sentence 200 is on line 202)
        assert c.get("/collections/docs/points/1").json()["text"] == sentences[0]
        assert c.get("/collections/docs/points/202").json()["text"] == sentences[200]
        assert c.get("/collections/docs/points/201").status_code == 404
        hit = c.post("/collections/docs/search", json={"query": sentences[123], "top_k": 1}).json()[0]
        assert hit["text"] == sentences[123]
        # 3. JSONL with string ids and payloads into a new collection
        p = _ingest(
            str(jsonl_file),
            "--collection",
            "docs_json",
            "--url",
            s.url,
            "--create",
            "--state-file",
            str(tmp_path / "st1.json"),
        )
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert c.get("/collections/docs_json").json()["count"] == 50
        assert c.get("/collections/docs_json/points/s7").json() == {
            "id": "s7",
            "text": sentences[7],
            "payload": {"i": 7},
        }
        # 4. a rejected batch is an error with the line range (collection does not exist, no --create)
        p = _ingest(
            str(jsonl_file), "--collection", "missing", "--url", s.url, "--state-file", str(tmp_path / "st2.json")
        )
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1 and "lines 1-50: HTTP 404" in err
