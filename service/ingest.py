"""``python -m service.ingest FILE --collection NAME``: upsert a file into a collection of a running service.

Input formats (``--format auto`` picks ``jsonl`` for ``.jsonl``/``.ndjson`` files, else ``text``):

* ``text``: one point per non-empty line; ``id`` = the 1-based line number, ``text`` = the line.
* ``jsonl``: one JSON object per non-empty line: ``{"id": ..., "text": ..., "payload": {...}}``;
  ``text`` is required, ``id`` defaults to the line number, ``payload`` to ``{}``.

Points are sent in batches (``--batch-size``; a batch is also cut before its JSON body
reaches ``--max-body-bytes``) to ``PUT /collections/NAME/points``, which answers once the
write is durable. Transient failures (connection errors, 429, 5xx) are retried with
exponential back-off. A progress bar shows lines done.

Resume: after each acknowledged batch, the last line number it covered is written
(atomically) to a state file (``--state-file``; default ``.ingest-<collection>-<hash of the
file path>.json`` in the current directory). Rerunning the same command skips the lines
already acknowledged; upserts are idempotent (same id, same text), so a batch that was
in flight at the interruption is simply sent again. ``--restart`` ignores the state.
The state also records the file's size and a hash of its first 64 KiB; if those change,
ingestion starts from the top.

``--create`` first creates the collection (``--index``, ``--metric``, ``--params`` JSON);
an existing collection is used as is.

Exit status: 0 done, 1 a request was rejected (message on stderr), 2 bad arguments/input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


class IngestError(RuntimeError):
    """The service rejected a batch, or the input is malformed; the message says which lines."""


def detect_format(path: Path, fmt: str) -> str:
    """``text`` or ``jsonl`` for ``fmt`` (``auto`` decides by file extension)."""
    if fmt != "auto":
        return fmt
    return "jsonl" if path.suffix.lower() in (".jsonl", ".ndjson") else "text"


def read_points(path: Path, fmt: str, skip_through: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line_number, point)`` for each non-empty line after line ``skip_through`` (1-based).

    Raises:
        IngestError: a JSONL line is not an object with a string ``text``.
    """
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, start=1):
            if no <= skip_through:
                continue
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            if fmt == "text":
                yield no, {"id": no, "text": line}
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise IngestError(f"{path}:{no}: not JSON: {e}") from e
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise IngestError(f"{path}:{no}: expected an object with a string 'text'")
            unknown = set(obj) - {"id", "text", "payload"}
            if unknown:
                raise IngestError(f"{path}:{no}: unknown fields {sorted(unknown)} (allowed: id, text, payload)")
            point = {"id": obj.get("id", no), "text": obj["text"]}
            if obj.get("payload") is not None:
                point["payload"] = obj["payload"]
            yield no, point


def fingerprint(path: Path) -> dict[str, Any]:
    """The file's absolute path, size and sha256 of its first 64 KiB."""
    with open(path, "rb") as f:
        head = f.read(65536)
    return {"file": str(path.resolve()), "size": path.stat().st_size, "head_sha256": hashlib.sha256(head).hexdigest()}


def default_state_file(path: Path, collection: str) -> Path:
    """``.ingest-<collection>-<sha1(abs path)[:12]>.json`` in the current directory."""
    h = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return Path(f".ingest-{collection}-{h}.json")


