"""What reading and writing a collection's FAISS snapshot file costs in time and peak memory: streamed through
FAISS's callback reader/writer (``service.collections.index.snapshot_file``, the service's way) against the whole
serialisation held in memory (``faiss.serialize_index`` / ``deserialize_index`` of one buffer, the earlier way).

Each step runs in its own process (its peak RSS, ``ru_maxrss``, is its own): ``read`` loads ``--snapshot``;
``write`` loads it (streamed, whichever way is then measured) and writes it to a temporary file under ``--scratch``,
reporting the write's seconds and the process's peak after it (above the load's peak: what the write added). Not in
CI; run alone; needs the index's size free on disk under ``--scratch``.

    python -m bench.micro.snapshot_file_bench --snapshot ~/.cache/redundancy-embed/scale_bench/10m-ivf_sq/data/collections/scale/index-00000000000000009767.snap
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import faiss
import numpy as np

from bench.lib.machine import cpu_model
from service.collections.index import IndexSpec, VectorIndex, normalize_params, read_snapshot, write_snapshot
from service.collections.index.snapshot_file import SNAP_MAGIC


def _peak_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _spec(path: Path) -> IndexSpec:
    with open(path, "rb") as f:
        f.read(8)
        (hlen,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(hlen))
    return IndexSpec(h["kind"], h["metric"], normalize_params(h["kind"], {}, h["dimension"]), h["dimension"])


def read_whole(path: Path, spec: IndexSpec) -> VectorIndex:
    """The earlier reader: the file read into one buffer, checked, then ``faiss.deserialize_index``."""
    with open(path, "rb") as f:
        f.read(8)
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        tomb = np.frombuffer(f.read(8 * header["n_tombstones"]), dtype=np.int64)
        body = np.frombuffer(f.read(), dtype=np.uint8)
    assert zlib.crc32(memoryview(body), zlib.crc32(tomb.tobytes())) == header["crc32"]
    return VectorIndex(spec, faiss.deserialize_index(body), tomb)


def write_whole(index: VectorIndex, path: Path) -> None:
    """The earlier writer: ``faiss.serialize_index`` into one buffer, then written and fsynced."""
    body, tomb = faiss.serialize_index(index.index), index.tombstones()
    header = json.dumps({"n_tombstones": len(tomb), "index_bytes": len(body)}).encode()
    with open(path, "wb") as f:
        f.write(SNAP_MAGIC + struct.pack("<Q", len(header)) + header + tomb.tobytes())
        f.write(memoryview(body))
        f.flush()
        os.fsync(f.fileno())


def step(how: str, what: str, snapshot: Path, scratch: Path) -> dict:
    """One measurement, in this process."""
    spec = _spec(snapshot)
    t0 = time.perf_counter()
    streamed = how == "streamed" or what == "write"  # a write's peak is measured above the index alone
    index = read_snapshot(snapshot, spec)[0] if streamed else read_whole(snapshot, spec)
    out = {"how": how, "step": what, "read_s": round(time.perf_counter() - t0, 1), "read_peak_mb": _peak_mb()}
    if what == "write":
        with tempfile.TemporaryDirectory(dir=scratch) as d:
            t0 = time.perf_counter()
            if how == "streamed":
                write_snapshot(index, Path(d) / "snap", seq=1)
            else:
                write_whole(index, Path(d) / "snap")
            out |= {"write_s": round(time.perf_counter() - t0, 1), "peak_mb": _peak_mb()}
    out["vectors"] = index.ntotal
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--snapshot", type=Path, required=True, help="a FAISS snapshot file of a collection")
    ap.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--step", nargs=2, metavar=("HOW", "WHAT"), help=argparse.SUPPRESS)  # one child
    a = ap.parse_args()
    if a.step:
        print(json.dumps(step(a.step[0], a.step[1], a.snapshot, a.scratch)))
        return
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} load average before: {os.getloadavg()}  cpu: {cpu_model()}")
    size = a.snapshot.stat().st_size / 2**20
    print(f"\n{a.snapshot.name}: {size:,.0f} MiB\n")
    print(
        "| how | step | read s | peak RSS after read MiB | write s | peak RSS after write MiB |\n|---|---|---:|---:|---:|---:|"
    )
    for how in ("streamed", "whole"):
        for what in ("read", "write"):
            cmd = [sys.executable, "-m", "bench.micro.snapshot_file_bench", "--snapshot", str(a.snapshot)]
            cmd += ["--scratch", str(a.scratch), "--step", how, what]
            r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            print(
                f"| {how} | {what} | {r['read_s']} | {r['read_peak_mb']:,} | {r.get('write_s', '—')} "
                f"| {r.get('peak_mb', '—') if what == 'write' else '—'} |",
                flush=True,
            )
    print(f"\n{time.strftime('%Y-%m-%d %H:%M:%S')} load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
