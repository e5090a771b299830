"""An fp16 artifact on a CPU-only host: the service refuses it with a clear error (registry, admin API, start-up)
and keeps serving what it serves. fp16 artifacts are for GPU serving (models/README.md); none is available here,
so loading one on the CUDA provider is not exercised by this suite."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.artifact_utils import versioned_copy
from tests.server_utils import REPO_ROOT, free_port, run_server

pytestmark = pytest.mark.timeout(900)

ADMIN = {"Authorization": "Bearer fp16-admin"}
FP32, FP16 = "minilm", "minilm-fp16"


@pytest.fixture(scope="module")
def models(default_artifact, fp16_artifact, tmp_path_factory) -> Path:
    """A models dir with the default fp32 artifact (``minilm:1``) and its fp16 export (``minilm-fp16:1``)."""
    from artifact_contract import load_manifest

    root = tmp_path_factory.mktemp("fp16svc") / "models"
    versioned_copy(default_artifact, root, FP32, "1")
    versioned_copy(fp16_artifact, root, FP16, "1")
    assert load_manifest(root / FP16 / "1").dtype == "fp16"
    return root


def test_registry_refuses_fp16_on_cpu(models):
    from service.inference.model_registry import load_model
    from service.inference.onnx_encoder import ModelLoadError, PrecisionUnsupported
    from service.metrics import Metrics
    from service.settings import Settings

    settings = Settings(models_dir=str(models), providers=["auto"], intra_op_threads=1)
    with pytest.raises(PrecisionUnsupported, match="CUDAExecutionProvider") as e:
        asyncio.run(load_model(settings, Metrics(), FP16))
    assert isinstance(e.value, ModelLoadError) and "serve the fp32 artifact" in str(e.value)
    lm = asyncio.run(load_model(settings, Metrics(), FP32))  # the same settings load the fp32 artifact
    assert lm.info.id == f"{FP32}:1"
    asyncio.run(lm.batcher.close())


def test_admin_load_answers_422_and_the_fp32_model_keeps_serving(models, tmp_path):
    args = ["--default-model", FP32, "--admin-api-keys", "fp16-admin", "--intra-op-threads", "1"]
    with run_server(models, workdir=tmp_path, args=[*args, "--log-level", "warning"]) as srv:
        with httpx.Client(base_url=srv.url, timeout=120.0) as c:
            for route in ("load", "activate"):
                r = c.post(f"/admin/models/{FP16}/{route}", headers=ADMIN)
                assert r.status_code == 422, r.text
                err = r.json()["error"]
                assert err["code"] == "model_load_failed" and "CUDAExecutionProvider" in err["message"], err
            avail = {a["id"]: a for a in c.get("/v1/models").json()["available"]}
            assert not avail[f"{FP16}:1"]["loaded"] and "fp16" in avail[f"{FP16}:1"]["load_error"]
            r = c.post("/v1/embeddings", json={"input": ["A man is playing a guitar."]})
            assert r.status_code == 200 and r.headers["x-model"] == f"{FP32}:1"
            assert len(r.json()["data"][0]["embedding"]) == 384


def test_service_does_not_start_with_an_fp16_default_model(models, tmp_path):
    cmd = [sys.executable, "-m", "service", "--models-dir", str(models), "--data-dir", str(tmp_path / "data")]
    cmd += ["--default-model", FP16, "--host", "127.0.0.1", "--port", str(free_port())]
    p = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "an fp16 artifact needs ONNX Runtime's CUDAExecutionProvider" in p.stderr + p.stdout
    assert "Application startup failed" in p.stderr + p.stdout
