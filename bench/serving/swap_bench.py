"""Hot-swap benchmark: request latency during a model swap vs steady state, and the re-embedding rate.

Setup (all in a temporary directory): ``minilm/1`` = the default fp32 artifact; ``minilm/2`` =
the same encoder cut to 256 dimensions by an ONNX Slice (a different model, built by
``bench.lib.artifacts.sliced_artifact``), published into the models dir just
before it is activated. The real service runs as a subprocess; a flat cosine collection
holds ``--points`` STS-B sentences embedded by ``minilm:1``.

Phases, with ``--clients`` closed-loop clients each sending ``POST /v1/embeddings`` with
``--batch`` STS-B sentences the whole time:

1. ``steady (v1)``: ``--seconds`` of traffic on ``minilm:1``;
2. ``swap``: ``POST /admin/models/minilm/activate {"version": "2"}`` (load + warm-up + canary
   + swap), then the collection re-embeds in the background until its ``reembedding.state``
   is ``completed``. Latencies are split into ``activate call`` (requests that started while
   the activate request was in flight: the load competes for the CPU) and ``re-embedding``
   (from the activate answer until the collection swapped);
3. ``steady (v2)``: ``minilm:1`` is unloaded, then ``--seconds`` of traffic on ``minilm:2``.

Reported per phase: requests, failed requests, p50/p99 latency (ms), sentences/s; plus the
activate call's duration and the re-embedding rate (points/s, from the collection's status).

``--train CONFIG``: the user's whole flow instead of a prepared ``minilm/2``. The service runs with
``--model-control poll``; after ``steady (v1)``, ``python -m training train --config CONFIG --publish <models>``
(``--artifact_name minilm``, no intermediate evaluation or checkpoints, ``--train-arg`` flags added, e.g.
``--train-arg=--max_steps=200 --train-arg=--device=cuda``) trains under the same traffic and publishes ``minilm/2``;
the service activates it by itself (no admin call) and the collection re-embeds. Phases: ``training`` (from the
job's start until ``minilm/2`` is in the models dir: start-up, training, export), ``swap: poll activation`` (from
then until the service answers with ``minilm:2``),
``swap: re-embedding``, ``steady (v2)``; also the job's training steps/s (its ``results.json``).

``--server-arg`` passes a flag to the service (e.g. ``--server-arg=--providers=cuda`` on a GPU).

Examples (the commands recorded in docs/performance.md)::

    .venv/bin/python -m bench.serving.swap_bench --clients 4 --batch 8 --points 2000 --seconds 15
    .venv/bin/python -m bench.serving.swap_bench --train configs/simcse_3r.yaml --train-arg=--max_steps=20 --seconds 10

Not a test: it asserts nothing, it prints a table (and ``--json`` writes the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.lib import REPO
from bench.lib.artifacts import NAME, default_artifact, sliced_artifact, versioned_copy
from bench.lib.server import run_server
from training.data.sts import load_stsb

ADMIN = {"Authorization": "Bearer bench-admin"}


class Load:
    """Closed-loop clients recording ``(start, end, ok, version)`` per request (times: ``time.monotonic()``)."""

    def __init__(self, url: str, pool: list[str], clients: int, batch: int) -> None:
        self.url, self.pool, self.clients, self.batch = url, pool, clients, batch
        self.stop = threading.Event()
        self.records: list[tuple[float, float, bool, str]] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, seed: int) -> None:
        k = seed * 997
        with httpx.Client(base_url=self.url, timeout=120.0) as c:
            while not self.stop.is_set():
                texts = [self.pool[(k + j) % len(self.pool)] for j in range(self.batch)]
                k += self.batch
                t0 = time.monotonic()
                try:
                    r = c.post("/v1/embeddings", json={"input": texts})
                    ok, ver = r.status_code == 200, r.headers.get("x-model", "?")
                except httpx.HTTPError:
                    ok, ver = False, "?"
                with self._lock:
                    self.records.append((t0, time.monotonic(), ok, ver))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def window(self, a: float, b: float) -> list[tuple[float, float, bool, str]]:
        """Requests that started in ``[a, b)``."""
        with self._lock:
            return [r for r in self.records if a <= r[0] < b]


def summarise(name: str, recs: list[tuple[float, float, bool, str]], batch: int) -> dict:
    lat = np.array([(e - s) * 1000 for s, e, ok, _ in recs if ok])
    span = (max(e for _, e, _, _ in recs) - min(s for s, _, _, _ in recs)) if recs else 0.0
    return {
        "phase": name,
        "requests": len(recs),
        "failed": sum(1 for r in recs if not r[2]),
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "sentences_per_s": (len(lat) * batch / span) if span > 0 else None,
        "models": sorted({r[3] for r in recs}),
    }


def _reembedded(status: dict) -> bool:
    r = status.get("reembedding") or {}
    return (
        r.get("state") in ("completed", "failed", "cancelled") and (r.get("target_model") or {}).get("version") == "2"
    )


class TrainingJob:
    """``python -m training train`` publishing the next version of ``minilm`` into ``models``, in the background."""

    def __init__(self, config: str, extra: list[str], models: Path, out: Path) -> None:
        self.out, self.published = out, models / NAME / "2"
        self.cmd = [
            sys.executable, "-m", "training", "train", "--config", config, "--publish", str(models),
            "--artifact_name", NAME, "--output_dir", str(out), "--eval_every", "0", "--save_every", "0",
            "--final_eval", "false", "--export_evaluate", "none", "--progress", "false",
            *extra,  # the training CLI takes --field=value as it is
        ]  # fmt: skip
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log: list[str] = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True).start()

    def wait_published(self) -> float:
        """Block until ``minilm/2`` is in the models dir (the export renames it in whole); returns that time.

        Raises:
            RuntimeError: the job ended without publishing (its output's tail is in the message).
        """
        while not (self.published / "manifest.json").exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"training ended ({self.proc.returncode}) without publishing:\n{''.join(self.log)[-3000:]}"
                )
            time.sleep(0.05)
        return time.monotonic()

    def result(self) -> dict:
        """Wait for the job; its command, duration and training steps/s (``results.json``)."""
        if self.proc.wait() != 0:
            raise RuntimeError(f"training failed ({self.proc.returncode}):\n{''.join(self.log)[-3000:]}")
        res = json.loads((self.out / "results.json").read_text())
        return {
            "command": shlex.join(["python", *self.cmd[1:]]),
            "job_seconds": round(time.monotonic() - self.t0, 1),
            "steps": res["steps"],
            "train_seconds": res["train_seconds"],
            "steps_per_second": res["steps_per_second"],
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--batch", type=int, default=8, help="sentences per request")
    p.add_argument("--points", type=int, default=2000, help="STS-B sentences in the collection")
    p.add_argument("--seconds", type=float, default=15.0, help="length of each steady phase")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--train", default=None, metavar="CONFIG", help="v2 = this training config, published (poll mode)")
    p.add_argument("--train-arg", action="append", default=[], help="an extra training flag, e.g. --max_steps=200")
    p.add_argument("--server-arg", action="append", default=[], help="an extra service flag, e.g. --providers=cuda")
    a = p.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    src = default_artifact()  # exported if missing
    test, train = load_stsb("test"), load_stsb("train")
    points = list(dict.fromkeys(train.sent1 + train.sent2))[: a.points]
    pool = list(dict.fromkeys(test.sent1 + test.sent2))

    with tempfile.TemporaryDirectory(prefix="swap_bench-") as tmp:
        root = Path(tmp)
        models = root / "models"
        versioned_copy(src, models, NAME, "1")
        args = ["--default-model", NAME, "--admin-api-keys", "bench-admin", "--log-level", "warning", *a.server_arg]
        if a.train:
            args += ["--model-control", "poll", "--model-poll-interval-s", "1"]
        else:
            sliced_artifact(src, root / "stage", NAME, "2", 256)
        with (
            run_server(models, workdir=root / "work", args=args) as srv,
            httpx.Client(base_url=srv.url, timeout=600.0) as c,
        ):
            assert c.put("/collections/bench", json={"index": "flat", "metric": "cosine"}).status_code == 200
            for i in range(0, len(points), 256):
                r = c.put(
                    "/collections/bench/points",
                    json={"points": [{"id": i + j, "text": t} for j, t in enumerate(points[i : i + 256])]},
                )
                r.raise_for_status()
            load = Load(srv.url, pool, a.clients, a.batch)
            load.start()
            try:
                time.sleep(2.0)  # ramp-up, not measured
                t_steady1 = time.monotonic()
                time.sleep(a.seconds)
                if a.train:
                    t_train = time.monotonic()
                    training = TrainingJob(a.train, a.train_arg, models, root / "run")
                    t_act0 = training.wait_published()
                    while (c.get("/info").json()["model_version"]) != "2":
                        time.sleep(0.05)
                    t_act1 = time.monotonic()  # the service answers with minilm:2
                else:
                    os.rename(root / "stage" / NAME / "2", models / NAME / "2")  # publish
                    t_act0 = time.monotonic()
                    r = c.post(f"/admin/models/{NAME}/activate", headers=ADMIN, json={"version": "2"})
                    t_act1 = time.monotonic()
                    r.raise_for_status()
                while not _reembedded(st := c.get("/collections/bench").json()):  # towards minilm:2, finished
                    time.sleep(0.2)
                t_re = time.monotonic()
                reembed = st["reembedding"]
                job = training.result() if a.train else None
                # nothing needs the old model any more: release it (its ORT threads would otherwise stay around)
                c.post(f"/admin/models/{NAME}/unload", headers=ADMIN, json={"version": "1"}).raise_for_status()
                time.sleep(1.0)
                t_steady2 = time.monotonic()
                time.sleep(a.seconds)
                t_end = time.monotonic()
            finally:
                load.finish()
            rows = [
                summarise("steady (v1)", load.window(t_steady1, t_train if a.train else t_act0), a.batch),
                *([summarise("training", load.window(t_train, t_act0), a.batch)] if a.train else []),
                summarise(
                    "swap: poll activation" if a.train else "swap: activate call", load.window(t_act0, t_act1), a.batch
                ),  # fmt: skip
                summarise("swap: re-embedding", load.window(t_act1, t_re), a.batch),
                summarise("swap: whole", load.window(t_act0, t_re), a.batch),
                summarise("steady (v2)", load.window(t_steady2, t_end), a.batch),
            ]
            all_failed = sum(1 for r in load.records if not r[2])
    out = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}",
        "command": "python -m bench.serving.swap_bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "clients": a.clients,
        "batch": a.batch,
        "points": len(points),
        "activate_seconds": round(t_act1 - t_act0, 3),
        "reembedding": {
            "state": reembed["state"],
            "points": reembed["total"],
            "seconds": reembed.get("seconds"),
            "rate_per_s": reembed.get("rate_per_s"),
            "dimension": reembed.get("dimension"),
        },
        "failed_requests_total": all_failed,
        "phases": rows,
        **({"training": job} if a.train else {}),
    }
    print(f"\n{out['machine']}\n{out['command']}\n")
    print("| phase | requests | failed | p50 ms | p99 ms | sentences/s | served by |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        f = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
        print(
            f"| {r['phase']} | {r['requests']} | {r['failed']} | {f(r['p50_ms'])} | {f(r['p99_ms'])} | "
            f"{f(r['sentences_per_s'])} | {', '.join(r['models'])} |"
        )
    if a.train:
        print(
            f"\ntraining: {job['command']}\n  {job['steps']} steps in {job['train_seconds']:.1f} s of training = "
            f"{job['steps_per_second']:.2f} steps/s; the job took {job['job_seconds']:.1f} s (start, export "
            f"included)"
        )
    print(
        f"\n{'poll activation' if a.train else 'activate call'}: {out['activate_seconds']:.2f} s; re-embedding: "
        f"{reembed['total']} points in {reembed.get('seconds')} s = {reembed.get('rate_per_s')} points/s "
        f"({'384 -> 384' if a.train else '384 -> 256'} dims); failed requests overall: {all_failed}"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
