"""Run the real Milvus standalone server (the ``milvus`` 2.3.5 wheel's ``milvus-server``) for tests and benchmarks,
with authentication on, and kill or restart it on the same data (the fault tests).

The wheel ships Milvus's own server binary (embedded etcd, local storage). Its embedded etcd listens on loopback
(2379-2380, fixed: one Milvus per machine), but its gRPC ports, and the proxy port that also serves Milvus's REST
API, listen on every interface: no setting of Milvus 2.3 binds them to loopback. So the server runs with
authentication on (``common.security.authorizationEnabled``) and root's default password ``Milvus`` replaced by a
random one; clients pass ``token="root:<password>"`` (the service: ``EMBED_COLLECTIONS_MILVUS_TOKEN``).
``proxy.timeTickInterval`` is lowered to 20 ms so that strongly consistent reads wait ~30 ms instead of ~300 ms, and
``common.session.ttl`` to 10 s (from 30): after a crash, Milvus loads no collection until the dead process's etcd
session expires ("node not match" in its log), so this bounds how long a restarted server answers "collection not
loaded".

Milvus 2.3.5 standalone sometimes panics at start-up (``GetEmbedEtcdClient``: a component starts before its
embedded etcd, more often on a loaded 2-core machine); the panic is detected in its log and the start retried (a
first start in a fresh data directory, a restart in the same one).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.server_utils import free_port

DEFAULT_ROOT_PASSWORD = "Milvus"  # Milvus's documented default; changed at once by milvus_server


def milvus_client(uri: str, token: str | None = None, **kw):
    """A pymilvus ``MilvusClient`` on ``uri`` with ``token`` (default: ``$EMBED_COLLECTIONS_MILVUS_TOKEN``)."""
    from pymilvus import MilvusClient

    return MilvusClient(
        uri=uri, token=token if token is not None else os.environ.get("EMBED_COLLECTIONS_MILVUS_TOKEN", ""), **kw
    )


def _ping(uri: str, token: str) -> bool:
    try:
        c = milvus_client(uri, token, timeout=3)
        c.list_collections()
        c.close()
        return True
    except Exception:
        return False


def _panicked(data_dir: Path) -> bool:
    err = data_dir / "logs" / "milvus-stderr.log"
    return err.exists() and "panic:" in err.read_text(errors="replace")


class MilvusServer:
    """One ``milvus-server`` process: its data directory, proxy port and root token.

    Args:
        data_dir: where Milvus keeps its data (kept across :meth:`kill` and :meth:`start`).
        port: the proxy port (gRPC and REST).
        tick_ms, extra_config: see :func:`milvus_server`.
    """

    def __init__(self, data_dir: Path, port: int, tick_ms: int = 20, extra_config: tuple[str, ...] = ()) -> None:
        self.data_dir, self.port, self.tick_ms, self.extra_config = data_dir, port, tick_ms, extra_config
        self.token = f"root:{DEFAULT_ROOT_PASSWORD}"
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0, tries: int = 4) -> None:
        """Start the server on this data directory and port (a restart keeps every collection and the password).

        Raises:
            RuntimeError: it did not answer within ``timeout`` in ``tries`` attempts (its log tail in the message).
        """
        exe = Path(sys.executable).with_name("milvus-server")
        last = ""
        for _ in range(tries):
            (self.data_dir / "logs" / "milvus-stderr.log").unlink(missing_ok=True)
            cmd = [str(exe), "--data", str(self.data_dir), "--proxy-port", str(self.port),
                   "--authorization-enabled", "true", "--extra-config", f"proxy.timeTickInterval={self.tick_ms}",
                   "--extra-config", "common.session.ttl=10",
                   *(a for kv in self.extra_config for a in ("--extra-config", kv))]  # fmt: skip
            with open(self.data_dir / "milvus-server.log", "ab") as f:
                self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.alive() and not _panicked(self.data_dir):
                if _ping(self.uri, self.token):
                    return
                time.sleep(1.0)
            self.stop()
            stderr = self.data_dir / "logs" / "milvus-stderr.log"
            log = stderr if stderr.exists() else self.data_dir / "milvus-server.log"
            last = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            print(f"milvus-server on {self.data_dir} did not answer within {timeout:.0f} s:\n{last}", file=sys.stderr)
            for own in sorted((self.data_dir / "logs").glob("standalone-*.log"))[-1:]:  # Milvus's own log
                print(f"{own}:\n{own.read_text(errors='replace')[-4000:]}", file=sys.stderr)
        raise RuntimeError(f"milvus-server did not start:\n{last}")

    def secure(self) -> None:
        """Replace root's default password by a random one (``token`` follows)."""
        password = secrets.token_urlsafe(16)
        c = milvus_client(self.uri, self.token)
        c.update_password("root", DEFAULT_ROOT_PASSWORD, password)
        c.close()
        self.token = f"root:{password}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server and everything it started (a crash)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=20)

    def stop(self) -> None:
        """Stop the server (SIGINT to its wrapper, then SIGKILL whatever is left)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)  # the wrapper stops its server child on SIGINT
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        self.kill()


@contextmanager
def milvus_server(data_dir: Path, timeout: float = 180.0, tries: int = 6, tick_ms: int = 20,
                  extra_config: tuple[str, ...] = ()) -> Iterator[MilvusServer]:  # fmt: skip
    """A running, password-protected Milvus server with its data under ``data_dir`` (``tick_ms``: its
    ``proxy.timeTickInterval``; Milvus's default is 200; ``extra_config``: more ``key=value`` settings of its
    ``milvus.yaml``, as ``milvus-server --extra-config`` takes them).

    Raises:
        RuntimeError: ports 2379-2380 are taken, or the server did not start (its log tail is in the message).
    """
    for p in (2379, 2380):  # Milvus's embedded etcd always takes these (the wrapper cannot move them)
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", p)) == 0:
                raise RuntimeError(
                    f"port {p} is taken (another Milvus or etcd on this machine?); the test server needs it"
                )
    last: Exception | None = None
    for attempt in range(tries):  # a failed first start: fresh ports and a fresh data directory
        d = data_dir / f"try{attempt}"
        d.mkdir(parents=True, exist_ok=True)
        server = MilvusServer(d, free_port(), tick_ms, extra_config)
        try:
            server.start(timeout, tries=1)
            server.secure()
            break
        except RuntimeError as e:
            last = e
    else:
        raise RuntimeError(f"milvus-server did not start in {tries} tries: {last}")
    try:
        yield server
    finally:
        server.stop()
