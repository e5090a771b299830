"""Bring a model directory back from a lent GPU machine, whose calls return at most 16 MiB a file and 64 MiB a call.

On the device: ``python bench/device/halve.py pack DIR OUT/NAME`` writes ``DIR`` as a tar whose ``*.safetensors``
weights are cast to float16 (a 22.7 M-parameter MiniLM: 91 MB -> 45 MB), cut into parts of at most ``--part-mib``
MiB (``OUT/NAME.tar.part00`` ...). Here: ``python bench/device/halve.py unpack FILES_AT/NAME DEST`` joins the parts,
extracts into ``DEST`` and casts the weights back to float32 (the fp16 rounding stays: relative error <= 2^-11 per
weight; the numbers measured on the device are of the unrounded model).
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from pathlib import Path


def _cast(path: Path, dtype) -> None:
    from safetensors.torch import load_file, save_file

    tensors = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def pack(src: Path, prefix: Path, part_mib: int) -> list[Path]:
    """``src`` as fp16-weight tar parts ``<prefix>.tar.partNN``; returns them."""
    import shutil
    import tempfile

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / src.name
        shutil.copytree(src, copy, ignore=shutil.ignore_patterns("checkpoint*", "optimizer*"))
        for f in copy.rglob("*.safetensors"):
            _cast(f, torch.float16)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add(copy, arcname=src.name)
    data, cap, parts = buf.getvalue(), part_mib << 20, []
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(data), cap):
        parts.append(prefix.parent / f"{prefix.name}.tar.part{i // cap:02d}")
        parts[-1].write_bytes(data[i : i + cap])
    return parts


def unpack(prefix: Path, dest: Path) -> Path:
    """Join ``<prefix>.tar.partNN``, extract under ``dest``, weights back to fp32; returns the model directory."""
    import torch

    parts = sorted(prefix.parent.glob(f"{prefix.name}.tar.part*"))
    if not parts:
        raise FileNotFoundError(f"no {prefix}.tar.part*")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as t:
        names = t.getnames()
        t.extractall(dest, filter="data")
    top = dest / names[0].split("/")[0]
    for f in top.rglob("*.safetensors"):
        _cast(f, torch.float32)
    return top


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("verb", choices=["pack", "unpack"])
    ap.add_argument("src")
    ap.add_argument("dest")
    ap.add_argument("--part-mib", type=int, default=15)
    a = ap.parse_args(argv)
    if a.verb == "pack":
        for p in pack(Path(a.src), Path(a.dest), a.part_mib):
            print(p, p.stat().st_size)
    else:
        print(unpack(Path(a.src), Path(a.dest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
