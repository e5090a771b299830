"""Docker files, validated without a Docker engine (none runs here; the images were not built).

Checks what can be checked statically: every COPY source exists, the runtime stage
installs no torch, the CMD's flags are ones the real service CLI accepts, compose's
environment variables are real settings, ports and Prometheus targets line up.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from service.settings import Settings
from tests.server_utils import REPO_ROOT

DOCKER = REPO_ROOT / "docker"
DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]


def _stages(path: Path) -> list[list[dict]]:
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    stages: list[list[dict]] = []
    for ins in parser.structure:
        if ins["instruction"] == "COMMENT" or (not stages and ins["instruction"] != "FROM"):
            continue
        if ins["instruction"] == "FROM":
            stages.append([])
        stages[-1].append(ins)
    return stages


@pytest.fixture(scope="module")
def service_help() -> str:
    out = subprocess.run(
        [sys.executable, "-m", "service", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_stages(name: str, service_help: str) -> None:
    stages = _stages(DOCKER / name)
    assert len(stages) == 2, "builder + runtime"
    builder, runtime = stages
    builder_runs = " ".join(i["value"] for i in builder if i["instruction"] == "RUN")
    assert ".[train]" in builder_runs and "python -m training export" in builder_runs
    runtime_runs = " ".join(i["value"] for i in runtime if i["instruction"] == "RUN")
    assert "torch" not in runtime_runs and "[train]" not in runtime_runs, "runtime image must not install torch"
    assert any(
        i["instruction"] == "COPY" and "--from=builder" in i["value"] and "/models" in i["value"] for i in runtime
    )
    for stage in stages:
        for ins in stage:
            if ins["instruction"] == "COPY" and "--from" not in ins["value"]:
                *sources, _dest = [t for t in ins["value"].split() if not t.startswith("--")]
                for src in sources:
                    assert (REPO_ROOT / src).exists(), f"{name}: COPY source {src} missing"
    cmd = next(i["value"] for i in runtime if i["instruction"] == "CMD")
    argv = [a.strip().strip('"') for a in cmd.strip("[]").split(",")]
    assert argv[:3] == ["python", "-m", "service"]
    for flag in (a for a in argv if a.startswith("--")):
        assert flag in service_help, f"{name}: CMD flag {flag} unknown to python -m service"
    port = argv[argv.index("--port") + 1]
    expose = next(i["value"] for i in runtime if i["instruction"] == "EXPOSE")
    assert expose.split()[0] == port
    health = next(i["value"] for i in runtime if i["instruction"] == "HEALTHCHECK")
    assert f":{port}/ready" in health


def test_compose_files() -> None:
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"embed", "prometheus"} <= set(services)
    embed = services["embed"]
    assert (DOCKER / embed["build"]["context"] / embed["build"]["dockerfile"]).resolve() == (
        DOCKER / "Dockerfile"
    ).resolve()
    mounts = {v.split(":")[1].split()[0] for v in embed["volumes"]}
    assert {"/models", "/data"} <= mounts
    for v in embed["volumes"]:
        assert v.split(":")[0] in compose["volumes"], f"named volume {v} not declared"
    fields = set(Settings.model_fields)
    for var in embed["environment"]:
        assert var.startswith("EMBED_") and var[len("EMBED_") :].lower() in fields, f"{var} is not a setting"
    container_port = embed["ports"][0].split(":")[-1]
    assert "/ready" in " ".join(embed["healthcheck"]["test"]) and container_port in " ".join(
        embed["healthcheck"]["test"]
    )

    prom = services["prometheus"]
    cfg_mount = next(v for v in prom["volumes"] if v.endswith("prometheus.yml:ro"))
    prom_cfg = yaml.safe_load((DOCKER / cfg_mount.split(":")[0]).read_text())
    job = prom_cfg["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"embed:{container_port}"]

    gpu = yaml.safe_load((DOCKER / "docker-compose.gpu.yml").read_text())["services"]["embed"]
    assert (DOCKER / gpu["build"]["context"] / gpu["build"]["dockerfile"]).resolve() == (
        DOCKER / "Dockerfile.gpu"
    ).resolve()
    dev = gpu["deploy"]["resources"]["reservations"]["devices"][0]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]


def test_gpu_runtime_has_cuda_base() -> None:
    runtime = _stages(DOCKER / "Dockerfile.gpu")[1]
    assert re.search(r"nvidia/cuda:12[\w.\-]*cudnn", runtime[0]["value"])
