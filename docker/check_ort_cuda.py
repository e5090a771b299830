"""Print the CUDA/cuDNN libraries the pinned onnxruntime-gpu build links, beside the GPU image's base.

    python docker/check_ort_cuda.py        # downloads the pinned wheel (~250 MB) from the package index

Reads ``ARG ORT_GPU_VERSION`` and the ``FROM nvidia/cuda:<X.Y.Z>-cudnn...`` tag of ``docker/Dockerfile.gpu``, downloads
that onnxruntime-gpu wheel, lists the ``NEEDED`` entries of ``libonnxruntime_providers_cuda.so`` (``readelf -d``) and
exits 1 when its ``libcudart.so.<major>`` differs from the base image's CUDA major or it links a cuDNN other than
``libcudnn.so.9``. Builds up to 1.24 link ``libcudnn.so.9``; 1.31 links no cuDNN (``nm -D``: no cuDNN symbol
imported) and loads it at run time, so the base image still carries cuDNN 9 (``-cudnn-runtime``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DOCKERFILE = Path(__file__).with_name("Dockerfile.gpu")


def pins(text: str) -> tuple[str, str]:
    """``(onnxruntime-gpu version, CUDA major of the base image)`` from a Dockerfile's text."""
    ort = re.search(r"^ARG ORT_GPU_VERSION=(\S+)", text, re.M).group(1)
    cuda = re.search(r"^FROM nvidia/cuda:(\d+)\.\d+\.\d+-cudnn", text, re.M).group(1)
    return ort, cuda


def main() -> int:
    ort, cuda = pins(DOCKERFILE.read_text())
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"onnxruntime-gpu=={ort}",
             "--python-version", "3.12", "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "-d", d],
            check=True,
        )  # fmt: skip
        whl = next(Path(d).glob("*.whl"))
        with zipfile.ZipFile(whl) as z:
            so = next(n for n in z.namelist() if n.endswith("libonnxruntime_providers_cuda.so"))
            path = z.extract(so, d)
        out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", out)
    print(f"onnxruntime-gpu {ort} CUDA provider needs: {' '.join(needed)}")
    print(f"base image CUDA major: {cuda}")
    cudnn = [n for n in needed if n.startswith("libcudnn")]
    ok = f"libcudart.so.{cuda}" in needed and cudnn in ([], ["libcudnn.so.9"])
    print(f"cuDNN: {cudnn[0] if cudnn else 'not linked (loaded at run time; the base carries cuDNN 9)'}")
    print("OK: the provider's CUDA/cuDNN majors match the base image" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
