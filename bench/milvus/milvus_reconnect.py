"""How long a *fresh* pymilvus connection takes to reach a restarted Milvus, with the process's old connection held
open across the outage or closed at its start (the reason the milvus backend releases its connection while Milvus is
down: service/collections/milvus/client.py).

One real Milvus server (:mod:`harness.milvus`), two outages of ``--outage-s`` each, one per mode. During an outage
this process calls on the old connection (``held`` only) and tries a fresh connection every 2 s, as the service's
requests and probes do. The restart is detected from a *separate* process (no gRPC state shared); then this process
tries fresh connections every 0.5 s. Reported: the seconds from the other process's answer to this one's.

Usage (alone on the machine; ~2 x (outage + 20) s)::

    python -m bench.milvus.milvus_reconnect --outage-s 150
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib import REPO
from bench.lib.machine import cpu_model
from harness.milvus import MilvusServer, milvus_client, milvus_server
from service.collections.milvus.client import reachable

_CHILD_PING = (
    "import logging, sys; logging.disable(logging.CRITICAL); "
    "from harness.milvus import ping; sys.exit(0 if ping(sys.argv[1], sys.argv[2]) else 1)"
)


def _ping_elsewhere(uri: str, token: str) -> bool:
    """``harness.milvus.ping`` in a child process run from the repository root (fresh gRPC state)."""
    cmd = [sys.executable, "-c", _CHILD_PING, uri, token]
    return subprocess.run(cmd, cwd=REPO, capture_output=True).returncode == 0


def outage(server: MilvusServer, outage_s: float, held: bool) -> float:
    """Kill, wait ``outage_s``, restart; seconds from the restarted server answering elsewhere to answering here."""
    old = milvus_client(server.uri, server.token)
    old.list_collections()
    if not held:
        old.close()
    server.kill()
    t0 = time.monotonic()
    while time.monotonic() - t0 < outage_s:
        if held:
            try:
                old.list_collections(timeout=1)
            except Exception:
                pass
        reachable(server.uri, server.token, 3.0)
        time.sleep(2)
    server.start()  # its readiness ping runs in a child process (below)
    up = time.monotonic()
    while not reachable(server.uri, server.token, 3.0):
        time.sleep(0.5)
    took = time.monotonic() - up
    if held:
        old.close()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outage-s", type=float, default=150)
    a = ap.parse_args()
    logging.disable(logging.CRITICAL)  # pymilvus logs every failed connection
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as d, milvus_server(Path(d), ping=_ping_elsewhere) as server:
        for held in (True, False):
            rows.append((held, outage(server, a.outage_s, held)))
    print(f"CPU: {cpu_model()}; outage {a.outage_s:.0f} s each")
    print("| old connection during the outage | fresh connection here, after another process's |")
    print("|---|---|")
    for held, took in rows:
        print(f"| {'held open (called every 2 s)' if held else 'closed at the kill'} | {took:.1f} s |")
    print(f"load average before {load0:.2f}, after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
