"""Check that the pinned onnxruntime-gpu build and the pinned CUDA/cuDNN wheels of the GPU image belong together.

    python docker/check_ort_cuda.py              # here: downloads the pinned wheel (~250 MB) from the package index
    python docker/check_ort_cuda.py --installed  # in the GPU image: the libraries the installed build finds

The pins are ``docker/requirements-gpu.txt``'s: ``onnxruntime-gpu``, and ``nvidia-cuda-runtime`` (its major is the
CUDA major) and ``nvidia-cudnn-cu13`` (its major is cuDNN's). Without a flag: downloads that onnxruntime-gpu wheel
(cp311, the image's Python), lists the ``NEEDED`` entries of ``libonnxruntime_providers_cuda.so`` (``readelf -d``)
and exits 1 when its ``libcudart.so.<major>`` is not the pinned runtime's or it links a cuDNN other than 9. Builds up
to 1.24 link ``libcudnn.so.9``; 1.31 links no cuDNN (``nm -D``: no cuDNN symbol imported) and loads it at run time,
so the image still carries cuDNN 9.

``--installed``: calls ``onnxruntime.preload_dlls()`` as the service does before a CUDA session (ONNX Runtime docs,
"CUDA Execution Provider"), prints where each CUDA/cuDNN library came from (``/proc/self/maps``), resolves the
provider's dependencies with ``ldd`` over the nvidia wheels' folders, and exits 0 when the only library missing is
the driver's ``libcuda.so.1`` (on a GPU host the NVIDIA Container Toolkit mounts it) or nothing is.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("requirements-gpu.txt")
#: what the driver provides (the host's, never the image's)
DRIVER = {"libcuda.so.1"}


def pins(text: str) -> tuple[str, str, str]:
    """``(onnxruntime-gpu version, CUDA major, cuDNN major)`` from ``requirements-gpu.txt``'s text."""
    v = dict(re.findall(r"^([\w.-]+)==(\S+)", text, re.M))
    return v["onnxruntime-gpu"], v["nvidia-cuda-runtime"].split(".")[0], v["nvidia-cudnn-cu13"].split(".")[0]


def wheel_check(ort: str, cuda: str, cudnn: str) -> int:
    """The pinned wheel's provider links the pinned CUDA major and no other cuDNN than ``cudnn`` (0), else 1."""
    with tempfile.TemporaryDirectory() as d:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"onnxruntime-gpu=={ort}"]
        plat = ["--python-version", "3.11", "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "-d", d]
        subprocess.run(pip + plat, check=True)
        whl = next(Path(d).glob("*.whl"))
        with zipfile.ZipFile(whl) as z:
            so = next(n for n in z.namelist() if n.endswith("libonnxruntime_providers_cuda.so"))
            path = z.extract(so, d)
        out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", out)
    print(f"onnxruntime-gpu {ort} CUDA provider needs: {' '.join(needed)}")
    print(f"pinned CUDA major: {cuda}, cuDNN major: {cudnn}")
    linked = [n for n in needed if n.startswith("libcudnn")]
    ok = f"libcudart.so.{cuda}" in needed and linked in ([], [f"libcudnn.so.{cudnn}"])
    print(f"cuDNN: {linked[0] if linked else f'not linked (loaded at run time; the image carries cuDNN {cudnn})'}")
    print("OK: the provider's CUDA/cuDNN majors match the pinned wheels" if ok else "MISMATCH")
    return 0 if ok else 1


def installed_check(cuda: str, cudnn: str) -> int:
    """In the image: the provider's libraries resolve from the nvidia wheels, all but :data:`DRIVER` (0), else 1."""
    import onnxruntime as ort

    ort.preload_dlls()  # what service.inference.providers does before a CUDA session
    maps = Path("/proc/self/maps").read_text()
    loaded = sorted({p for p in re.findall(r"(/\S+\.so[.\d]*)$", maps, re.M) if "/nvidia/" in p})
    print(f"onnxruntime {ort.__version__}; preload_dlls() loaded {len(loaded)} libraries from the nvidia wheels:")
    print("\n".join(f"  {p}" for p in loaded))
    root = Path(ort.__file__).parent
    nvidia = sorted(str(p) for p in (root.parent / "nvidia").glob("*/lib"))
    provider = root / "capi" / "libonnxruntime_providers_cuda.so"
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(nvidia)}
    out = subprocess.run(["ldd", str(provider)], capture_output=True, text=True, env=env).stdout
    found = dict(re.findall(r"^\s*(\S+) => (\S+)", out, re.M))
    missing = {n for n, where in found.items() if where == "not"}
    for lib in (f"libcudart.so.{cuda}", f"libcublas.so.{cuda}", f"libcublasLt.so.{cuda}", "libcurand.so.10"):
        print(f"{lib}: {found.get(lib, 'not needed')}")
    cudnn_lib = f"libcudnn.so.{cudnn}"
    cudnn_path = next((p for p in loaded if os.path.basename(p) == cudnn_lib), None)
    print(f"{cudnn_lib} (loaded at run time): {cudnn_path or 'not found'}")
    print(f"missing: {' '.join(sorted(missing)) or 'nothing'}")
    ok = missing <= DRIVER and cudnn_path is not None and f"libcudart.so.{cuda}" in found
    print("OK: only the driver is left to the host" if ok else "MISSING libraries beyond the driver")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--installed", action="store_true", help="check the installed build (in the GPU image)")
    a = ap.parse_args(argv)
    ort, cuda, cudnn = pins(REQUIREMENTS.read_text())
    return installed_check(cuda, cudnn) if a.installed else wheel_check(ort, cuda, cudnn)


if __name__ == "__main__":
    sys.exit(main())
