"""Docker files, checked statically (the images are built and run by ``docker/smoke.sh`` on a podman machine).

What is checked: the CPU image's stages (a runtime on the Python base; a ``baked`` target adding one artifact; the
default target, last, without a model), no torch and no builder (the artifact comes from the build context), every
COPY source exists (given ``make artifact``), settings come only from ``EMBED_*`` environment variables (the CMD
passes no flags, so ``-e EMBED_PORT=...`` works) and every ENV/compose variable is a real setting, the health
checks probe the configured port through ``python -m service.healthcheck``, Compose publishes on loopback, mounts
the models directory read-only and requires an API key (Grafana an admin password; its image is pinned and its
provisioning mounted), Prometheus finds the service's replicas by DNS, both images run as a non-root user, and the
GPU image installs exactly ``docker/requirements-gpu.txt`` on the CPU image's Python base (no CUDA base image): the
versions the device kit carries, onnxruntime-gpu with NVIDIA's wheels of the CUDA and cuDNN majors it links.

The scale-out override (``docker-compose.scale.yml``): every service has a health check or waits on another, every
port is loopback-bound by default, the replicas use the milvus backend at the Milvus service's port, poll for new
model versions and send ``X-Replica``; the nginx template sends every path to the replicas through a variable (DNS
at run time) with limits above the service's own, and parses (``nginx -t`` where nginx is installed); the Milvus
image's entrypoint writes a config for the real wheel. The replica header itself is checked on a live server.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from service.settings import Settings
from tests.server_utils import REPO_ROOT, free_port, run_server

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport (a dev dependency there)
    import tomli as tomllib

DOCKER = REPO_ROOT / "docker"
DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
LOOPBACK = ("127.0.0.1:", "${EMBED_BIND:-127.0.0.1}:")
#: onnxruntime-gpu build -> (CUDA major, cuDNN major) its CUDA provider links, read from the wheel's
#: libonnxruntime_providers_cuda.so NEEDED entries by docker/check_ort_cuda.py (1.24.4, a CUDA 12 build: libcudart.so.12,
#: libcudnn.so.9; 1.31.1: libcudart.so.13, cuDNN 9 loaded at run time, not linked)
ORT_GPU_LINKS = {"1.24.4": ("12", "9"), "1.31.1": ("13", "9")}


def _instructions(path: Path) -> list[dict]:
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    return [i for i in parser.structure if i["instruction"] != "COMMENT"]


def _env(ins: list[dict]) -> dict[str, str]:
    env = {}
    for i in ins:
        if i["instruction"] == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", i["value"]))
    return env


def _stages(ins: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """``(base, name, instructions)`` per ``FROM`` of a Dockerfile."""
    out: list[tuple[str, str, list[dict]]] = []
    for i in ins:
        if i["instruction"] == "FROM":
            base, _, name = i["value"].partition(" AS ")
            out.append((base.strip(), name.strip(), []))
        elif out:
            out[-1][2].append(i)
    return out


class _ComposeLoader(yaml.SafeLoader):
    """YAML loader for Compose files: ``!reset`` and ``!override`` (Compose's merge tags) become a marker dict."""


def _tagged(tag: str):
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> dict:
        if isinstance(node, yaml.SequenceNode):
            return {tag: loader.construct_sequence(node, deep=True)}
        if isinstance(node, yaml.MappingNode):
            return {tag: loader.construct_mapping(node, deep=True)}
        return {tag: loader.construct_yaml_null(node) if node.value in ("", "null", "~") else node.value}

    return construct


_ComposeLoader.add_constructor("!reset", _tagged("!reset"))
_ComposeLoader.add_constructor("!override", _tagged("!override"))


def _compose(name: str) -> dict:
    return yaml.load((DOCKER / name).read_text(), Loader=_ComposeLoader)


def _mount(spec: str) -> tuple[str, str, str]:
    """``(source, target, mode)`` of a short-syntax volume (the source may be ``${VAR:-default}``)."""
    m = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(\w+))?", spec)
    assert m, f"unparsed volume {spec!r}"
    return m.group(1), m.group(2), m.group(3) or "rw"


