"""Cost of one inference batch by shape and by way of running it (not in CI; run alone on the machine).

What ``max_batch_tokens`` trades, and which ONNX Runtime run mode a GPU wants. The default artifact's graph runs
batches of ``n`` inputs of ``L`` tokens (ids of one ordinary word piece between ``[CLS]`` and ``[SEP]``, mask all
ones), the shapes interleaved round after round so that load drift hits them alike, in up to three modes:

* ``run``: ``InferenceSession.run`` with numpy feeds and a numpy answer, what ``service.inference.onnx_encoder.OnnxModel.run``
  does (ONNX Runtime copies the inputs to the device and the output back on every call).
* ``iobinding``: I/O binding (ONNX Runtime Python API, "Data on device"): the inputs and the output are
  ``OrtValue`` buffers on the provider's device, allocated once per shape; a batch is one host-to-device copy of
  the ids and the mask (``update_inplace``), ``run_with_iobinding`` and one device-to-host copy of the
  ``(n, dimension)`` output (``numpy()``).
* ``cuda_graph``: the same bindings on a session with the CUDA provider's ``enable_cuda_graph`` (ONNX Runtime docs,
  "CUDA Execution Provider", "Using CUDA Graphs"): each shape's kernels are captured once, under its own
  ``gpu_graph_id`` run option, and replayed; a graph holds fixed shapes and addresses, so a service would pad
  batches up to a few bucket shapes. CUDA provider only; a session that cannot capture (a node left on the CPU)
  is reported as such.

Per shape and mode: median milliseconds per batch (how long a request that arrives meanwhile waits for it), median
microseconds per padded token (throughput), the ratio to ``run`` and the largest element difference from ``run``'s
output (a mode that answers differently is wrong, not fast). For ``iobinding``, ``copies ms`` is the two copies
alone (what any binding can save at most). On a CPU the per-token cost does not fall with bigger batches, so a
small ``max_batch_tokens`` bounds the wait for free; on a GPU it does, and the budget should be raised.

Usage::

    python -m bench.serving.batch_shape_bench [--threads 2] [--rounds 10]                 # CPU: run and iobinding
    python -m bench.serving.batch_shape_bench --providers cuda --artifact models/all-minilm-l6-v2-fp16 --rounds 50 \\
        --json $OUT/batch_shape.json                                               # a lent GPU: all three modes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from artifact_contract import INPUT_NAMES, MODEL_FILE, OUTPUT_NAME
from bench.lib import REPO
from bench.lib.machine import cpu_model
from service.inference.onnx_encoder import OnnxModel, session_options
from service.inference.providers import CUDA, choose_providers, preload_cuda_libraries

CPU_SHAPES = "2x256,4x256,8x256,16x256,16x128,16x64,16x32"
GPU_SHAPES = "32x16,32x32,128x32,256x32,32x128,128x128,256x128,64x256,256x256"
NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def batch(n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)``, int64 ``(n, length)``: ``[CLS]``, one ordinary word piece, ``[SEP]``."""
    ids = np.full((n, length), 1037, np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return ids, np.ones_like(ids)


def session(path: Path, providers: list[str], threads: int, cuda_graph: bool = False) -> ort.InferenceSession:
    """The artifact's graph on ``providers`` with the service's session options (``OnnxModel``'s).

    Raises:
        RuntimeError: a named provider was dropped by onnxruntime (the session would run elsewhere).
    """
    opts = session_options(threads)
    chosen: list = list(providers)
    if cuda_graph:
        chosen = [(CUDA, {"enable_cuda_graph": "1"}) if p == CUDA else p for p in providers]
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=chosen)
    if lost := [p for p in providers if p not in sess.get_providers()]:
        raise RuntimeError(f"providers {lost} could not be initialised (session on {sess.get_providers()})")
    return sess


class Bound:
    """One shape's inputs and output bound to buffers on ``device`` (``"cpu"`` or ``"cuda"``), allocated once.

    ``__call__`` copies the host ``(n, L)`` feeds in, runs, and returns the host ``(n, dimension)`` output.
    ``graph_id`` (CUDA graphs) is the ``gpu_graph_id`` run option that keys this shape's captured graph.
    """

    def __init__(self, sess: ort.InferenceSession, feeds: dict[str, np.ndarray], device: str, graph_id: int | None):
        self.sess, self.binding = sess, sess.io_binding()
        self.inputs = {k: ort.OrtValue.ortvalue_from_numpy(v, device, 0) for k, v in feeds.items()}
        out = next(o for o in sess.get_outputs() if o.name == OUTPUT_NAME)
        n = next(iter(feeds.values())).shape[0]
        self.output = ort.OrtValue.ortvalue_from_shape_and_type([n, out.shape[1]], NUMPY[out.type], device, 0)
        for k, v in self.inputs.items():
            self.binding.bind_ortvalue_input(k, v)
        self.binding.bind_ortvalue_output(OUTPUT_NAME, self.output)
        self.options = ort.RunOptions()
        if graph_id is not None:
            self.options.add_run_config_entry("gpu_graph_id", str(graph_id))

    def __call__(self, feeds: dict[str, np.ndarray], run: bool = True) -> np.ndarray:
        """Copy ``feeds`` in, run (``run=False``: only the two copies, what binding can save at most), copy out."""
        for k, v in feeds.items():
            self.inputs[k].update_inplace(v)
        if run:
            self.sess.run_with_iobinding(self.binding, self.options)
        return self.output.numpy()


