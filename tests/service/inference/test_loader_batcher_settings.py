"""The service's loader, batcher and settings in-process, on the real default artifact.

Bad artifacts are real copies of the default one (files symlinked) with one thing
broken in ``manifest.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.device_defaults import gpu_api_workers
from service.inference.batch_errors import BatcherClosed, BatchFailed, InputTooLong, QueueFull
from service.inference.batcher import Batcher, _Job
from service.inference.onnx_encoder import ModelLoadError, OnnxModel
from service.metrics import Metrics
from service.settings import Settings
from tests.server_utils import REPO_ROOT

pytestmark = pytest.mark.timeout(300)

SENTENCES = [
    "A man is playing a guitar.",
    "A woman is slicing an onion.",
    "Three dogs run across a snowy field.",
    "The stock market fell sharply on Monday after the announcement.",
    "A child rides a bicycle.",
]


@pytest.fixture(scope="module")
def model(default_artifact: Path) -> OnnxModel:
    m = OnnxModel(default_artifact, providers=["CPUExecutionProvider"], intra_op_threads=1, inter_op_threads=1)
    m.warm_up(batch_size=2)
    return m


def _broken_copy(src: Path, dst: Path, edit) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "manifest.json":
            os.symlink(f, dst / f.name)
    manifest = json.loads((src / "manifest.json").read_text())
    edit(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_loads_and_passes_canary(model):
    assert model.providers == ["CPUExecutionProvider"]
    diff = model.check_canary()
    if model.manifest.canary is not None:
        assert diff is not None and diff <= model.manifest.canary.atol
    e = model.embed_sync(SENTENCES)
    assert e.shape == (5, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)


def test_canary_mismatch_refuses_to_load(default_artifact, tmp_path):
    def edit(m):
        m["canary"] = {"sentences": SENTENCES[:2], "embeddings": [[0.05] * 384, [-0.05] * 384], "atol": 1e-3}

    bad = _broken_copy(default_artifact, tmp_path / "bad", edit)
    m = OnnxModel(bad, providers=["CPUExecutionProvider"], intra_op_threads=1)
    with pytest.raises(ModelLoadError, match="canary mismatch"):
        m.warm_up(batch_size=1)


def test_dimension_mismatch_is_named(default_artifact, tmp_path):
    def edit(m):
        m["dimension"] = 256
        m.pop("canary", None)

    bad = _broken_copy(default_artifact, tmp_path / "bad", edit)
    with pytest.raises(ModelLoadError, match="384 columns, manifest dimension is 256"):
        OnnxModel(bad, providers=["CPUExecutionProvider"], intra_op_threads=1)


def test_hash_mismatch_is_named(default_artifact, tmp_path):
    bad = _broken_copy(default_artifact, tmp_path / "bad", lambda m: m.update(sha256="0" * 64))
    with pytest.raises(ModelLoadError, match="sha256"):
        OnnxModel(bad, providers=["CPUExecutionProvider"])


@pytest.fixture
def cuda_reported_but_unusable(monkeypatch):
    """onnxruntime says CUDA is available (as onnxruntime-gpu does on any host) but cannot initialise it.

    Only the availability report is changed: the real (CPU) onnxruntime then drops the CUDA provider when the
    session is created, as onnxruntime-gpu does when the driver or a CUDA library is missing.
    """
    import service.inference.providers as providers

    monkeypatch.setattr(providers.ort, "get_available_providers", lambda: [providers.CUDA, providers.CPU])
    return providers


def test_cuda_libraries_are_preloaded_once_before_a_cuda_session_only(default_artifact, cuda_reported_but_unusable,
                                                                      monkeypatch):  # fmt: skip
    pv, calls = cuda_reported_but_unusable, []
    monkeypatch.setattr(pv, "_cuda_preloaded", False)
    monkeypatch.setattr(pv.ort, "preload_dlls", lambda *a, **k: calls.append(1), raising=False)
    OnnxModel(default_artifact, providers=["cpu"], intra_op_threads=1)
    assert calls == []
    OnnxModel(default_artifact, providers=["auto"], intra_op_threads=1)
    OnnxModel(default_artifact, providers=["auto"], intra_op_threads=1)
    assert calls == [1]


@pytest.mark.parametrize("providers", [["auto"], []])
def test_auto_falls_back_to_the_cpu_when_cuda_cannot_be_used(default_artifact, cuda_reported_but_unusable, caplog,
                                                               providers):  # fmt: skip
    pv = cuda_reported_but_unusable
    assert pv.choose_providers(providers) == [pv.CUDA, pv.CPU]
    with caplog.at_level("WARNING", logger="service.inference.providers"):
        m = OnnxModel(default_artifact, providers=providers, intra_op_threads=1)
    assert m.providers == [pv.CPU]
    assert any("could not be used" in r.getMessage() for r in caplog.records), caplog.text
    assert m.embed_sync(SENTENCES[:2]).shape == (2, m.info.dimension)


def test_api_workers_by_the_device(cuda_reported_but_unusable, tmp_path, monkeypatch):
    """``api_workers: 0`` serves with front processes only where sessions would run on an NVIDIA GPU: CUDA (or
    TensorRT) chosen by the providers setting *and* the driver's device nodes present; onnxruntime-gpu's report of
    CUDA alone (any host) is not enough."""
    pv = cuda_reported_but_unusable
    assert Settings().api_workers == 0
    assert not pv.runs_on_gpu(["auto"])  # CUDA reported, no device node on this machine
    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr(pv, "NVIDIA_DEVICE_NODES", (str(node),))
    assert pv.runs_on_gpu(["auto"]) and pv.runs_on_gpu(["cuda"])
    assert not pv.runs_on_gpu(["cpu"]) and not pv.runs_on_gpu(["no-such-provider"])


def test_gpu_api_workers_follow_the_host_cores():
    """A GPU deployment's fronts: one per two cores, 8 on the measured 16-core host, never fewer than 2 nor more
    than 8."""
    assert [gpu_api_workers(c) for c in (1, 2, 4, 8, 12, 16, 32, 128)] == [2, 2, 2, 4, 6, 8, 8, 8]
    assert 2 <= gpu_api_workers() <= 8


@pytest.mark.parametrize("providers", [["cuda"], ["CUDAExecutionProvider", "CPUExecutionProvider"]])
def test_an_explicit_provider_that_cannot_be_initialised_refuses_to_load(default_artifact,
                                                                         cuda_reported_but_unusable, providers):  # fmt: skip
    with pytest.raises(ModelLoadError, match=r"\['CUDAExecutionProvider'\] were asked for and could not be init"):
        OnnxModel(default_artifact, providers=providers, intra_op_threads=1)


def test_unknown_provider_is_named(default_artifact):
    with pytest.raises(ModelLoadError, match=r"providers \['NoSuchExecutionProvider'\] not available"):
        OnnxModel(default_artifact, providers=["NoSuchExecutionProvider"])


def test_server_exits_with_clear_error_without_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "service", "--port", "0", "--models-dir", str(tmp_path), "--default-model", "nope"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "no artifact 'nope'" in proc.stderr + proc.stdout


@pytest.mark.parametrize("workers", [1, 3])
def test_split_batches_match_one_batch(model, workers):
    """Tiny budgets force many batches (run ``workers`` at a time); rows must come back in order."""

    async def go():
        b = Batcher(
            model, Metrics(), max_batch_tokens=64, max_batch_size=2, max_queue_size=8, inference_workers=workers
        )
        b.start()
        try:
            return await asyncio.gather(b.submit(SENTENCES), b.submit(SENTENCES[::-1]))
        finally:
            await b.close()

    r1, r2 = asyncio.run(go())
    want = model.run(*model.pad(model.tokenize(SENTENCES).ids))
    np.testing.assert_allclose(r1.pooled, want, atol=1e-4)
    np.testing.assert_allclose(r2.pooled, want[::-1], atol=1e-4)
    assert r1.prompt_tokens == int(model.tokenize(SENTENCES).lengths.sum())


def test_worker_survives_a_failing_batch(model):
    """A batch that ONNX Runtime rejects (token id out of the vocabulary) fails its request only."""

    async def go():
        b = Batcher(model, Metrics(), max_batch_tokens=4096, max_batch_size=8, max_queue_size=8)
        b.start()
        try:
            loop = asyncio.get_running_loop()
            tok = model.tokenize(["poison"])
            tok.ids[0][1] = 10**9  # not a token id: the Gather in the graph fails
            job = _Job(tok, loop.create_future(), np.empty((1, 384), np.float32), remaining=1)
            b._queue.put_nowait(job)
            with pytest.raises(BatchFailed, match="inference failed"):
                await job.future
            ok = await b.submit(SENTENCES[:2])
            assert ok.pooled.shape == (2, 384) and np.isfinite(ok.pooled).all()
            with pytest.raises(InputTooLong) as e:
                await b.submit(["short", "word " * 400], truncate=False)
            assert e.value.index == 1 and e.value.n_tokens == 402 and e.value.max_tokens == 256
        finally:
            await b.close()

    asyncio.run(go())


def test_queue_full(model):
    async def go():
        b = Batcher(model, Metrics(), max_batch_tokens=4096, max_batch_size=8, max_queue_size=1)
        b.start()
        try:
            first = asyncio.ensure_future(b.submit(SENTENCES))
            await asyncio.sleep(0)  # admitted
            with pytest.raises(QueueFull):
                await b.submit(SENTENCES[:1])
            assert (await first).pooled.shape == (5, 384)
            assert (await b.submit(SENTENCES[:1])).pooled.shape == (1, 384)
        finally:
            await b.close()

    asyncio.run(go())


def test_close_past_its_drain_timeout_answers_every_request(model):
    """close() waits up to its timeout, then cancels the running batches: their requests get BatcherClosed, never
    wait forever; a request after close() is refused."""

    async def go():
        b = Batcher(model, Metrics(), max_batch_tokens=1 << 20, max_batch_size=256, max_queue_size=8)
        b.start()
        long = asyncio.ensure_future(b.submit(["word " * 250] * 256))  # one batch of ~64k tokens: seconds on a CPU
        await asyncio.sleep(0.3)  # tokenized and running
        await asyncio.wait_for(b.close(timeout=0.1), 10)
        with pytest.raises(BatcherClosed):
            await asyncio.wait_for(long, 10)
        with pytest.raises(BatcherClosed):
            await b.submit(SENTENCES[:1])

    asyncio.run(go())


def test_close_answers_a_request_still_tokenizing(model):
    """A request whose tokenization outlasts close()'s drain timeout is answered BatcherClosed, not left waiting on a
    worker that is gone (nor failed by a thread pool that was shut down)."""

    async def go():
        b = Batcher(model, Metrics(), max_batch_tokens=4096, max_batch_size=16, max_queue_size=8, tokenizer_threads=1)
        b.start()
        texts = [f"{i} " + "a sentence of several words to tokenize " * 10 for i in range(10_000)]  # 4M characters
        slow = asyncio.ensure_future(b.submit(texts))  # ~500 chunks (~0.7 s), one in the pool at a time
        await asyncio.sleep(0.05)
        assert not slow.done()
        await asyncio.wait_for(b.close(timeout=0.01), 10)
        with pytest.raises(BatcherClosed):
            await asyncio.wait_for(slow, 10)

    asyncio.run(go())


def test_flags_override_env(monkeypatch):
    from service.__main__ import settings_from_args

    monkeypatch.setenv("EMBED_MAX_CLIENT_BATCH_SIZE", "4")
    monkeypatch.setenv("EMBED_API_KEYS", "a,b")
    monkeypatch.setenv("EMBED_PROVIDERS", "CPUExecutionProvider")
    s = settings_from_args(["--max-client-batch-size", "8", "--intra-op-threads", "1"])
    assert s.max_client_batch_size == 8 and s.intra_op_threads == 1
    assert s.api_keys == ["a", "b"] and s.providers == ["CPUExecutionProvider"]
    assert "api_keys" not in repr(s)  # keys never end up in logs
    with pytest.raises(SystemExit):
        settings_from_args(["--max-batch-size", "-1"])


def test_batching_defaults_follow_the_provider():
    """Batch limits left at their default take the model's first provider's values; set ones win everywhere."""
    from service.settings import Settings

    cuda, cpu = ["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"]
    s = Settings()
    assert s.batching(cpu) == {"max_batch_tokens": 2048, "max_batch_size": 16, "batch_overhead_tokens": 16}
    assert s.batching(cuda) == {"max_batch_tokens": 32768, "max_batch_size": 256, "batch_overhead_tokens": 256}
    assert s.batching(["SomeOtherExecutionProvider"]) == s.batching(cpu)
    s = Settings(max_batch_size=64, batch_overhead_tokens=0)
    assert s.batching(cuda) == {"max_batch_tokens": 32768, "max_batch_size": 64, "batch_overhead_tokens": 0}
    assert s.limits(cpu)["max_batch_size"] == 64 and s.limits(cpu)["max_batch_tokens"] == 2048


@pytest.mark.parametrize("max_batch_size,max_batch_tokens,overhead", [(16, 16384, 16), (64, 16384, 64), (8, 200, 0)])
def test_cut_minimises_padding_within_limits(model, max_batch_size, max_batch_tokens, overhead):
    """Real STS-B lengths: every input placed once, limits held, less padding than fixed-size chunks."""
    from training.data.sts import load_task

    s = load_task("STSBenchmark")
    texts = list(dict.fromkeys(s.sent1))[:256]
    tok = model.tokenize(texts)
    b = Batcher.__new__(Batcher)  # only the cutting policy, no queue or threads
    b.max_batch_size, b.max_batch_tokens, b.batch_overhead_tokens = max_batch_size, max_batch_tokens, overhead
    job = _Job(tok, None, None, remaining=len(texts))
    batches = b._cut([(job, i) for i in range(len(texts))])
    placed = sorted(i for batch in batches for _, i in batch)
    assert placed == list(range(len(texts)))
    lens = tok.lengths
    for batch in batches:
        padded = len(batch) * max(lens[i] for _, i in batch)
        assert len(batch) <= max_batch_size and (padded <= max_batch_tokens or len(batch) == 1)
    cost = sum(len(bt) * max(lens[i] for _, i in bt) + overhead for bt in batches)
    srt = np.sort(lens)
    fixed = sum(len(c) * c.max() + overhead for c in np.array_split(srt, -(-len(srt) // max_batch_size)))
    assert cost <= fixed
    assert sum(len(bt) * max(lens[i] for _, i in bt) for bt in batches) < 1.15 * lens.sum()