def load_state(state_file: Path, fp: dict[str, Any], collection: str) -> int:
    """The last acknowledged line recorded for this file and collection, else 0."""
    try:
        st = json.loads(state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    if st.get("collection") != collection or any(st.get(k) != v for k, v in fp.items()):
        print(
            f"ingest: {state_file} is for another file, version or collection; starting from the top", file=sys.stderr
        )
        return 0
    return int(st.get("last_line", 0))


def save_state(state_file: Path, fp: dict[str, Any], collection: str, last_line: int, points: int, done: bool) -> None:
    """Write the state atomically (temp file, fsync, rename)."""
    tmp = state_file.with_name(state_file.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(
            {
                **fp,
                "collection": collection,
                "last_line": last_line,
                "points": points,
                "done": done,
                "updated": time.time(),
            },
            f,
        )
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_file)


def count_lines(path: Path) -> int:
    """Number of lines (for the progress bar)."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def batches(
    points: Iterator[tuple[int, dict[str, Any]]], size: int, max_bytes: int
) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """``(last_line, points)`` batches of at most ``size`` points and about ``max_bytes`` of JSON."""
    batch: list[dict[str, Any]] = []
    nbytes, last = 20, 0
    for no, p in points:
        pb = len(json.dumps(p, ensure_ascii=False).encode()) + 1
        if batch and (len(batch) >= size or nbytes + pb > max_bytes):
            yield last, batch
            batch, nbytes = [], 20
        batch.append(p)
        nbytes += pb
        last = no
    if batch:
        yield last, batch


def request(client: httpx.Client, method: str, url: str, body: Any, retries: int) -> httpx.Response:
    """Send, retrying connection errors, 429 and 5xx with exponential back-off (honours Retry-After)."""
    delay = 0.5
    for attempt in range(retries + 1):
        try:
            r = client.request(method, url, json=body)
            if r.status_code != 429 and r.status_code < 500:
                return r
            wait = float(r.headers.get("Retry-After", delay))
            why = f"HTTP {r.status_code}"
        except httpx.TransportError as e:
            wait, why = delay, f"{type(e).__name__}: {e}"
        if attempt == retries:
            raise IngestError(f"{method} {url} failed after {retries} retries: {why}")
        print(f"ingest: {why}; retrying in {wait:.1f}s", file=sys.stderr)
        time.sleep(wait)
        delay = min(delay * 2, 30)
    raise AssertionError("unreachable")


def _error_text(r: httpx.Response) -> str:
    try:
        return r.json()["error"]["message"]
    except Exception:
        return r.text[:500]


def ingest(
    path: Path,
    collection: str,
    url: str = "http://127.0.0.1:8000",
    *,
    fmt: str = "auto",
    batch_size: int = 64,
    max_body_bytes: int = 1_500_000,
    create: bool = False,
    index: str = "flat",
    metric: str = "cosine",
    params: dict[str, Any] | None = None,
    state_file: Path | None = None,
    restart: bool = False,
    api_key: str | None = None,
    retries: int = 8,
    progress: bool = True,
    timeout: float = 300.0,
) -> int:
    """Upsert every point of ``path`` into ``collection``; returns the number of points sent in this run.

    Raises:
        IngestError: malformed input, or the service rejected a request (4xx other than 429).
    """
    from tqdm import tqdm

    fmt = detect_format(path, fmt)
    fp = fingerprint(path)
    state_file = state_file or default_state_file(path, collection)
    start = 0 if restart else load_state(state_file, fp, collection)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sent = 0
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout, headers=headers) as client:
        if create:
            body = {"index": index, "metric": metric, **({"params": params} if params else {})}
            r = request(client, "PUT", f"/collections/{collection}", body, retries)
            if r.status_code == 409:
                print(f"ingest: collection {collection!r} exists; adding to it", file=sys.stderr)
            elif r.status_code != 200:
                raise IngestError(f"creating collection {collection!r}: HTTP {r.status_code}: {_error_text(r)}")
        total = count_lines(path)
        bar = tqdm(
            total=total, initial=min(start, total), unit="line", desc=f"ingest {collection}", disable=not progress
        )
        if start:
            print(f"ingest: resuming after line {start} (state {state_file})", file=sys.stderr)
        done_line = start
        for last_line, pts in batches(read_points(path, fmt, start), batch_size, max_body_bytes):
            r = request(client, "PUT", f"/collections/{collection}/points", {"points": pts}, retries)
            if r.status_code != 200:
                bar.close()
                raise IngestError(f"lines {done_line + 1}-{last_line}: HTTP {r.status_code}: {_error_text(r)}")
            sent += len(pts)
            save_state(state_file, fp, collection, last_line, sent, done=False)
            bar.update(last_line - done_line)
            done_line = last_line
        bar.update(max(total - done_line, 0))
        bar.close()
        save_state(state_file, fp, collection, total, sent, done=True)
    return sent


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m service.ingest", description=__doc__.split("\n\n")[0])
    p.add_argument("file", type=Path, help="plain text (one item a line) or JSONL (id/text/payload)")
    p.add_argument("--collection", required=True)
    p.add_argument(
        "--url", default=os.environ.get("EMBED_URL", "http://127.0.0.1:8000"), help="service base URL (env EMBED_URL)"
    )
    p.add_argument("--format", choices=["auto", "text", "jsonl"], default="auto")
    p.add_argument("--batch-size", type=int, default=64, help="points per request")
    p.add_argument(
        "--max-body-bytes", type=int, default=1_500_000, help="cut a batch before its JSON body exceeds this"
    )
    p.add_argument("--create", action="store_true", help="create the collection first (kept if it exists)")
    p.add_argument("--index", default="flat", help="index type; the server validates it (GET /openapi.json lists them)")
    p.add_argument("--metric", choices=["cosine", "dot", "l2"], default="cosine")
    p.add_argument("--params", type=json.loads, default=None, help="index params as JSON, e.g. '{\"M\": 32}'")
    p.add_argument("--state-file", type=Path, default=None)
    p.add_argument("--restart", action="store_true", help="ignore saved progress and send every line")
    p.add_argument("--api-key", default=os.environ.get("EMBED_API_KEY"), help="bearer token (env EMBED_API_KEY)")
    p.add_argument("--retries", type=int, default=8)
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if not a.file.is_file():
        print(f"ingest: {a.file}: no such file", file=sys.stderr)
        return 2
    if a.batch_size < 1:
        print("ingest: --batch-size must be >= 1", file=sys.stderr)
        return 2
    try:
        n = ingest(
            a.file,
            a.collection,
            a.url,
            fmt=a.format,
            batch_size=a.batch_size,
            max_body_bytes=a.max_body_bytes,
            create=a.create,
            index=a.index,
            metric=a.metric,
            params=a.params,
            state_file=a.state_file,
            restart=a.restart,
            api_key=a.api_key,
            retries=a.retries,
            progress=not a.no_progress,
        )
    except IngestError as e:
        print(f"ingest: {e}", file=sys.stderr)
        return 1
    print(f"ingest: {n} points upserted into {a.collection!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
