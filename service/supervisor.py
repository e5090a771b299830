"""Several serving processes behind one port (``api_workers`` > 1): a supervisor, one core, N fronts.

``python -m service --api-workers N`` runs :func:`supervise`, which

1. makes a private runtime directory (``tempfile.mkdtemp``: mode 0700) holding the settings the children read
   (mode 0600: API keys included), the core's Unix socket ``core.sock`` (chmod 0600 once bound) and the fronts'
   metric files;
2. starts the **core** (``python -m service.supervisor core DIR``): today's app (``service.app.create_app``: the
   models, their batchers, the collections, hot swaps, ``/metrics``), listening on ``core.sock`` only, plus the
   fronts' internal call ``POST /internal/embed`` (``service.http.inference.internal.InternalFirst``) and their
   metrics (``service.front.metrics.FrontsCollector``);
3. binds the public ``host:port`` once and starts N **fronts** (``python -m service.supervisor front DIR I FD``)
   that inherit that listening socket and accept on it (the kernel hands each new connection to one of them):
   each answers the embedding routes itself and passes every other request to the core (``service.front``).

Only the core opens models and the data directory, so collections keep one owner and a model activation is
one event every front sees at once. Clients' API keys are checked by the front on the embedding routes and by the
core on everything passed to it; the core's socket itself is reached only by this user's processes (its mode and
its directory's), which is what admits the fronts' internal calls. The gRPC port (``qdrant_grpc_port``) is the
core's.

Signals: the first SIGTERM (or SIGINT) goes to the fronts, which drain (``drain_s``: ``/ready`` 503 ``draining``,
requests still served; then uvicorn's graceful shutdown, in-flight requests finish within
``graceful_timeout_s``); once they have exited the core gets SIGTERM and shuts down as one process does (closes
collections, drains batchers). The exit status is 0 when every child stopped cleanly. A second signal stops every
child at once. A front that exits while the service runs is restarted (logged, at most once a second); a core that
exits ends the service (its status; an orchestrator restarts the whole). Children run in their own session, so a
terminal's Ctrl-C reaches the supervisor only, and they get SIGTERM if the supervisor dies (Linux
``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from service.settings import Settings

log = logging.getLogger("service.supervisor")

CORE_SOCKET = "core.sock"
METRICS_DIR = "front-metrics"
SETTINGS_FILE = "settings.json"


def draining_server(config: Any, app: Any, drain_s: float) -> Any:
    """A ``uvicorn.Server`` with a drain window: on the first SIGTERM, ``/ready`` answers 503 ``draining`` for
    ``drain_s`` seconds while every request is still served (a load balancer stops routing here), then uvicorn's
    graceful shutdown starts (no new connections; in-flight requests finish within ``graceful_timeout_s``).
    SIGINT, or a second SIGTERM, shuts down at once. ``config``: a ``uvicorn.Config``; ``app``: an ASGI app with a
    ``state`` (``draining`` is set there)."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if sig == signal.SIGTERM and drain_s > 0 and not app.state.draining and not self.should_exit:
                app.state.draining = True
                logging.getLogger("service").info("SIGTERM: draining for %.1f s, then shutting down", drain_s)
                asyncio.get_running_loop().call_later(drain_s, super().handle_exit, sig, frame)
                return
            super().handle_exit(sig, frame)

    return _Server(config)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _read_runtime(runtime: Path) -> Settings:
    """The settings the supervisor wrote to ``runtime``."""
    return Settings(**json.loads((runtime / SETTINGS_FILE).read_text(encoding="utf-8")))