def _is_named(source: str) -> bool:
    return not source.startswith((".", "/", "$", "~"))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_is_env_driven_and_torch_free(name: str) -> None:
    ins = _instructions(DOCKER / name)
    stages = _stages(ins)
    names = [n for _, n, _ in stages]
    for base, _, _ in stages[1:]:  # later stages only build on earlier ones: no builder image, no torch download
        assert base in names, f"{name}: stage FROM {base} is not an earlier stage"
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


def test_cpu_image_is_model_free_by_default_and_bakes_one_on_request() -> None:
    """The default target (the last stage) copies no model; ``--target baked`` copies exactly models/${MODEL}/ and
    serves it by default; ``EXTRAS`` names only extras of pyproject.toml, installed with the dependencies."""
    ins = _instructions(DOCKER / "Dockerfile")
    stages = {n: (base, body) for base, n, body in _stages(ins)}
    last_base, _, last_body = _stages(ins)[-1]
    assert last_base == "runtime" and not [i for i in last_body if i["instruction"] in ("COPY", "ADD", "RUN")]
    copies = lambda body: [i["value"] for i in body if i["instruction"] in ("COPY", "ADD")]  # noqa: E731
    assert not [c for c in copies(stages["runtime"][1]) if "models" in c], "the runtime must not carry a model"
    assert copies(stages["baked"][1]) == ["--chown=app:app models/${MODEL} /models/${MODEL}"]
    assert _env(stages["baked"][1])["EMBED_DEFAULT_MODEL"] == "${MODEL}"
    deps_run = next(i["value"] for i in stages["runtime"][1] if i["instruction"] == "RUN" and "tomllib" in i["value"])
    assert "optional-dependencies" in deps_run and "${EXTRAS}" in deps_run
    assert 'ARG EXTRAS=""' in (DOCKER / "Dockerfile").read_text(), "the default image has no extra"
    scale_args = _compose("docker-compose.scale.yml")["services"]["embed"]["build"]["args"]
    for extra in scale_args["EXTRAS"].split(","):
        assert extra in PYPROJECT["optional-dependencies"], f"EXTRAS={extra} is not an extra of pyproject.toml"


