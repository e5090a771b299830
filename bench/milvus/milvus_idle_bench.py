"""Idle CPU of a Milvus standalone server (the ``milvus`` 2.3.5 wheel's ``milvus-server``) against the number of
loaded collections it holds, at two ``proxy.timeTickInterval`` settings: Milvus's default (200 ms) and the tests'
(20 ms, for ~30 ms strongly consistent reads; :mod:`harness.milvus`).

Per setting, one fresh server; for each count, empty collections of the backend's physical schema
(:func:`service.collections.milvus.schema.physical_schema`, 384 dims, a flat cosine index) are created and loaded
up to that count, then, after a settling pause, the CPU seconds of the ``milvus run standalone`` process
(``/proc/<pid>/stat`` utime + stime) over a window with no client calls: the cost of a loaded collection to a
machine that hosts Milvus, and why the test suite drops its collections after each module (``tests/conftest.py``).

Usage (alone on the machine; ~4 min with the defaults)::

    python -m bench.milvus.milvus_idle_bench [--counts 0,10,30] [--ticks 200,20] [--window 20]

Not a test: it asserts nothing, it prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.machine import cpu_model
from harness.milvus import milvus_client, milvus_server


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _standalone_pid(data_dir: Path) -> int:
    """The pid of the ``milvus run standalone`` process the server under ``data_dir`` runs."""
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if p.name.isdigit() and str(data_dir) in cmd and "run standalone" in cmd:
            return int(p.name)
    raise RuntimeError(f"no 'milvus run standalone' process under {data_dir}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="0,10,30", help="loaded collections to measure at (increasing)")
    ap.add_argument("--ticks", default="200,20", help="proxy.timeTickInterval values in ms, one server each")
    ap.add_argument("--window", type=float, default=20.0, help="seconds of idle CPU measured per count")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds waited after the last load")
    a = ap.parse_args()
    from service.collections.index import IndexSpec
    from service.collections.milvus.schema import index_params, physical_schema

    counts = [int(x) for x in a.counts.split(",")]
    load0 = os.getloadavg()[0]
    rows = []
    for tick in (int(x) for x in a.ticks.split(",")):
        with tempfile.TemporaryDirectory() as d, milvus_server(Path(d), tick_ms=tick) as server:
            pid = _standalone_pid(server.data_dir)
            c = milvus_client(server.uri, server.token)
            made = 0
            for n in counts:
                while made < n:
                    c.create_collection(f"c{made}", schema=physical_schema(384))
                    c.create_index(f"c{made}", index_params(c, IndexSpec("flat", "cosine", {}, 384)))
                    c.load_collection(f"c{made}")
                    made += 1
                time.sleep(a.settle)
                t0, c0 = time.monotonic(), _cpu_seconds(pid)
                time.sleep(a.window)
                rows.append((tick, n, (_cpu_seconds(pid) - c0) / (time.monotonic() - t0)))
            c.close()
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; window {a.window:.0f} s per row\n")
    print("| timeTickInterval ms | loaded collections | Milvus idle CPU, % of one core |")
    print("|---:|---:|---:|")
    for tick, n, share in rows:
        print(f"| {tick} | {n} | {100 * share:.1f} |")
    print(f"\nload average before {load0:.2f}, after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
