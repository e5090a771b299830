"""Docker files, checked statically (the images are built and run by ``docker/smoke.sh`` on a podman machine).

What is checked: one runtime stage, no torch and no builder (the artifact comes from the build context), every
COPY source exists (given ``make artifact``), settings come only from ``EMBED_*`` environment variables (the CMD
passes no flags, so ``-e EMBED_PORT=...`` works) and every ENV/compose variable is a real setting, the health
checks probe the configured port through ``python -m service.healthcheck``, Compose publishes on loopback and
requires an API key (Grafana an admin password; its image is pinned and its provisioning mounted), Prometheus
targets line up, and the GPU image pins an onnxruntime-gpu build whose CUDA major matches its base image.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from dockerfile_parse import DockerfileParser

from service.settings import Settings
from tests.server_utils import REPO_ROOT, free_port, run_server

DOCKER = REPO_ROOT / "docker"
DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]
#: onnxruntime-gpu build -> (CUDA major, cuDNN major) its CUDA provider links, read from the wheel's
#: libonnxruntime_providers_cuda.so NEEDED entries by docker/check_ort_cuda.py (libcudart.so.12, libcudnn.so.9)
ORT_GPU_LINKS = {"1.24.4": ("12", "9")}


def _instructions(path: Path) -> list[dict]:
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    return [i for i in parser.structure if i["instruction"] != "COMMENT"]


def _env(ins: list[dict]) -> dict[str, str]:
    env = {}
    for i in ins:
        if i["instruction"] == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", i["value"]))
    return env


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_is_env_driven_and_torch_free(name: str) -> None:
    ins = _instructions(DOCKER / name)
    assert sum(i["instruction"] == "FROM" for i in ins) == 1, "one stage: no builder, no torch download"
    runs = " ".join(i["value"] for i in ins if i["instruction"] == "RUN")
    assert "torch" not in runs and "[train]" not in runs and "training export" not in runs
    model = re.search(r"ARG MODEL=(\S+)", " ".join(f"ARG {i['value']}" for i in ins if i["instruction"] == "ARG"))
    for i in ins:
        if i["instruction"] == "COPY":
            *sources, _dest = [t for t in i["value"].split() if not t.startswith("--")]
            for src in sources:
                src = src.replace("${MODEL}", model.group(1))
                if not src.startswith("models/"):  # models/<name>/ is made by `make artifact`
                    assert (REPO_ROOT / src).exists(), f"{name}: COPY source {src} missing"
    env = _env(ins)
    fields = set(Settings.model_fields)
    for var in env:
        if var.startswith("EMBED_"):
            assert var[len("EMBED_") :].lower() in fields, f"{name}: {var} is not a setting"
    assert env["EMBED_HOST"] == "0.0.0.0" and env["EMBED_PORT"] == "8000"
    cmd = next(i["value"] for i in ins if i["instruction"] == "CMD")
    assert [a.strip().strip('"') for a in cmd.strip("[]").split(",")] == ["python", "-m", "service"], (
        "flags in CMD would override EMBED_* variables"
    )
    health = next(i["value"] for i in ins if i["instruction"] == "HEALTHCHECK")
    assert '"python", "-m", "service.healthcheck"' in health and "8000" not in health
    assert next(i["value"] for i in ins if i["instruction"] == "EXPOSE").split()[0] == env["EMBED_PORT"]


def test_cpu_image_uses_the_cpu_runtime() -> None:
    deps = " ".join(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert "onnxruntime>=" in deps and "onnxruntime-gpu" not in deps
    assert "onnxruntime" not in " ".join(
        i["value"] for i in _instructions(DOCKER / "Dockerfile") if i["instruction"] == "RUN"
    )


def test_gpu_image_pins_ort_build_matching_its_cuda_base() -> None:
    text = (DOCKER / "Dockerfile.gpu").read_text()
    sys.path.insert(0, str(DOCKER))
    try:
        from check_ort_cuda import pins
    finally:
        sys.path.pop(0)
    ort, cuda = pins(text)
    assert ort in ORT_GPU_LINKS, f"onnxruntime-gpu {ort}: run docker/check_ort_cuda.py and record its links here"
    assert ORT_GPU_LINKS[ort][0] == cuda, (
        f"onnxruntime-gpu {ort} links CUDA {ORT_GPU_LINKS[ort][0]}, base is CUDA {cuda}"
    )
    assert re.search(r"nvidia/cuda:[\d.]+-cudnn-runtime", text), "the base must carry cuDNN (libcudnn.so.9)"
    assert 'pip uninstall -y onnxruntime && pip install "onnxruntime-gpu==${ORT_GPU_VERSION}"' in text


def test_compose_is_loopback_and_keyed_by_default() -> None:
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    services = compose["services"]
    embed = services["embed"]
    assert (DOCKER / embed["build"]["context"] / embed["build"]["dockerfile"]).resolve() == (DOCKER / "Dockerfile")
    mounts = {v.split(":")[1].split()[0] for v in embed["volumes"]}
    assert {"/models", "/data"} <= mounts
    for v in embed["volumes"]:
        assert v.split(":")[0] in compose["volumes"], f"named volume {v} not declared"
    fields = set(Settings.model_fields)
    for var in embed["environment"]:
        assert var.startswith("EMBED_") and var[len("EMBED_") :].lower() in fields, f"{var} is not a setting"
    assert embed["environment"]["EMBED_API_KEYS"].startswith("${EMBED_API_KEYS:?"), "a key must be required"
    for port in (*embed["ports"], *services["prometheus"]["ports"], *services["grafana"]["ports"]):
        assert port.startswith(("127.0.0.1:", "${EMBED_BIND:-127.0.0.1}:")), f"{port} is not loopback by default"
    assert embed["healthcheck"]["test"] == ["CMD", "python", "-m", "service.healthcheck"]
    prom = services["prometheus"]
    cfg_mount = next(v for v in prom["volumes"] if v.endswith("prometheus.yml:ro"))
    job = yaml.safe_load((DOCKER / cfg_mount.split(":")[0]).read_text())["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"embed:{embed['ports'][0].split(':')[-1]}"]
    grafana = services["grafana"]
    assert re.fullmatch(r"grafana/grafana-oss:\d+\.\d+\.\d+", grafana["image"]), "pin a Grafana release"
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert {
        "./grafana/provisioning:/etc/grafana/provisioning:ro",
        "./grafana/dashboards:/etc/grafana/dashboards:ro",
    } <= set(grafana["volumes"])
    gpu = yaml.safe_load((DOCKER / "docker-compose.gpu.yml").read_text())["services"]["embed"]
    assert (DOCKER / gpu["build"]["context"] / gpu["build"]["dockerfile"]).resolve() == (DOCKER / "Dockerfile.gpu")
    dev = gpu["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]


def test_healthcheck_follows_the_port_setting(default_artifact, tmp_path) -> None:
    """``python -m service.healthcheck`` probes the port given by EMBED_PORT: 0 against a live server on a
    non-default port, 1 when nothing listens there."""
    env = {"EMBED_PORT": str(free_port()), "EMBED_HOST": "0.0.0.0"}
    probe = [sys.executable, "-m", "service.healthcheck"]
    down = subprocess.run(probe, cwd=REPO_ROOT, env={**os.environ, **env}, capture_output=True)
    assert down.returncode == 1
    with run_server(default_artifact.parent, workdir=tmp_path) as srv:
        env["EMBED_PORT"] = str(srv.port)
        up = subprocess.run(probe, cwd=REPO_ROOT, env={**os.environ, **env}, capture_output=True)
        assert up.returncode == 0, up.stderr
