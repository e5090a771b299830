"""Run the real Milvus standalone server (the ``milvus`` 2.3.5 wheel's ``milvus-server``) on loopback for tests.

The wheel ships Milvus's own server binary (embedded etcd, local storage); it serves gRPC on every interface of
this machine, on ports it picks itself, and tests talk to it on 127.0.0.1 only. ``proxy.timeTickInterval`` is
lowered to 20 ms so that strongly consistent reads wait ~30 ms instead of ~300 ms.

Milvus 2.3.5 standalone sometimes panics at start-up (``GetEmbedEtcdClient``: a component starts before its
embedded etcd, more often on a loaded 2-core machine); the panic is detected in its log and the start retried in a
fresh data directory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.server_utils import free_port


def _ping(uri: str) -> bool:
    from pymilvus import MilvusClient

    try:
        c = MilvusClient(uri=uri, timeout=3)
        c.list_collections()
        c.close()
        return True
    except Exception:
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)  # the wrapper stops its server child on SIGINT
            proc.wait(timeout=20)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group (the server binary)
    except ProcessLookupError:
        pass
    proc.wait(timeout=20)


def _panicked(data_dir: Path) -> bool:
    err = data_dir / "logs" / "milvus-stderr.log"
    return err.exists() and "panic:" in err.read_text(errors="replace")


@contextmanager
def milvus_server(data_dir: Path, timeout: float = 180.0, tries: int = 6) -> Iterator[str]:
    """A Milvus server with its data in ``data_dir``; yields its URI (``http://127.0.0.1:<port>``).

    Raises:
        RuntimeError: the server did not answer within ``timeout`` (its log tail is in the message).
    """
    exe = Path(sys.executable).with_name("milvus-server")
    for p in (2379, 2380):  # Milvus's embedded etcd always takes these (the wrapper cannot move them)
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", p)) == 0:
                raise RuntimeError(
                    f"port {p} is taken (another Milvus or etcd on this machine?); the test server needs it"
                )
    last = ""
    root = data_dir
    for attempt in range(tries):
        port = free_port()
        data_dir = root / f"try{attempt}"
        data_dir.mkdir(parents=True, exist_ok=True)
        log = data_dir / "milvus-server.log"
        cmd = [
            str(exe),
            "--data",
            str(data_dir),
            "--proxy-port",
            str(port),
            "--extra-config",
            "proxy.timeTickInterval=20",
        ]
        with open(log, "ab") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        uri = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None and not _panicked(data_dir) and not _ping(uri):
            time.sleep(1.0)
        if proc.poll() is None and not _panicked(data_dir) and _ping(uri):
            try:
                yield uri
            finally:
                _stop(proc)
            return
        _stop(proc)  # a failed start: try again on fresh ports and a fresh data directory
        stderr = data_dir / "logs" / "milvus-stderr.log"
        last = (
            stderr.read_text(errors="replace")[-2000:] if stderr.exists() else log.read_text(errors="replace")[-2000:]
        )
    raise RuntimeError(f"milvus-server did not start:\n{last}")
