"""Infinity (``infinity-emb`` 0.0.78, https://github.com/michaelfeil/infinity) started as a peer of the service on the
same device for :mod:`bench.serving.peer_serve`: its environment (the kit's separate site folder, the machine's CUDA
libraries), an ONNX copy of the model folder for its ``optimum`` engine, and the server process itself."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from harness.ports import free_port


def peer_env(site: str) -> dict[str, str]:
    """The peer's environment: its own site folder first, offline, no telemetry, the CUDA libraries of the machine's
    ``nvidia`` pip packages on the loader's path (none here: no change)."""
    env = {
        **os.environ,
        "PYTHONPATH": site,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with contextlib.suppress(ImportError, TypeError):
        import nvidia  # the machine's CUDA 13 / cuDNN pip packages (torch's)

        libs = sorted(str(p) for root in nvidia.__path__ for p in Path(root).glob("**/lib") if p.is_dir())
        env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")])
    return env


def onnx_copy(model: Path, site: str, python: str, device: str, work: Path) -> tuple[Path, str]:
    """A copy of the sentence-transformers folder ``model`` (links) with ``model.onnx`` (``last_hidden_state``)
    exported by ``optimum``'s ONNX exporter in the peer's environment, and the export's dtype: what Infinity's ONNX
    engine loads. On CUDA the export is fp16 (``--dtype fp16 --device cuda``; fp32 where that fails): Infinity
    0.0.78's own optimisation step (fusion and fp16 on a GPU) fails under optimum 2 (``OptimizationConfig`` lost
    ``optimize_with_onnxruntime_only``) and it then runs the graph as given. The graph sits at the top of the folder,
    and Infinity is started inside it with ``--model-id .`` (:func:`infinity`): it hands optimum 2 the ``.onnx`` path
    it found under a local folder, which optimum accepts only relative to the folder.

    Raises:
        subprocess.CalledProcessError: the fp32 export failed too.
    """
    out = work / "model-onnx"
    out.mkdir(parents=True)
    for f in model.iterdir():
        (out / f.name).symlink_to(f.resolve())
    for dtype in ["fp16", "fp32"] if device == "cuda" else ["fp32"]:
        export = work / f"export-{dtype}"
        cmd = [
            python,
            "-m",
            "optimum.exporters.onnx",
            "--model",
            str(model),
            "--task",
            "feature-extraction",
            "--library-name",
            "transformers",
            "--dtype",
            dtype,
            "--device",
            device,
            str(export),
        ]
        done = subprocess.run(cmd, env=peer_env(site), capture_output=True, text=True)
        if done.returncode == 0:
            break
        print(f"ONNX export {dtype} failed: {done.stderr[-600:]}", flush=True)
    done.check_returncode()
    for f in export.glob("model.onnx*"):  # the graph (and external data, if any); not the exporter's config copies
        f.rename(out / f.name)
    return out, dtype


@contextlib.contextmanager
def infinity(model: Path, engine: str, device: str, batch: int, site: str, python: str, log: Path):
    """An Infinity server (``infinity_emb v2``) on a free port, yielding its base URL; stopped (SIGINT, then
    SIGKILL) on exit.

    Raises:
        RuntimeError: it exited, or did not answer an embedding request within 300 s (the end of its log says why).
    """
    import httpx

    port = free_port()
    local = engine == "optimum"  # see onnx_copy
    dtype = "auto" if local else "float16" if device == "cuda" else "float32"  # ONNX: the graph's own dtype
    cmd = [
        python,
        "-m",
        "infinity_emb.cli",
        "v2",
        "--model-id",
        "." if local else str(model),
        "--engine",
        engine,
        "--device",
        device,
        "--dtype",
        dtype,
        "--batch-size",
        str(batch),
        "--host",
        "127.0.0.1",  # Infinity's default is 0.0.0.0, with no key
        "--port",
        str(port),
        "--url-prefix",
        "/v1",
        "--no-bettertransformer",
        "--served-model-name",
        "peer",
    ]
    if local:  # its ONNX engine pools the CLS token unless told (the torch engine reads 1_Pooling)
        cmd += ["--pooling-method", "mean"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, env=peer_env(site), stdout=out, stderr=subprocess.STDOUT, cwd=model if local else None
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"infinity {engine} did not start: {log.read_text()[-1500:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(f"{url}/v1/embeddings", json={"input": ["ready?"]}, timeout=10).status_code == 200:
                    break
            time.sleep(1)
        yield url
    finally:
        proc.send_signal(2)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
