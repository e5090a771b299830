"""CPU smoke run: a dozen SimCSE + 3R steps on a slice of the corpus, tiny evaluation, export,
then the real service (uvicorn subprocess) loads and serves the trained artifact.

Also checks the sentence-transformers copy (``SentenceTransformer(best/)``) and that the ONNX
artifact's embeddings (onnxruntime + tokenizers + postprocess) match it.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch

from artifact_contract import validate_artifact
from tests.server_utils import run_server
from training.config import load_settings
from training.evaluation import onnx_encode_fn
from training.st_dir import default_model_dir
from training.trainer import Trainer

pytestmark = pytest.mark.timeout(900)

NAME = "smoke-simcse-3r"
SENTS = ["A man is playing a guitar.", "The cat sleeps on the sofa.", "Stocks fell sharply on Monday."]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("smoke")
    cfg = load_settings(
        None,
        {
            "max_steps": 12,
            "batch_size": 8,
            "data": {"max_train_samples": 400},
            "three_r": {"enabled": True, "pool_size": 16, "n_top_words": 100, "pool_min_top_fraction": 0.6},
            "eval_every": 6,
            "eval_limit": 48,
            "final_eval_tasks": ["STSBenchmark"],
            "save_every": 6,
            "output_dir": str(root / "run"),
            "models_dir": str(root / "models"),
            "artifact_name": NAME,
            "artifact_version": "1",
            "export_evaluate": "none",
            "progress": False,
            "threads": 1,  # as the suite's other worker runs beside it (two threads were slower there)
        },
    )
    results = Trainer(cfg).run()
    return root, results


def test_run_outputs(trained):
    root, results = trained
    run = root / "run"
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in train] == list(range(12))
    assert [r["step"] for r in evals] == [6, 12]
    assert all(np.isfinite(r["loss"]) and "loss/simcse" in r and "c" in r for r in train)
    assert train[-1]["c"] != train[0]["c"]  # c is learned
    assert (run / "metrics.png").stat().st_size > 0
    assert len((run / "redundant_pool.txt").read_text().splitlines()) == 16
    assert set(results["scores"]) == {"STSBenchmark-dev@48", "STSBenchmark@48"}  # partial evals are labelled
    assert {"alignment", "uniformity"} <= set(results)


def test_manifest_and_onnx_match_sentence_transformers(trained):
    from sentence_transformers import SentenceTransformer

    root, results = trained
    art = root / "models" / NAME / "1"
    man = validate_artifact(art)
    assert man.name == NAME and man.pooling == "mean" and man.dimension == 384
    assert man.scores["STSBenchmark@48"] == pytest.approx(results["scores"]["STSBenchmark@48"], abs=1e-3)
    assert man.training["three_r"]["enabled"] is True and man.training["steps"] == 12
    st = SentenceTransformer(str(root / "run" / "best"), device="cpu")
    ref = st.encode(SENTS, normalize_embeddings=True)
    got = onnx_encode_fn(str(art))(SENTS)
    assert np.min(np.sum(ref * got, axis=1)) > 0.9999
    # training moved the weights away from the base encoder
    base = SentenceTransformer(str(default_model_dir()), device="cpu").encode(SENTS, normalize_embeddings=True)
    assert np.max(np.abs(base - ref)) > 1e-5


def test_service_serves_trained_artifact(trained, tmp_path):
    root, _ = trained
    args = ["--default-model", NAME, "--log-level", "warning", "--intra-op-threads", "1"]
    ref = onnx_encode_fn(str(root / "models" / NAME / "1"))(SENTS)
    with run_server(root / "models", workdir=tmp_path, args=args) as srv:
        r = httpx.post(f"{srv.url}/v1/embeddings", json={"input": SENTS, "model": NAME}, timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == NAME
        emb = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        assert emb.shape == (3, 384)
        assert np.min(np.sum(emb * ref, axis=1)) > 0.9999
