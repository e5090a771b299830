"""A Milvus standalone server (the ``milvus`` 2.3.5 wheel's ``milvus-server``, embedded etcd, local storage) for the
benchmarks that need a real one: password-protected, killed and restarted on the same data.

Settings: authentication on, root's default password replaced by a random one at the first start (clients pass
``token="root:<password>"``); ``proxy.timeTickInterval`` ``tick_ms`` (20 ms by default, so that strongly consistent
reads wait ~30 ms instead of ~300 ms; Milvus's own default is 200); ``common.session.ttl`` 10 s (from 30: after a
crash Milvus loads no collection until the dead process's etcd session expires); no REST API
(``proxy.http.enabled=false``) and no ``/debug/pprof`` (``PROXY_HTTP_ENABLEPPROF=false``).

The server runs in this host's network namespace: Milvus 2.3 listens on every interface (its proxy port, eight
component ports, the HTTP port 9091) and its embedded etcd on the fixed ports 2379-2380, so run these benchmarks
alone, on a machine of their own (as each of them says). Milvus 2.3.5 sometimes panics at start-up on a loaded
machine (``GetEmbedEtcdClient``); a start that panics or does not answer is tried again.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.lib.server import free_port
from service.collections.milvus.client import reachable

DEFAULT_TOKEN = "root:Milvus"  # Milvus's documented default password, replaced at the first start


def milvus_client(uri: str, token: str | None = None, **kw):
    """A pymilvus ``MilvusClient`` on ``uri`` with ``token`` (default: ``$EMBED_COLLECTIONS_MILVUS_TOKEN``)."""
    from pymilvus import MilvusClient

    return MilvusClient(
        uri=uri, token=os.environ.get("EMBED_COLLECTIONS_MILVUS_TOKEN", "") if token is None else token, **kw
    )


def answers(uri: str, token: str) -> bool:
    """Whether a fresh connection to ``uri`` answers within 3 s."""
    return reachable(uri, token, 3.0)


class MilvusServer:
    """One ``milvus-server`` on ``127.0.0.1:port`` with its data under ``data_dir`` (kept across :meth:`kill` and
    :meth:`start`). ``ping(uri, token)``: how :meth:`start` sees that it answers (:func:`answers` by default)."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        tick_ms: int = 20,
        extra_config: tuple[str, ...] = (),
        ping: Callable[[str, str], bool] = answers,
    ) -> None:
        self.data_dir, self.port, self.ping = data_dir, port, ping
        settings = (
            f"proxy.timeTickInterval={tick_ms}",
            "common.session.ttl=10",
            "proxy.http.enabled=false",
            *extra_config,
        )
        self.cmd = [
            str(Path(sys.executable).with_name("milvus-server")),
            "--data",
            str(data_dir),
            "--proxy-port",
            str(port),
            "--authorization-enabled",
            "true",
            *(x for kv in settings for x in ("--extra-config", kv)),
        ]
        self.token = DEFAULT_TOKEN
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0, tries: int = 4) -> None:
        """Start it on its data directory (a restart keeps every collection and the password).

        Raises:
            RuntimeError: no start answered within ``timeout`` in ``tries`` tries (the log's tail in the message).
        """
        stderr = self.data_dir / "logs" / "milvus-stderr.log"
        for _ in range(tries):
            stderr.unlink(missing_ok=True)
            with open(self.data_dir / "milvus-server.log", "ab") as log:
                self.proc = subprocess.Popen(
                    self.cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "PROXY_HTTP_ENABLEPPROF": "false"},
                )
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                if stderr.exists() and "panic:" in stderr.read_text(errors="replace"):
                    break
                if self.ping(self.uri, self.token):
                    return
                time.sleep(1.0)
            self.kill()
            print(
                f"milvus-server on {self.data_dir} did not answer within {timeout:.0f} s; trying again", file=sys.stderr
            )
        log = stderr if stderr.exists() else self.data_dir / "milvus-server.log"
        raise RuntimeError(f"milvus-server did not start:\n{log.read_text(errors='replace')[-2000:]}")

    def _signal(self, sig: int) -> None:
        """Send ``sig`` to the server's process group and wait up to 20 s for the wrapper to end."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)

    def kill(self) -> None:
        """SIGKILL the server and everything it started (a crash)."""
        if self.proc is not None:
            self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGINT (the wrapper stops its server child), then SIGKILL whatever is left."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGINT)
        self.kill()


@contextmanager
def milvus_server(
    data_dir: Path,
    tick_ms: int = 20,
    extra_config: tuple[str, ...] = (),
    ping: Callable[[str, str], bool] = answers,
    tries: int = 6,
) -> Iterator[MilvusServer]:
    """A running, password-protected :class:`MilvusServer` with its data under ``data_dir``, stopped afterwards
    (``extra_config``: more ``key=value`` settings, as ``milvus-server --extra-config`` takes them). A first start
    that fails is tried again on a fresh port and a fresh data directory (``data_dir/try<n>``), ``tries`` times.

    Raises:
        RuntimeError: port 2379 or 2380 is taken, or no start answered.
    """
    for port in (2379, 2380):  # its embedded etcd's, fixed
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError(f"port {port} is taken (another Milvus or etcd on this host?): Milvus needs it")
    for n in range(tries):
        server = MilvusServer(data_dir / f"try{n}", free_port(), tick_ms, extra_config, ping)
        server.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            server.start(tries=1)
            break
        except RuntimeError:
            if n == tries - 1:
                raise
    try:
        password = secrets.token_urlsafe(16)
        c = milvus_client(server.uri, server.token)
        c.update_password("root", "Milvus", password)
        c.close()
        server.token = f"root:{password}"
        yield server
    finally:
        server.stop()
