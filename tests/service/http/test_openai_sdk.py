"""The official OpenAI Python SDK against the real service (it asks for base64 by default)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.server_utils import run_server
from training.data.sts import load_task
from training.onnx_encoder import OnnxArtifactEncoder

openai = pytest.importorskip("openai")


def test_openai_sdk_round_trip(default_artifact: Path, tmp_path: Path) -> None:
    sentences = load_task("STSBenchmark").sent1[:40]
    ref = OnnxArtifactEncoder(default_artifact).encode(sentences)
    with run_server(default_artifact.parent, workdir=tmp_path, args=["--api-keys", "sk-test"]) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="sk-test", max_retries=0)
        resp = client.embeddings.create(model="all-minilm-l6-v2", input=sentences)
        got = np.asarray([d.embedding for d in sorted(resp.data, key=lambda d: d.index)], dtype=np.float32)
        np.testing.assert_allclose(got, ref, atol=1e-5)
        assert resp.model == "all-minilm-l6-v2" and resp.usage.prompt_tokens > len(sentences)

        short = client.embeddings.create(model="all-minilm-l6-v2", input=sentences[0], dimensions=64)
        v = np.asarray(short.data[0].embedding)
        assert v.shape == (64,) and abs(np.linalg.norm(v) - 1) < 1e-5
        np.testing.assert_allclose(v, ref[0, :64] / np.linalg.norm(ref[0, :64]), atol=1e-5)

        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="no-such-model", input="x")
        bad = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.embeddings.create(model="all-minilm-l6-v2", input="x")