def _listen(host: str, port: int) -> socket.socket:
    """The public listening socket (as uvicorn binds one: SO_REUSEADDR, backlog 2048), inheritable.

    Raises:
        OSError: the address cannot be bound (in use, no such interface).
    """
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _die_with_parent() -> None:
    """In a child, before exec: SIGTERM when the supervisor dies (Linux prctl PR_SET_PDEATHSIG; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except Exception:
        pass


def _spawn(args: list[str], env: dict[str, str] | None = None, fds: tuple[int, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "service.supervisor", *args],
        env={**os.environ, **(env or {})},
        pass_fds=fds,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )


def supervise(settings: Settings) -> int:
    """Run the core and ``settings.api_workers`` fronts until a signal (module docstring); the exit status.

    Raises:
        OSError: the public address cannot be bound.
    """
    runtime = Path(tempfile.mkdtemp(prefix="embed-service-"))
    try:
        return _supervise(settings, runtime)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def _supervise(settings: Settings, runtime: Path) -> int:
    _write_private(runtime / SETTINGS_FILE, json.dumps(settings.model_dump(mode="json")))
    (runtime / METRICS_DIR).mkdir(mode=0o700)
    listener = _listen(settings.host, settings.port)
    fd = listener.fileno()
    front_env = {"PROMETHEUS_MULTIPROC_DIR": str(runtime / METRICS_DIR)}
    stopping: list[int] = []

    def on_signal(sig: int, _frame: Any) -> None:
        stopping.append(sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    core = _spawn(["core", str(runtime)])
    fronts = {
        i: _spawn(["front", str(runtime), str(i), str(fd)], front_env, (fd,)) for i in range(settings.api_workers)
    }
    started = dict.fromkeys(fronts, time.monotonic())
    pids = [p.pid for p in fronts.values()]
    host, port = listener.getsockname()[:2]
    log.info("serving on %s:%d: core pid %d, fronts %s", host, port, core.pid, pids)
    status = 0
    while not stopping:
        if core.poll() is not None:
            log.error("the core process exited with %s; stopping the service", core.returncode)
            status = core.returncode if core.returncode > 0 else 1  # killed by a signal: 1
            break
        for i, p in fronts.items():
            if p.poll() is not None and time.monotonic() - started[i] >= 1.0:
                log.warning("front %d (pid %d) exited with %s; restarting it", i, p.pid, p.returncode)
                fronts[i] = _spawn(["front", str(runtime), str(i), str(fd)], front_env, (fd,))
                started[i] = time.monotonic()
        time.sleep(0.1)
    listener.close()  # the fronts hold their own copies until they stop accepting
    first = signal.SIGTERM if not stopping or stopping[0] == signal.SIGTERM else signal.SIGINT
    log.info("stopping: fronts first (%s), then the core", signal.Signals(first).name)
    _stop([*fronts.values()], first, settings.drain_s + settings.graceful_timeout_s + 10, stopping)
    _stop([core], signal.SIGTERM, settings.graceful_timeout_s + 30, stopping)
    codes = [p.returncode for p in (*fronts.values(), core)]
    # uvicorn ends by raising again the signal it handled: death by the signal sent is a clean stop
    if status == 0 and any(c not in (0, -signal.SIGTERM, -signal.SIGINT) for c in codes):
        log.warning("exit statuses of the children: %s", codes)
        status = 1
    return status


def _stop(procs: list[subprocess.Popen], sig: int, timeout: float, stopping: list[int]) -> None:
    """Signal ``procs`` and wait for them; a further signal to the supervisor (``stopping`` grows) or the timeout
    sends SIGINT, then SIGKILL 10 s later."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    seen, deadline, forced = len(stopping), time.monotonic() + timeout, None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if forced is None and (len(stopping) > seen or now > deadline):
            log.warning("stopping at once")
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)
            forced = now
        elif forced is not None and now - forced > 10:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)


def run_core(runtime: Path) -> None:
    """The core process: the service app on the Unix socket ``runtime/core.sock`` (module docstring)."""
    import uvicorn

    from service.app import create_app
    from service.front.metrics import FrontsCollector
    from service.http.inference.internal import InternalFirst
    from service.http.protocol import protocol_class

    settings = _read_runtime(runtime)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    app.state.metrics.registry.register(FrontsCollector(runtime / METRICS_DIR))
    if settings.front_inference:  # the fronts run the core's models: they read its registry (service.front.published)
        from service.front.published import MODELS_FILE, publish

        app.state.registry.listeners.append(lambda registry: publish(runtime / MODELS_FILE, registry))
    path = str(runtime / CORE_SOCKET)

    class _CoreServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            os.chmod(path, 0o600)  # uvicorn makes a new socket 0666 (the runtime directory is 0700 meanwhile)

    config = uvicorn.Config(
        InternalFirst(app, app.state.metrics),
        uds=path,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=settings.graceful_timeout_s,
        http=protocol_class(),
    )
    _CoreServer(config).run()


def run_front(runtime: Path, index: int, fd: int) -> None:
    """Front ``index``: the front app (``service.front.app``) accepting on the inherited listening socket ``fd``."""
    from service.front.metrics import use_front_files

    use_front_files(index)  # before any metric is built
    import uvicorn

    from service.front.app import create_front_app
    from service.http.protocol import protocol_class

    settings = _read_runtime(runtime)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per call to the core
    sock = socket.socket(fileno=fd)
    app = create_front_app(settings, str(runtime / CORE_SOCKET))
    config = uvicorn.Config(
        app,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=settings.graceful_timeout_s,
        http=protocol_class(),
        lifespan="on",
    )
    log.info("front %d (pid %d) accepting", index, os.getpid())
    draining_server(config, app, settings.drain_s).run(sockets=[sock])


if __name__ == "__main__":
    role, where = sys.argv[1], Path(sys.argv[2])
    if role == "core":
        run_core(where)
    elif role == "front":
        run_front(where, int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"python -m service.supervisor: unknown role {role!r}")
