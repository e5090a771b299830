"""Start the real service as a uvicorn subprocess on a free loopback port, for the tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ServerProcess:
    """A running service: its base URL, process and log file."""

    url: str
    port: int
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default: a crash) and wait for the process to end."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)


def wait_ready(
    url: str, proc: subprocess.Popen, timeout: float = 180.0, log_path: Path | None = None, path: str = "/ready"
) -> None:
    """Poll ``GET {path}`` (``/ready``) until 200, or raise with the server log if it dies or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = log_path.read_text(errors="replace") if log_path else ""
            raise RuntimeError(f"server exited with {proc.returncode} before ready:\n{log[-4000:]}")
        try:
            if httpx.get(f"{url}{path}", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"server at {url} not ready after {timeout}s")


@contextmanager
def run_server(
    models_dir: Path,
    *,
    workdir: Path,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    port: int | None = None,
    ready_timeout: float = 180.0,
    ready_path: str = "/ready",
) -> Iterator[ServerProcess]:
    """Run ``python -m service`` on 127.0.0.1 and stop it (SIGTERM, then SIGKILL) afterwards.

    Args:
        models_dir: the artifact store the server loads from.
        workdir: where the log file goes (and the default data dir, ``workdir/data``).
        args: extra CLI flags (e.g. ``["--max-client-batch-size", "8"]``).
        env: extra environment variables.
        port: a fixed port (to restart on the same URL); a free one by default.
        ready_path: the route that must answer 200 before the server is handed over (``/health``: started, maybe
            not ready).
    """
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"server-{port}-{int(time.time() * 1000)}.log"
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--models-dir",
        str(models_dir),
        "--data-dir",
        str(workdir / "data"),
        *(args or []),
    ]
    # no drain window on SIGTERM unless a test asks for one (--drain-s): teardown stays fast
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "EMBED_DRAIN_S": "0", **(env or {})}
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=full_env, stdout=logf, stderr=subprocess.STDOUT)
    server = ServerProcess(url, port, proc, log_path)
    try:
        wait_ready(url, proc, ready_timeout, log_path, ready_path)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def collections_server(request, default_artifact: Path, tmp_path_factory) -> Iterator[dict]:
    """Body of a module-scoped fixture parametrised by collections backend (``request.param``: ``embedded`` or
    ``milvus``, the latter on the session's Milvus server): a running service on a fixed port and data dir
    (restartable), and its state ``{models, work, port, backend, uri, prefix, args, server, client}``."""
    import uuid

    from tests.conftest import backend_args

    backend = request.param
    work = tmp_path_factory.mktemp(f"collections-{backend}")
    uri = request.getfixturevalue("milvus_uri") if backend == "milvus" else None
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    state = {"models": default_artifact.parent, "work": work, "port": free_port(), "backend": backend, "uri": uri,
             "prefix": prefix, "args": backend_args(backend, uri, prefix)}  # fmt: skip
    with run_server(state["models"], workdir=work, port=state["port"], args=state["args"]) as s:
        state["server"] = s
        with httpx.Client(base_url=s.url, timeout=120) as c:
            state["client"] = c
            yield state


def embed_either(post, texts: list[str], rng) -> tuple[httpx.Response, list | None]:
    """Embed ``texts`` through the OpenAI route or the TEI route, chosen by ``rng`` (a ``random.Random``), with
    ``post(path, json) -> httpx.Response``: the answer and its rows (None when it is not a 200). Transport errors
    (``httpx.HTTPError``) are the caller's."""
    if rng.random() < 0.5:
        r = post("/v1/embeddings", {"input": texts})
        return r, ([d["embedding"] for d in r.json()["data"]] if r.status_code == 200 else None)
    r = post("/embed", {"inputs": texts})
    return r, (r.json() if r.status_code == 200 else None)


def post_in_background(url: str, path: str, body: dict, headers: dict[str, str]) -> tuple[threading.Thread, dict]:
    """``POST url+path`` in a thread started now (a request in flight while the test does something else): the
    thread, and its answer once joined: ``{"status": code, "rows": len(json)}``, or ``{"status": <error name>}``
    when the transport failed."""
    answer: dict[str, object] = {}

    def send() -> None:
        try:
            r = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=120)
            answer["status"], answer["rows"] = r.status_code, len(r.json())
        except httpx.HTTPError as e:
            answer["status"] = type(e).__name__

    t = threading.Thread(target=send)
    t.start()
    return t, answer


class SwapLoad:
    """Closed-loop embedding clients around a hot swap: ``threads`` workers post random samples of ``sentences``
    (``sizes`` texts a request, through :func:`embed_either`) to ``url`` until the ``with`` block ends, recording per
    answer ``(request start, model version, rows match refs[version] within 1e-4)`` in :attr:`results` and every
    transport error or non-200 answer in :attr:`failures`.

    Args:
        refs: ``{version: {text: row}}``, the rows each version must answer.
        new_connections: a new connection per request (behind fronts: the kernel hands each to any of them);
            else one keep-alive connection per worker.
        check: called with every 200 answer and the version it names (an extra assertion of the caller's).
    """

    def __init__(
        self,
        url: str,
        sentences: list[str],
        refs: dict[str, dict],
        *,
        threads: int = 4,
        sizes: tuple[int, ...] = (1, 4, 8),
        headers: dict[str, str] | None = None,
        new_connections: bool = False,
        check=None,
    ) -> None:
        self.url, self.sentences, self.refs, self.sizes = url, sentences, refs, sizes
        self.headers, self.new_connections, self.check = headers or {}, new_connections, check
        self.results: list[tuple[float, str, bool]] = []
        self.failures: list[str] = []
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._threads = [threading.Thread(target=self._worker, args=(s,)) for s in range(threads)]

    def __enter__(self) -> SwapLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def split(self, at: float) -> tuple[list[str], list[str]]:
        """The versions that answered requests started before ``at`` and after it (``time.monotonic()``)."""
        return [v for t0, v, _ in self.results if t0 < at], [v for t0, v, _ in self.results if t0 > at]

    def _poster(self, c: httpx.Client):
        """``post(path, json)`` over ``c``, or over a new connection each time (``new_connections``)."""
        if not self.new_connections:
            return lambda path, body: c.post(path, json=body)
        return lambda path, body: httpx.post(self.url + path, json=body, headers=self.headers, timeout=120.0)

    def _worker(self, seed: int) -> None:
        import random

        import numpy as np

        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=120.0, headers=self.headers) as c:
            while not self._stop.is_set():
                texts = rng.sample(self.sentences, rng.choice(self.sizes))
                t0 = time.monotonic()
                try:
                    r, rows = embed_either(self._poster(c), texts, rng)
                except httpx.HTTPError as e:
                    with self._lock:
                        self.failures.append(f"{type(e).__name__}: {e}")
                    continue
                if rows is None:
                    with self._lock:
                        self.failures.append(f"{r.status_code}: {r.text[:300]}")
                    continue
                version = r.headers["x-model"].rpartition(":")[2]
                try:
                    if self.check is not None:
                        self.check(r, version)
                except AssertionError as e:
                    with self._lock:
                        self.failures.append(f"check: {e}")
                got = np.asarray(rows, np.float32)
                want = np.stack([self.refs[version][t] for t in texts]) if version in self.refs else None
                ok = want is not None and got.shape == want.shape and bool(np.allclose(got, want, atol=1e-4))
                with self._lock:
                    self.results.append((t0, version, ok))