def runners_for(
    artifact: str,
    modes: list[str],
    providers: list[str],
    shapes: list[tuple[int, int]],
    feeds: dict,
    threads: int,
    device: str,
) -> tuple[dict, dict]:
    """``({mode: {shape: callable(feeds) -> (n, dimension) output}}, {mode: why it did not run})``, warmed up."""
    OnnxModel(artifact, providers=providers, intra_op_threads=threads).warm_up(batch_size=2)  # validates it
    path = Path(artifact) / MODEL_FILE
    runners, errors = {}, {}
    for mode in modes:
        try:
            if mode == "run":
                base = session(path, providers, threads)
                runners[mode] = {s: (lambda f, b=base: b.run([OUTPUT_NAME], f)[0]) for s in shapes}
            else:
                sess = session(path, providers, threads, cuda_graph=mode == "cuda_graph")
                gid = (lambda i: i + 1) if mode == "cuda_graph" else (lambda i: None)
                runners[mode] = {s: Bound(sess, feeds[s], device, gid(i)) for i, s in enumerate(shapes)}
            for s in shapes:  # warm-up (and, for CUDA graphs, the capture)
                for _ in range(4):  # a graph id is captured after its first regular run(s)
                    runners[mode][s](feeds[s])
        except Exception as e:  # noqa: BLE001 - reported in the table, the other modes still run
            errors[mode] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            runners.pop(mode, None)
    return runners, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--artifact", action="append", help="an artifact directory (repeatable, interleaved; default: "
                    "models/all-minilm-l6-v2); the first one's run mode is the reference")  # fmt: skip
    ap.add_argument("--providers", default="cpu", help="cpu or cuda (the service's --providers names)")
    ap.add_argument("--shapes", help=f"n x L list; default {CPU_SHAPES} on the CPU, {GPU_SHAPES} on CUDA")
    ap.add_argument("--modes", default="run,iobinding,cuda_graph", help="cuda_graph is skipped off CUDA")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    artifacts = a.artifact or [str(REPO / "models" / "all-minilm-l6-v2")]
    providers = choose_providers(a.providers.split(","))
    on_cuda = providers[0] == CUDA
    if on_cuda:
        preload_cuda_libraries()
    device = "cuda" if on_cuda else "cpu"
    shapes = [tuple(map(int, s.split("x"))) for s in (a.shapes or (GPU_SHAPES if on_cuda else CPU_SHAPES)).split(",")]
    modes = [m for m in a.modes.split(",") if m != "cuda_graph" or on_cuda]
    feeds = {s: dict(zip(INPUT_NAMES, batch(*s))) for s in shapes}
    runners, errors = {}, {}
    for art in artifacts:
        got, why = runners_for(art, modes, providers, shapes, feeds, a.threads, device)
        runners.update({(Path(art).name, m): r for m, r in got.items()})
        errors.update({(Path(art).name, m): e for m, e in why.items()})
    first = session(Path(artifacts[0]) / MODEL_FILE, providers, a.threads)
    reference = {s: first.run([OUTPUT_NAME], feeds[s])[0].astype(np.float32) for s in shapes}
    ref_key = (Path(artifacts[0]).name, "run")
    times: dict[tuple, list[float]] = {(k, s): [] for k in runners for s in shapes}
    copies: dict[tuple, list[float]] = {(k, s): [] for k in runners if k[1] == "iobinding" for s in shapes}
    diff: dict[tuple, float] = {}
    load0 = os.getloadavg()
    for _ in range(a.rounds):
        for s in shapes:
            for k, run in runners.items():
                t0 = time.perf_counter()
                out = run[s](feeds[s])
                times[(k, s)].append(time.perf_counter() - t0)
                diff[(k, s)] = max(diff.get((k, s), 0.0), float(np.abs(out.astype(np.float32) - reference[s]).max()))
                if (k, s) in copies:
                    t0 = time.perf_counter()
                    run[s](feeds[s], run=False)
                    copies[(k, s)].append(time.perf_counter() - t0)
    load1 = os.getloadavg()
    rows = []
    for s in shapes:
        ref_ms = statistics.median(times[(ref_key, s)]) * 1000 if ref_key in runners else None
        for k in runners:
            ms = statistics.median(times[(k, s)]) * 1000
            rows.append({
                "shape": f"{s[0]}x{s[1]}", "padded_tokens": s[0] * s[1], "artifact": k[0], "mode": k[1], "ms": ms,
                "us_per_token": ms * 1000 / (s[0] * s[1]), "vs_reference": ref_ms / ms if ref_ms else None,
                "max_abs_diff": diff[(k, s)],
                "copies_ms": statistics.median(copies[(k, s)]) * 1000 if (k, s) in copies else None,
            })  # fmt: skip
    print(f"providers {first.get_providers()}; onnxruntime {ort.__version__}; ORT threads {a.threads}; "
          f"{a.rounds} rounds; CPU {cpu_model()}; load average {load0[0]:.2f} -> {load1[0]:.2f}; reference: "
          f"{' '.join(ref_key)}\n")  # fmt: skip
    for k, e in errors.items():
        print(f"{' '.join(k)} did not run: {e}")
    print("| batch | padded tokens | artifact | mode | ms per batch (median) | us per token | reference / this "
          "| max abs diff | copies ms |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        vs = f"{r['vs_reference']:.2f}" if r["vs_reference"] else "-"
        cp = f"{r['copies_ms']:.3f}" if r["copies_ms"] is not None else "-"
        print(f"| {r['shape']} | {r['padded_tokens']} | {r['artifact']} | {r['mode']} | {r['ms']:.3f} "
              f"| {r['us_per_token']:.2f} | {vs} | {r['max_abs_diff']:.1e} | {cp} |")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps({"providers": first.get_providers(), "onnxruntime": ort.__version__,
                                            "cpu": cpu_model(), "load": [load0[0], load1[0]],
                                            "errors": {" ".join(k): e for k, e in errors.items()}, "rows": rows},
                                           indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
