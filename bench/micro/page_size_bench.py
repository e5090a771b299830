"""SQLite page size against a collection's vector rows: bytes a row and the share of the float32 vector, insert rate,
and 20 random rows read by id, for the points table as the embedded store makes it (its columns and indexes; 384-d
vectors, a ``{"g", "h"}`` payload, empty text), 100,000 rows in 1,000-row transactions (not in CI; run alone; ~1
minute).

    python -m bench.micro.page_size_bench
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib.machine import cpu_model
from service.collections.embedded.store.files import SCHEMA


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--page-size", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    V = rng.standard_normal((a.rows, a.dim)).astype(np.float32)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} load average before: {os.getloadavg()}  cpu: {cpu_model()}\n")
    print("| page size | bytes a row | x the floats | insert rows/s | 20 random rows by id (ms) |")
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for ps in a.page_size:
            path = Path(tmp) / f"p{ps}.sqlite3"
            c = sqlite3.connect(path, isolation_level=None)
            c.execute(f"PRAGMA page_size={ps}")
            c.execute("PRAGMA journal_mode=WAL")
            c.executescript(SCHEMA)

            def row(i: int, seq: int) -> tuple:
                return i + 1, f"k{i}", "", f'{{"g": {i % 100}, "h": {i % 1000}}}', V[i].tobytes(), seq

            t = time.perf_counter()
            for s in range(0, a.rows, 1000):
                rows = [row(i, s) for i in range(s, min(s + 1000, a.rows))]
                c.execute("BEGIN")
                c.executemany("INSERT INTO points(iid, key, text, payload, vector, seq) VALUES (?,?,?,?,?,?)", rows)
                c.execute("COMMIT")
            rate = a.rows / (time.perf_counter() - t)
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            per_row = path.stat().st_size / a.rows
            ids = rng.integers(1, a.rows + 1, 2000).tolist()
            t = time.perf_counter()
            for i in range(0, 2000, 20):
                c.execute(
                    f"SELECT iid, vector FROM points WHERE iid IN ({','.join('?' * 20)})", ids[i : i + 20]
                ).fetchall()
            read = (time.perf_counter() - t) / 100 * 1000
            c.close()
            print(f"| {ps:,} | {per_row:,.0f} | {per_row / (4 * a.dim):.3f} | {rate:,.0f} | {read:.2f} |", flush=True)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
