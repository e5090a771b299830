"""Run the Milvus standalone server of the ``milvus`` PyPI wheel as a container's main process.

The wheel (``milvus==2.3.5``) carries the real Milvus 2.3.5 server binary and its libraries, LZMA-compressed, and
a config template. Its ``milvus-server`` wrapper unpacks them into the data directory at every start, then waits on
a flag that never notices the server exiting: a crashed server would leave a running, unhealthy container. Here the
server is the container's main process instead (it gets the stop signal; when it exits, the container exits and
the restart policy applies):

* ``unpack`` (at build time): decompress the binary and libraries into ``--bin-dir`` once, in the image, and drop
  the compressed copies;
* ``run`` (the entrypoint): write ``<data>/configs/milvus.yaml`` from the wheel's template for this data directory
  and these ports (the wheel's ``MilvusServerConfig``: embedded etcd on 2379/2380, local storage, RocksMQ under
  ``<data>/data``), logs to stdout/stderr, then exec ``milvus run standalone`` in place of this process;
* ``check`` (the health check): exit 0 when ``GET /healthz`` on the metrics port answers ``OK``.

Usage: ``python standalone.py {unpack,run,check} [--data DIR] [--bin-dir DIR] [--proxy-port N] [--metrics-port N]
[--extra-config key=value ...]``; each option also reads ``MILVUS_<OPTION>`` from the environment.
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import sys
import urllib.request
from pathlib import Path

#: milvus.yaml values changed for a container (``--extra-config`` overrides them):
#:
#: * a stop that ends within the container's grace period. The default (1800 s) let a stopped container outlive a
#:   30 s grace period, and be killed; with 5 s it exits ~5 s after SIGTERM. Acknowledged writes are already in the
#:   server's write-ahead log;
#: * no REST API: with ``proxy.http.enabled`` on (Milvus's default), the metrics port (9091) serves Milvus's
#:   ``/api/v1`` without authentication, whatever ``common.security.authorizationEnabled`` says (it lists
#:   collections and users, returns texts and payloads, deletes), to anything on the container's network; the
#:   replicas speak gRPC. ``/healthz`` (the health check) and ``/metrics`` stay.
DEFAULTS: dict[str, object] = {"common.gracefulStopTimeout": 5, "proxy.http.enabled": False}

#: settings by environment (Milvus reads ``SECTION_KEY`` variables; the wheel's template has no such key to set):
#: no ``/debug/pprof`` on the metrics port
ENV_DEFAULTS: dict[str, str] = {"PROXY_HTTP_ENABLEPPROF": "false"}


def unpack(bin_dir: Path) -> None:
    """Decompress the wheel's ``data/bin/*.lzma`` (server binary + shared libraries) into ``bin_dir``."""
    import milvus

    src = Path(milvus.__file__).resolve().parent / "data" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    files = sorted(src.glob("*.lzma"))
    if not files:
        raise SystemExit(f"no *.lzma files in {src}: not the milvus server wheel?")
    for f in files:
        out = bin_dir / f.name[: -len(".lzma")]
        with lzma.open(f) as r, open(out, "wb") as w:
            shutil.copyfileobj(r, w, 1 << 20)
        out.chmod(0o755)
        f.unlink()  # only the wheel's own `milvus-server` wrapper reads them; this image does not use it
    print(f"unpacked {len(files)} files into {bin_dir}")


def write_config(data: Path, proxy_port: int, extra: dict[str, object]) -> None:
    """``data/configs/milvus.yaml`` (+ ``glog.conf``) for a standalone server on ``proxy_port``.

    Raises:
        RuntimeError: a port the server needs is taken (the wheel's config checks each by binding it).
    """
    from milvus import MilvusServerConfig

    cfg = MilvusServerConfig(data_dir=str(data), proxy_port=proxy_port)
    cfg.resolve_all_listen_ports()  # the fixed proxy port, the others from their defaults (free in a container)
    cfg.resolve_storage()  # <data>/data: etcd, local object storage, RocksMQ; <data>/logs
    cfg.set("system_log_path", "")  # no log files: the server logs to stdout (the container's log)
    cfg.set("etcd_log_path", "stdout")
    cfg.set("etcd_log_level", "warn")
    for key, value in {**DEFAULTS, **extra}.items():
        cfg.set(key, value)
    cfg.cleanup_listen_ports()
    cfg.write_config()
    glog = data / "configs" / "glog.conf"  # the C++ core's log: to stderr, warnings and up
    text = (
        glog.read_text()
        .replace("--logtostderr=false", "--logtostderr=true")
        .replace("--minloglevel=0", "--minloglevel=1")
    )
    glog.write_text(text)


def run(data: Path, bin_dir: Path, proxy_port: int, metrics_port: int, extra: dict[str, object]) -> None:
    """Write the config and replace this process with ``milvus run standalone`` (never returns)."""
    write_config(data, proxy_port, extra)
    (data / "run").mkdir(parents=True, exist_ok=True)
    env = {
        **ENV_DEFAULTS,
        **os.environ,
        "DEPLOY_MODE": "STANDALONE",
        "METRICS_PORT": str(metrics_port),  # also serves /healthz
        "MILVUS_RUN_DIR": str(data / "run"),
        "LD_LIBRARY_PATH": ":".join(p for p in (str(bin_dir), os.environ.get("LD_LIBRARY_PATH", "")) if p),
    }
    os.chdir(data)  # the server reads ./configs/milvus.yaml
    exe = bin_dir / "milvus"
    print(f"exec {exe} run standalone (data {data}, proxy port {proxy_port}, metrics port {metrics_port})", flush=True)
    os.execve(exe, [str(exe), "run", "standalone"], env)


def check(metrics_port: int) -> int:
    """0 when the server's ``/healthz`` answers ``OK``, else 1."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/healthz", timeout=3) as r:
            return 0 if b"OK" in r.read() else 1
    except OSError:
        return 1


def _extra(value: str) -> tuple[str, object]:
    key, sep, raw = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--extra-config wants key=value, got {value!r}")
    parsed: object = int(raw) if raw.isdigit() else {"true": True, "false": False}.get(raw.lower(), raw)
    return key, parsed


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring); returns the exit status."""
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("command", choices=["unpack", "run", "check"])
    p.add_argument("--data", type=Path, default=Path(env("MILVUS_DATA", "/var/lib/milvus")))
    p.add_argument("--bin-dir", type=Path, default=Path(env("MILVUS_BIN_DIR", "/opt/milvus/bin")))
    p.add_argument("--proxy-port", type=int, default=int(env("MILVUS_PROXY_PORT", "19530")))
    p.add_argument("--metrics-port", type=int, default=int(env("MILVUS_METRICS_PORT", "9091")))
    p.add_argument("--extra-config", type=_extra, action="append", default=[], help="milvus.yaml key=value")
    a = p.parse_args(argv)
    if a.command == "unpack":
        unpack(a.bin_dir)
        return 0
    if a.command == "check":
        return check(a.metrics_port)
    run(a.data, a.bin_dir, a.proxy_port, a.metrics_port, dict(a.extra_config))
    return 1  # not reached: run() execs the server


if __name__ == "__main__":
    sys.exit(main())
