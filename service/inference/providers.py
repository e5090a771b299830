"""ONNX Runtime execution providers: which ones a session asks for, and opening it on them.

The ``providers`` setting is ``auto`` (CUDA when onnxruntime has it and it initialises, else the CPU, logged) or
an explicit list, which must be honoured in full: onnxruntime drops a provider that fails to initialise (no driver,
a missing CUDA library) and runs on the rest, and an explicitly requested provider is not silently replaced
(ONNX Runtime docs, "Execution Providers" and "CUDA Execution Provider").
"""

from __future__ import annotations

import logging
import os
import threading

import onnxruntime as ort

log = logging.getLogger("service.inference.providers")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
ALIASES = {"cpu": CPU, "cuda": CUDA, "tensorrt": "TensorrtExecutionProvider"}


class ProviderError(RuntimeError):
    """The providers asked for are unknown to this onnxruntime, or could not be initialised (message says which)."""


def choose_providers(requested: list[str]) -> list[str]:
    """Resolve the ``providers`` setting into an ORT provider list.

    ``["auto"]`` (or ``[]``) → ``[CUDA, CPU]`` when onnxruntime reports CUDA, else ``[CPU]`` (whether CUDA really
    works is checked when the session is created). Explicit names (or the aliases ``cpu``, ``cuda``, ``tensorrt``)
    must be among ``onnxruntime.get_available_providers()``.

    Raises:
        ProviderError: an unknown provider was asked for.
    """
    available = ort.get_available_providers()
    if not requested or requested == ["auto"]:
        return [CUDA, CPU] if CUDA in available else [CPU]
    requested = [ALIASES.get(p.lower(), p) for p in requested]
    bad = [p for p in requested if p not in available]
    if bad:
        raise ProviderError(f"providers {bad} not available (available: {available})")
    return list(requested)


#: NVIDIA's driver device nodes: present on a host (or in a container given ``--gpus``) with an NVIDIA GPU
NVIDIA_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0")


def runs_on_gpu(requested: list[str]) -> bool:
    """Whether sessions for ``requested`` (the ``providers`` setting) would run on an NVIDIA GPU: the first provider
    :func:`choose_providers` picks is CUDA or TensorRT, and the driver's device nodes exist (onnxruntime-gpu lists
    its CUDA provider on a machine without a GPU too; such a session falls back to the CPU). False when the setting
    names an unknown provider (the model load reports that)."""
    try:
        first = choose_providers(requested)[0]
    except ProviderError:
        return False
    return first != CPU and any(os.path.exists(n) for n in NVIDIA_DEVICE_NODES)


_cuda_preloaded = False
_cuda_preload_lock = threading.Lock()


def preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of pip's ``nvidia-*`` packages before a CUDA session is created (once).

    onnxruntime-gpu's CUDA provider links ``libcudart``/``libcublas``/``libcurand`` of its CUDA major and loads
    cuDNN; installed as ``pip install onnxruntime-gpu[cuda,cudnn]`` (or beside a PyTorch that brought them) these
    live in ``site-packages/nvidia/...``, not on the loader's path, and the provider fails to load unless they are
    loaded first. ``onnxruntime.preload_dlls()`` (onnxruntime >= 1.21; ONNX Runtime docs, "CUDA Execution
    Provider", "Preload DLLs") does that, and falls back to the loader's path (a CUDA base image's system
    libraries). A no-op on the CPU build and on older versions; a failure is logged, and the session creation
    that follows says whether CUDA works.
    """
    global _cuda_preloaded
    with _cuda_preload_lock:  # models load in worker threads: a second load waits for the first one's preload
        if _cuda_preloaded or not hasattr(ort, "preload_dlls"):
            return
        _cuda_preloaded = True
        try:
            ort.preload_dlls()
        except Exception as e:  # a broken nvidia package layout must not stop a CPU fallback
            log.warning("onnxruntime.preload_dlls() failed: %s", e)


def open_session(model_path: str | os.PathLike, opts: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    """An ``InferenceSession`` of ``model_path`` on the providers the ``providers`` setting resolves to.

    ``auto``: CUDA first when onnxruntime reports it; a CUDA provider that fails or is dropped leaves a CPU session
    and a warning. Explicit providers: every one must be in the session's providers. onnxruntime's own fallbacks
    are off (the ``enable_fallback=0`` keyword, read by 1.31 and 1.32 and ignored by 1.20, and
    ``disable_fallback()``): it would otherwise retry a failing creation on the CPU, and switch a session whose
    provider fails during ``run()`` to the CPU for good, silently; here a failing ``run()`` fails its batch.

    Raises:
        ProviderError: unknown providers, an explicit provider not initialised, or the graph cannot be opened.
    """
    chosen = choose_providers(providers)
    auto = providers in ([], ["auto"])
    if CUDA in chosen:
        preload_cuda_libraries()
    try:
        sess = _create(model_path, opts, chosen)
    except ProviderError as e:  # CUDA libraries present but unusable, corrupt graph, ...
        if not (CUDA in chosen and auto):
            raise
        log.warning("CUDA provider failed (%s); falling back to CPU", e)
        chosen = [CPU]
        sess = _create(model_path, opts, chosen)
    got = sess.get_providers()
    if auto and CUDA in chosen and CUDA not in got:
        log.warning("onnxruntime reports %s but it could not be used here (see its log); running on %s", CUDA, got)
    elif not auto and (lost := [p for p in chosen if p not in got]):
        raise ProviderError(
            f"providers {lost} were asked for and could not be initialised (onnxruntime's log says why; for CUDA: "
            f"the driver, and the CUDA/cuDNN libraries of onnxruntime's CUDA major); the session would run on {got}. "
            "Use providers=auto to fall back to the CPU"
        )
    sess.disable_fallback()
    return sess


def _create(model_path: str | os.PathLike, opts: ort.SessionOptions, chosen: list[str]) -> ort.InferenceSession:
    """``ort.InferenceSession`` on exactly ``chosen`` (onnxruntime's creation fallback off).

    Raises:
        ProviderError: onnxruntime could not open it (its message included).
    """
    try:
        return ort.InferenceSession(str(model_path), sess_options=opts, providers=chosen, enable_fallback=0)
    except Exception as e:
        raise ProviderError(f"cannot open {os.path.basename(model_path)}: {e}") from e