def test_cpu_image_uses_the_cpu_runtime() -> None:
    deps = " ".join(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert "onnxruntime>=" in deps and "onnxruntime-gpu" not in deps
    assert "onnxruntime" not in " ".join(
        i["value"] for i in _instructions(DOCKER / "Dockerfile") if i["instruction"] == "RUN"
    )


def _docker_module(name: str):
    spec = importlib.util.spec_from_file_location(f"docker_{name}", DOCKER / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", DOCKERFILES)
def test_image_runs_as_a_non_root_user(name: str) -> None:
    """The last ``USER`` before the ``CMD`` is the unprivileged ``app`` account the image creates (uid 10001)."""
    ins = _instructions(DOCKER / name)
    users = [i["value"] for i in ins if i["instruction"] == "USER"]
    assert users and users[-1] == "app", f"{name}: runs as {users[-1] if users else 'root'}"
    runs = " ".join(i["value"] for i in ins if i["instruction"] == "RUN")
    assert "useradd --create-home --uid 10001 app" in runs
    last_user = max(k for k, i in enumerate(ins) if i["instruction"] == "USER")
    assert last_user < next(k for k, i in enumerate(ins) if i["instruction"] == "CMD")


def test_gpu_image_is_the_pinned_environment_on_the_python_base() -> None:
    """No CUDA base image: the CPU image's Python base, then exactly docker/requirements-gpu.txt (checked in the
    build: nothing unpinned installed, ``pip check``), the service without dependencies, the default artifact baked."""
    ins = _instructions(DOCKER / "Dockerfile.gpu")
    stages = _stages(ins)
    cpu_base = _stages(_instructions(DOCKER / "Dockerfile"))[0][0]
    assert [base for base, _, _ in stages] == [cpu_base] == ["python:3.11-slim"]
    assert "nvidia/cuda" not in (DOCKER / "Dockerfile.gpu").read_text()
    runs = [i["value"] for i in ins if i["instruction"] == "RUN"]
    installs = [p for r in runs for p in re.findall(r"pip install ([^&]+)", r)]
    assert [p.split() for p in installs] == [
        ["--no-compile", "--no-deps", "-r", "docker/requirements-gpu.txt"],
        ["--no-compile", "--no-deps", "."],
    ], "every package comes from the pinned file; the service itself adds none"
    deps = runs[0]
    assert "python docker/gpu_requirements.py --installed" in deps
    copies = [i["value"] for i in ins if i["instruction"] in ("COPY", "ADD")]
    assert "docker/requirements-gpu.txt" in copies[0].split() and "docker/gpu_requirements.py" in copies[0].split()
    assert copies[-1] == "--chown=app:app models/${MODEL} /models/${MODEL}"
    assert _env(ins)["EMBED_DEFAULT_MODEL"] == "${MODEL}"
    assert "EMBED_PROVIDERS" not in _env(ins), "providers default to auto: CUDA with a GPU, the CPU without"


def _installed_version(name: str) -> str | None:
    """The version of distribution ``name`` installed here, or None."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def test_gpu_requirements_are_the_kits_versions_and_the_cuda_its_build_links() -> None:
    """docker/requirements-gpu.txt is the one source of the GPU versions: the generator's own output, onnxruntime-gpu
    (the kit's ``--ort-gpu`` default) with NVIDIA's wheels of the CUDA and cuDNN majors its CUDA provider links,
    every pyproject dependency pinned within its range, and every wheel the kit carries at the file's version."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from bench.device import kit

    gen = _docker_module("gpu_requirements")
    text = gen.OUT.read_text()
    pins = gen.pins()
    gpu = {"onnxruntime-gpu", *gen.CUDA_WHEELS}
    assert text == gen.render({n: v for n, v in pins.items() if n not in gpu}), "regenerate, never edit by hand"
    assert kit.GPU_REQUIREMENTS == gen.OUT and kit.gpu_pins() == pins
    assert kit.ORT_GPU == pins["onnxruntime-gpu"] == gen.ORT_GPU
    assert "onnxruntime" not in pins and not {"torch", "sentence-transformers", "transformers"} & set(pins)
    ort, cuda, cudnn = _docker_module("check_ort_cuda").pins(text)
    assert ort in ORT_GPU_LINKS, f"onnxruntime-gpu {ort}: run docker/check_ort_cuda.py and record its links here"
    assert ORT_GPU_LINKS[ort] == (cuda, cudnn), f"onnxruntime-gpu {ort} links CUDA/cuDNN {ORT_GPU_LINKS[ort]}"
    majors = {n: pins[n].split(".")[0] for n in gen.CUDA_WHEELS}
    assert majors == {
        "nvidia-cublas": cuda,
        "nvidia-cuda-runtime": cuda,
        "nvidia-curand": "10",
        "nvidia-cudnn-cu13": cudnn,
    }
    for dep in map(Requirement, PYPROJECT["dependencies"]):
        name = "onnxruntime-gpu" if dep.name == "onnxruntime" else canonicalize_name(dep.name)
        assert dep.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} outside {dep.specifier}"
    carried = dict(r.split("==") for r in kit.requirements(kit.ORT_GPU))
    outside = {n for n in carried if canonicalize_name(n) not in pins}
    if outside - set(kit.EXTRA):  # the kit walks this environment's requirements: a fresh install may hold newer ones
        drift = sorted(n for n, v in pins.items() if _installed_version(n) not in (None, v))
        if drift:
            more = sorted(outside - set(kit.EXTRA))
            pytest.skip(
                f"this environment is not the pinned one ({', '.join(drift[:5])} ...): the kit's closure holds {more}"
            )
    assert outside == set(kit.EXTRA), "the kit carries only the encoder package besides the pinned environment"
    assert {n: v for n, v in carried.items() if n not in outside} == {
        n: pins[canonicalize_name(n)] for n in carried if n not in outside
    }


def test_gpu_requirements_are_closed_under_their_requirements() -> None:
    """Every requirement of a pinned distribution (markers for CPython 3.11 and 3.12 on Linux) is pinned too, read
    from the installed metadata wherever this environment holds the pinned version (a newer install is skipped: its
    requirements are not the pinned one's); the GPU image's build checks the same by installing the file."""
    from importlib import metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    gen = _docker_module("gpu_requirements")
    pins = gen.pins()
    linux = {"sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    envs = [
        {**default_environment(), **linux, "python_version": v, "python_full_version": f"{v}.0"}
        for v in ("3.11", "3.12")
    ]
    checked = 0
    for name, version in pins.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        checked += 1
        for req in map(Requirement, dist.requires or []):
            if not req.marker or any(req.marker.evaluate(e) for e in envs):
                dep = gen.PROVIDES.get(canonicalize_name(req.name), canonicalize_name(req.name))
                assert dep in pins, f"{name} requires {req.name}, not pinned"
                assert req.specifier.contains(pins[dep], prereleases=True), f"{name} requires {req}: {pins[dep]}"
    assert checked >= len(pins) // 2, "too few pins installed here to check (make install)"


def _module_level_imports(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` imports at module level (not inside functions), stdlib aside."""
    tree = ast.parse(path.read_text())
    names = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
    return {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"__future__"}


def test_gpu_requirements_hold_every_module_the_service_imports() -> None:
    """Every third-party module ``service/`` imports at module level comes from a pinned distribution (the milvus
    backend's package may use the ``milvus`` extra, installed with ``EXTRAS=milvus``): an import met only by an
    extra such as ``train`` would start here, in the kit's machine and in CI, and fail in the images."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    gen = _docker_module("gpu_requirements")
    pins = gen.pins()
    milvus = {canonicalize_name(Requirement(r).name) for r in PYPROJECT["optional-dependencies"]["milvus"]}
    dists = metadata.packages_distributions()
    for path in sorted((REPO_ROOT / "service").rglob("*.py")):
        allowed = set(pins) | (milvus if "milvus" in path.relative_to(REPO_ROOT).parts else set())
        for module in _module_level_imports(path) - {"service", "artifact_contract"}:
            names = {gen.PROVIDES.get(canonicalize_name(d), canonicalize_name(d)) for d in dists.get(module, [])}
            assert names & allowed, f"{path.relative_to(REPO_ROOT)} imports {module} ({names or 'not installed'})"


def test_compose_is_loopback_and_keyed_by_default() -> None:
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    services = compose["services"]
    embed = services["embed"]
    assert (DOCKER / embed["build"]["context"] / embed["build"]["dockerfile"]).resolve() == (DOCKER / "Dockerfile")
    mounts = {target: (source, mode) for source, target, mode in map(_mount, embed["volumes"])}
    assert set(mounts) == {"/models", "/data"}
    models_src, models_mode = mounts["/models"]
    assert models_mode == "ro" and models_src == "${MODELS_HOST_DIR:-../models}", "the host's models dir, read-only"
    assert (DOCKER / "../models").resolve() == REPO_ROOT / "models", "where `make artifact` exports"
    for source, _ in mounts.values():
        assert not _is_named(source) or source in compose["volumes"], f"named volume {source} not declared"
    fields = set(Settings.model_fields)
    for var in embed["environment"]:
        assert var.startswith("EMBED_") and var[len("EMBED_") :].lower() in fields, f"{var} is not a setting"
    assert embed["environment"]["EMBED_API_KEYS"].startswith("${EMBED_API_KEYS:?"), "a key must be required"
    for port in (*embed["ports"], *services["prometheus"]["ports"], *services["grafana"]["ports"]):
        assert port.startswith(LOOPBACK), f"{port} is not loopback by default"
    assert embed["healthcheck"]["test"] == ["CMD", "python", "-m", "service.healthcheck"]
    prom = services["prometheus"]
    cfg_mount = next(v for v in prom["volumes"] if v.endswith("prometheus.yml:ro"))
    job = yaml.safe_load((DOCKER / cfg_mount.split(":")[0]).read_text())["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    # every replica by DNS (one address, or N with the scale-out override), each scraped on the container port
    sd = job["dns_sd_configs"][0]
    assert (sd["names"], sd["type"], str(sd["port"])) == (["embed"], "A", embed["ports"][0].split(":")[-1])
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


# --- scale-out: docker-compose.scale.yml, nginx, Milvus -------------------------------------------------------------


def _scale() -> tuple[dict, dict]:
    return _compose("docker-compose.yml"), _compose("docker-compose.scale.yml")


def test_scale_override_services_are_health_checked_and_loopback_only() -> None:
    base, scale = _scale()
    for name, svc in scale["services"].items():
        merged = {**base["services"].get(name, {}), **svc}
        assert "healthcheck" in merged or "depends_on" in merged, f"{name}: neither a health check nor depends_on"
        ports = merged.get("ports", [])
        for port in [] if isinstance(ports, dict) else ports:  # {"!reset": []}: no host port
            assert port.startswith(LOOPBACK), f"{name}: {port} is not loopback by default"
        for source, _, _ in map(_mount, merged.get("volumes", [])):
            declared = {**base.get("volumes", {}), **scale.get("volumes", {})}
            assert not _is_named(source) or source in declared, f"{name}: named volume {source} not declared"
    embed = scale["services"]["embed"]
    assert embed["ports"] == {"!reset": []}, "replicas publish no host port (nginx is the way in; --scale needs it)"
    # replicas by default (`mode: replicated`: podman-compose reads the count only then, and its `down` reads no
    # --scale); --scale embed=N still overrides
    assert embed["deploy"] == {"mode": "replicated", "replicas": "${EMBED_REPLICAS:-2}"}
    assert embed["image"] != base["services"]["embed"]["image"], "the milvus-client build must not replace :cpu"
    assert embed["depends_on"]["milvus"]["condition"] == "service_healthy"
    nginx = scale["services"]["nginx"]
    assert nginx["ports"] == ["${EMBED_BIND:-127.0.0.1}:${EMBED_PUBLISH_PORT:-8000}:8080"], "the API's address"
    assert "embed" in nginx["depends_on"]
    assert not scale["services"]["milvus"].get("ports"), "Milvus (no authentication) stays on the stack's network"


def test_scale_replicas_share_milvus_and_follow_published_models() -> None:
    _, scale = _scale()
    env = scale["services"]["embed"]["environment"]
    fields = set(Settings.model_fields)
    for var in env:
        assert var.startswith("EMBED_") and var[len("EMBED_") :].lower() in fields, f"{var} is not a setting"
    s = Settings(**{k[len("EMBED_") :].lower(): v for k, v in env.items() if "${" not in v})
    assert (s.collections_backend, s.model_control, s.replica_header) == ("milvus", "poll", True)
    uri = re.fullmatch(r"http://(\w+):(\d+)", env["EMBED_COLLECTIONS_MILVUS_URI"])
    assert uri and uri.group(1) in scale["services"], "the URI names the Milvus service"
    milvus_ins = _instructions(DOCKER / "Dockerfile.milvus")
    assert uri.group(2) == _env(milvus_ins)["MILVUS_PROXY_PORT"]
    assert uri.group(2) in next(i["value"] for i in milvus_ins if i["instruction"] == "EXPOSE").split()
    assert env["EMBED_COLLECTIONS_MILVUS_TOKEN"] == "${MILVUS_TOKEN:-}", "a token comes from the environment"


def test_milvus_image_matches_its_service_and_the_tested_server() -> None:
    _, scale = _scale()
    svc = scale["services"]["milvus"]
    assert (DOCKER / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == DOCKER / "Dockerfile.milvus"
    ins = _instructions(DOCKER / "Dockerfile.milvus")
    assert len(_stages(ins)) == 1
    version = re.search(
        r"ARG MILVUS_VERSION=(\S+)", " ".join(f"ARG {i['value']}" for i in ins if i["instruction"] == "ARG")
    )
    assert f"milvus=={version.group(1)}" in PYPROJECT["optional-dependencies"]["dev"], "the server the tests run"
    for i in ins:
        if i["instruction"] == "COPY":
            assert (REPO_ROOT / i["value"].split()[0]).exists()
    volume = next(i["value"] for i in ins if i["instruction"] == "VOLUME")
    (source, target, _) = _mount(svc["volumes"][0])
    assert target in volume and source in scale["volumes"]
    script = next(i["value"].split()[1] for i in ins if i["instruction"] == "COPY" and "standalone.py" in i["value"])
    assert svc["healthcheck"]["test"] == ["CMD", "python", script, "check"]
    assert f'"python", "{script}"' in next(i["value"] for i in ins if i["instruction"] == "ENTRYPOINT")
    official = _compose("docker-compose.milvus-official.yml")["services"]["milvus"]
    assert official["image"] == f"milvusdb/milvus:v{version.group(1)}" and official["build"] == {"!reset": None}
    assert (
        official["environment"]["ETCD_USE_EMBED"] == "true" and official["environment"]["COMMON_STORAGETYPE"] == "local"
    )
    assert official["environment"]["PROXY_HTTP_ENABLED"] == "false", "no REST API on the official image either"


def test_milvus_entrypoint_writes_a_config_for_the_real_wheel(tmp_path) -> None:
    """docker/milvus/standalone.py renders the wheel's template: the proxy port given, storage under the data
    directory, logs to stdout only, the container defaults applied and ``--extra-config`` winning over them."""
    spec = importlib.util.spec_from_file_location("milvus_standalone", DOCKER / "milvus" / "standalone.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    port = free_port()
    mod.write_config(tmp_path, port, dict([mod._extra("log.level=error")]))
    cfg = yaml.safe_load((tmp_path / "configs" / "milvus.yaml").read_text())
    assert cfg["proxy"]["port"] == port
    assert cfg["localStorage"]["path"] == str(tmp_path / "data")
    assert cfg["etcd"]["data"]["dir"] == str(tmp_path / "data" / "etcd.data")
    assert not cfg["log"]["file"]["rootPath"] and cfg["log"]["stdout"] is True
    assert cfg["log"]["level"] == "error"  # the override
    assert cfg["common"]["gracefulStopTimeout"] == mod.DEFAULTS["common.gracefulStopTimeout"]
    assert cfg["proxy"]["http"]["enabled"] is False  # no REST API (/api/v1 on 9091 had no authentication)
    assert mod.ENV_DEFAULTS["PROXY_HTTP_ENABLEPPROF"] == "false"
    assert "--logtostderr=true" in (tmp_path / "configs" / "glog.conf").read_text()


NGINX_TEMPLATE = DOCKER / "nginx" / "default.conf.template"
RESOLVER_ENVSH = DOCKER / "nginx" / "15-embed-resolver.envsh"


def _nginx_conf() -> str:
    """The template with the comments stripped (what nginx reads, before the image substitutes variables)."""
    return "\n".join(line.split("#", 1)[0] for line in NGINX_TEMPLATE.read_text().splitlines())


def _nginx_seconds(v: str) -> float:
    return float(v[:-1]) * {"s": 1, "m": 60}[v[-1]] if v[-1] in "sm" else float(v)


def test_nginx_template_balances_every_replica_within_the_service_limits() -> None:
    _, scale = _scale()
    nginx = scale["services"]["nginx"]
    assert re.fullmatch(r"nginx:\d+\.\d+\.\d+", nginx["image"]), "pin an official nginx release"
    assert "./nginx/default.conf.template:/etc/nginx/templates/default.conf.template:ro" in nginx["volumes"]
    assert f"./nginx/{RESOLVER_ENVSH.name}:/docker-entrypoint.d/{RESOLVER_ENVSH.name}:ro" in nginx["volumes"]
    assert os.access(RESOLVER_ENVSH, os.X_OK), "the image's entrypoint sources only executable *.envsh files"
    conf = _nginx_conf()
    assert conf.count("{") == conf.count("}")
    assert set(re.findall(r"\$\{(\w+)\}", conf)) == {"NGINX_DNS_RESOLVER"}, "only variables the entrypoint sets"
    assert re.search(r"^resolver \$\{NGINX_DNS_RESOLVER\} valid=\d+s", conf, re.M)
    assert re.search(r"^\s*listen (\d+);", conf, re.M).group(1) == nginx["ports"][0].rsplit(":", 1)[1]
    # proxy_pass through a variable: resolved at run time, so every replica (and a changed set) is found
    var, target = re.search(r"set \$(\w+) (http://[\w.:-]+);", conf).groups()
    assert re.search(rf"proxy_pass \${var};", conf)
    assert target == "http://embed:" + _env(_instructions(DOCKER / "Dockerfile"))["EMBED_PORT"]
    assert "embed" in scale["services"]
    health = next(a for a in nginx["healthcheck"]["test"] if a.startswith("http://"))
    assert f"location = {health.split(':8080', 1)[1]} " in conf
    s = Settings()
    body = re.search(r"client_max_body_size (\d+)m;", conf)
    assert body and int(body.group(1)) * 2**20 > s.max_payload_bytes, "the service's JSON 413 must answer first"
    read = _nginx_seconds(re.search(r"proxy_read_timeout (\w+);", conf).group(1))
    assert read > s.request_timeout_s, "the service's 503 request_timeout must answer first"
    retry = re.search(r"proxy_next_upstream ([\w ]+);", conf).group(1).split()
    assert "error" in retry and "non_idempotent" not in retry, "fail over, but never send a POST twice"


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed (apt-get install nginx)")
def test_nginx_template_parses(tmp_path) -> None:
    """``nginx -t`` on the template rendered as the image renders it, inside a minimal nginx.conf."""
    (tmp_path / "default.conf").write_text(NGINX_TEMPLATE.read_text().replace("${NGINX_DNS_RESOLVER}", "127.0.0.11"))
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log stderr;\nevents {{}}\nhttp {{\n  include {tmp_path}/default.conf;\n}}\n"
    )
    r = subprocess.run(
        ["nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "syntax is ok" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("resolv", "expected"),
    [
        ("search dns.podman\nnameserver 10.89.0.1\nnameserver 10.255.255.53\n", "10.89.0.1"),  # podman
        ("nameserver 127.0.0.11\noptions ndots:0\n", "127.0.0.11"),  # Docker
        ("# comment\nnameserver fd00::1\nnameserver 10.0.0.2\n", "[fd00::1]"),  # IPv6 in brackets for nginx
    ],
)
def test_resolver_script_picks_the_first_nameserver(tmp_path, resolv: str, expected: str) -> None:
    """The ``.envsh`` the nginx entrypoint sources exports the first ``nameserver`` (the container runtime's DNS),
    one address: nginx would ask a second one (podman lists the host's) in turn and get "not found"."""
    (tmp_path / "resolv.conf").write_text(resolv)
    out = subprocess.run(
        ["sh", "-c", f'. "{RESOLVER_ENVSH}" && printf %s "$NGINX_DNS_RESOLVER"'],
        capture_output=True,
        text=True,
        env={**os.environ, "RESOLV_CONF": str(tmp_path / "resolv.conf")},
    )
    assert out.returncode == 0 and out.stdout == expected, out


def test_replica_header_names_the_host(default_artifact, tmp_path) -> None:
    """With ``EMBED_REPLICA_HEADER=true`` every response (a route, /ready, an error) carries ``X-Replica`` with the
    host's name, which is how the scale-out stack tells replicas apart behind nginx; without it, none does."""
    env = {"EMBED_API_KEYS": "replica-test-key"}
    with run_server(
        default_artifact.parent, workdir=tmp_path / "on", env={**env, "EMBED_REPLICA_HEADER": "true"}
    ) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            ok = c.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer replica-test-key"})
            responses = [ok, c.get("/ready"), c.post("/v1/embeddings", json={"input": "a"})]
    assert [r.status_code for r in responses] == [200, 200, 401]
    assert {r.headers.get("x-replica") for r in responses} == {socket.gethostname()}
    with run_server(default_artifact.parent, workdir=tmp_path / "off", env=env) as srv:
        r = httpx.get(srv.url + "/ready", timeout=60)
    assert r.status_code == 200 and "x-replica" not in r.headers
