"""The service (``python -m service``) as a subprocess on a loopback port, for the benchmarks: the command line, the
wait for ``/ready``, and a context manager that starts and stops it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.lib import REPO
from harness.ports import free_port


def service_command(port: int, models_dir: str | Path, data_dir: str | Path, args: Sequence[str] = ()) -> list[str]:
    """``python -m service`` on ``127.0.0.1:port`` with these models and data directories, then ``args``."""
    where = ["--host", "127.0.0.1", "--port", str(port), "--models-dir", str(models_dir), "--data-dir", str(data_dir)]
    return [sys.executable, "-m", "service", *where, *args]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180.0, log_path: Path | None = None) -> None:
    """Return once ``GET {url}/ready`` answers 200; raise if ``proc`` ends first (with the tail of ``log_path``) or
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        try:
            if httpx.get(f"{url}/ready", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the service at {url} is not ready after {timeout:.0f} s")
        time.sleep(0.25)
    tail = log_path.read_text(errors="replace")[-4000:] if log_path and log_path.exists() else ""
    raise RuntimeError(f"the service at {url} exited with {proc.returncode} before it was ready:\n{tail}")


@dataclass
class Server:
    """A running service: its base URL and process."""

    url: str
    proc: subprocess.Popen

    def kill(self) -> None:
        """SIGKILL it (a crash) and wait for the end."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL if it still runs 30 s later."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        self.kill()


@contextmanager
def run_server(
    models_dir: Path,
    *,
    workdir: Path,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Iterator[Server]:
    """The service on ``127.0.0.1:port`` (a free port by default) over ``models_dir``, its data under
    ``workdir/data`` and its log in ``workdir``; handed over once ready, stopped afterwards (SIGTERM, SIGKILL after
    30 s). ``EMBED_DRAIN_S`` is 0 (no drain window at the end) unless ``env`` sets it."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"service-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "EMBED_DRAIN_S": "0", **(env or {})}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            service_command(port, models_dir, workdir / "data", args),
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", proc)
    try:
        wait_ready(server.url, proc, log_path=log_path)
        yield server
    finally:
        server.stop()
