"""Run the real Milvus standalone server (the ``milvus`` 2.3.5 wheel's ``milvus-server``) for the tests and the
benchmarks, with authentication on, and kill or restart it on the same data (the fault tests and benchmarks).

The wheel ships Milvus's own server binary (embedded etcd, local storage). Milvus 2.3 listens on every interface: its
proxy port, eight component ports (gRPC, no authentication between components) and the HTTP port of ``/healthz``
and metrics (9091), where it also serves its ``/api/v1`` REST API without authentication; no setting binds any of
them to an address (Milvus's own code listens on ``":" + port``; only its embedded etcd takes ``127.0.0.1``). So:

* **a network namespace of its own** (:mod:`harness.milvus_netns`, started with ``unshare --net``, or ``unshare
  --map-root-user --net`` when not root): every Milvus port listens on that namespace's loopback only, and the proxy
  port alone is reachable from this host's loopback, ``127.0.0.1:<port>``, through a forwarder; the other ports are
  unreachable from outside the namespace. The embedded etcd's fixed ports 2379-2380 are the namespace's too, so
  they no longer have to be free on the host. Where namespaces are not available (``unshare`` missing or refused,
  or ``EMBED_TEST_MILVUS_NETNS=0``), the server runs in the host's namespace as before, every port on every
  interface, with a warning; ``tests/service/collections/test_milvus_ports.py`` then fails;
* ``proxy.http.enabled=false``: no REST API, neither ``/api/v1`` on the HTTP port nor ``/v1`` on the proxy port
  (the clients here speak gRPC); ``PROXY_HTTP_ENABLEPPROF=false``: no ``/debug/pprof``. The HTTP port still
  answers ``/healthz``, ``/metrics``, ``/log/level`` (which a PUT changes) and ``/expr`` (evaluates an expression
  in the server, its key the etcd root path, ``by-dev`` by default), without authentication: inside the namespace
  only;
* authentication on (``common.security.authorizationEnabled``) and root's default password ``Milvus`` replaced by a
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

import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.ports import free_port

DEFAULT_ROOT_PASSWORD = "Milvus"  # Milvus's documented default; changed at once by milvus_server
NETNS_SCRIPT = Path(__file__).with_name("milvus_netns.py")
#: settings every test server gets: no REST API (``/api/v1`` on the HTTP port answered without authentication)
BASE_CONFIG = ("proxy.http.enabled=false",)
#: and by environment (Milvus reads ``SECTION_KEY`` variables; the wrapper drops ``--extra-config`` keys its template
#: lacks): no ``/debug/pprof`` on the HTTP port
BASE_ENV = {"PROXY_HTTP_ENABLEPPROF": "false"}


@functools.cache
def netns_prefix() -> tuple[tuple[str, ...] | None, str]:
    """The ``unshare`` command line that runs a command in a network namespace of its own, and why not (``None``
    and the reason) where that is unavailable: ``EMBED_TEST_MILVUS_NETNS=0``, no ``unshare``, or it fails here (an
    unprivileged user where user namespaces are restricted). Tried once per process, with the loopback brought up
    and a port bound inside, as :mod:`harness.milvus_netns` does."""
    if os.environ.get("EMBED_TEST_MILVUS_NETNS", "1") == "0":
        return None, "EMBED_TEST_MILVUS_NETNS=0"
    exe = shutil.which("unshare")
    if exe is None:
        return None, "no unshare command (util-linux)"
    prefix = (exe, "--net") if os.geteuid() == 0 else (exe, "--map-root-user", "--net")
    probe = (
        f"import socket, sys; sys.path.insert(0, {str(NETNS_SCRIPT.parent)!r}); "
        "from milvus_netns import loopback_up; loopback_up(); socket.create_server(('127.0.0.1', 0)).close()"
    )
    try:
        r = subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{' '.join(prefix)}: {e}"
    if r.returncode != 0:
        return None, f"{' '.join(prefix)} failed: {(r.stderr or r.stdout).strip()[-300:]}"
    return prefix, ""


def milvus_client(uri: str, token: str | None = None, **kw):
    """A pymilvus ``MilvusClient`` on ``uri`` with ``token`` (default: ``$EMBED_COLLECTIONS_MILVUS_TOKEN``)."""
    from pymilvus import MilvusClient

    return MilvusClient(
        uri=uri, token=token if token is not None else os.environ.get("EMBED_COLLECTIONS_MILVUS_TOKEN", ""), **kw
    )


def ping(uri: str, token: str) -> bool:
    """Whether Milvus on ``uri`` answers ``list_collections`` with ``token`` within 3 s (a fresh client)."""
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
        port: the proxy port (gRPC), on ``127.0.0.1``.
        tick_ms, extra_config: see :func:`milvus_server`.
        ping: how :meth:`start` sees that the server answers (:func:`ping` by default; a benchmark may ping from a
            child process, with no gRPC state shared).

    Attributes:
        isolated: the server runs in a network namespace of its own (see the module docstring); ``proc`` is then
            the namespace's forwarder (:mod:`harness.milvus_netns`), the wrapper and the server its children.
        not_isolated_because: why not, when it is not.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int,
        tick_ms: int = 20,
        extra_config: tuple[str, ...] = (),
        ping: Callable[[str, str], bool] = ping,
    ) -> None:
        self.data_dir, self.port, self.tick_ms, self.extra_config = data_dir, port, tick_ms, extra_config
        self.ping = ping
        self.token = f"root:{DEFAULT_ROOT_PASSWORD}"
        self.proc: subprocess.Popen | None = None
        prefix, self.not_isolated_because = netns_prefix()
        self.netns: tuple[str, ...] | None = prefix
        self.isolated = prefix is not None
        if not self.isolated:
            print(
                f"warning: Milvus runs without a network namespace of its own ({self.not_isolated_because}): "
                "every one of its ports listens on every interface",
                file=sys.stderr,
            )

    @property
    def uri(self) -> str:
        """``http://127.0.0.1:<port>``."""
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
            settings = (f"proxy.timeTickInterval={self.tick_ms}", "common.session.ttl=10", *BASE_CONFIG)
            cmd = [
                str(exe),
                "--data",
                str(self.data_dir),
                "--proxy-port",
                str(self.port),
                "--authorization-enabled",
                "true",
                *(a for kv in (*settings, *self.extra_config) for a in ("--extra-config", kv)),
            ]
            self._spawn(cmd)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.alive() and not _panicked(self.data_dir):
                if self.ping(self.uri, self.token):
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

    def _spawn(self, cmd: list[str]) -> None:
        """Start ``cmd`` (the wrapper), in a network namespace of its own when :attr:`isolated`: the proxy port is
        bound here, on ``127.0.0.1``, and handed to the namespace's forwarder (closed here at once, so that the port
        refuses connections again once the forwarder is gone).

        Raises:
            RuntimeError: the proxy port is taken on this host's loopback.
        """
        env = {**os.environ, **BASE_ENV}
        with open(self.data_dir / "milvus-server.log", "ab") as f:
            if not self.isolated:
                self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
                return
            listener = socket.socket()
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", self.port))
                listener.listen(128)
            except OSError as e:
                listener.close()
                raise RuntimeError(f"the proxy port 127.0.0.1:{self.port} is taken: {e}") from e
            with listener:
                fd = listener.fileno()
                forwarder = [sys.executable, str(NETNS_SCRIPT), "--listen-fd", str(fd), "--port", str(self.port)]
                self.proc = subprocess.Popen(
                    [*self.netns, *forwarder, "--", *cmd],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(fd,),
                    env=env,
                )

    def secure(self) -> None:
        """Replace root's default password by a random one (``token`` follows)."""
        password = secrets.token_urlsafe(16)
        c = milvus_client(self.uri, self.token)
        c.update_password("root", DEFAULT_ROOT_PASSWORD, password)
        c.close()
        self.token = f"root:{password}"

    def alive(self) -> bool:
        """Whether its process (the wrapper, or the namespace's forwarder) still runs."""
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
def milvus_server(
    data_dir: Path,
    timeout: float = 180.0,
    tries: int = 6,
    tick_ms: int = 20,
    extra_config: tuple[str, ...] = (),
    ping: Callable[[str, str], bool] = ping,
) -> Iterator[MilvusServer]:
    """A running, password-protected Milvus server with its data under ``data_dir``, in a network namespace of its
    own where possible (the module docstring) (``tick_ms``: its ``proxy.timeTickInterval``; Milvus's default is 200;
    ``extra_config``: more ``key=value`` settings of its ``milvus.yaml``, as ``milvus-server --extra-config`` takes
    them; ``ping``: see :class:`MilvusServer`).

    Raises:
        RuntimeError: ports 2379-2380 are taken (without a namespace of its own), or the server did not start (its
            log tail is in the message).
    """
    for p in () if netns_prefix()[0] else (2379, 2380):  # its embedded etcd always takes these (fixed)
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", p)) == 0:
                raise RuntimeError(
                    f"port {p} is taken (another Milvus or etcd on this machine?); this Milvus server needs it"
                )
    last: Exception | None = None
    for attempt in range(tries):  # a failed first start: fresh ports and a fresh data directory
        d = data_dir / f"try{attempt}"
        d.mkdir(parents=True, exist_ok=True)
        server = MilvusServer(d, free_port(), tick_ms, extra_config, ping)
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
