"""qdrant-client's own congruence tests against this service's ``/qdrant``: each test drives a real Qdrant server
(here: this service) and qdrant-client's in-memory local mode (the oracle) with the same calls and compares the
answers. Fixtures and assertions run as written; only the transport is redirected: a ``sitecustomize`` module makes
httpx send qdrant-client's ``http://localhost:6333/...`` requests to ``http://127.0.0.1:<port>/qdrant/...`` of a
fresh service (embedded backend, the default artifact); its gRPC channels to ``localhost:6334``
(``prefer_grpc=True``) go to the service's Qdrant gRPC port (``qdrant_grpc_port``).

The tests come from a qdrant-client git checkout (``--repo``, a bare repository is fine: ``git archive`` of
``--ref``), run by the installed qdrant-client; prints passed/failed/errored per module and the failures grouped by
their first error line.

    python -m bench.compat.qdrant_congruence --repo /work/.mirror/qdrant+qdrant-client/repo --ref master \\
        --json data/bench/qdrant_congruence.json

``--python`` runs the tests with another interpreter's qdrant-client (the service keeps its own): the checkout's
tests assert some of the client's local-mode behaviour (which error a NaN raises), so they agree only with the client
version they were written for (``python -m venv /tmp/qc118 && /tmp/qc118/bin/pip install qdrant-client==1.18.0
pytest``, then ``--python /tmp/qc118/bin/python`` for master at 1.18.0).

Not a CI test: it needs qdrant-client's repository (``fetch github:qdrant/qdrant-client``) and takes minutes.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.lib import REPO
from bench.lib.machine import cpu_model, write_json
from bench.lib.server import free_port, run_server

MODULES = ("test_sparse_search", "test_sparse_idf_search", "test_sparse_updates", "test_sparse_recommend",
           "test_search", "test_query", "test_query_batch", "test_retrieve", "test_updates", "test_delete_points",
           "test_count", "test_has_vector", "test_aliases", "test_collections", "test_optional_vectors",
           "test_modify_named_vector", "test_scroll", "test_payload", "test_recommendation", "test_group_search",
           "test_facet", "test_info", "test_uuids", "test_nested_filter", "test_discovery", "test_sparse_discovery",
           "test_search_distance_matrix", "test_multivector_search_queries")  # fmt: skip

SITECUSTOMIZE = """
import os
import httpx

_TARGET = os.environ["CONGRUENCE_TARGET"]  # http://127.0.0.1:<port>/qdrant
_orig = httpx.HTTPTransport.handle_request
_orig_async = httpx.AsyncHTTPTransport.handle_async_request


def _rewrite(request):
    url = request.url
    if url.host in ("localhost", "127.0.0.1") and url.port == 6333:
        target = httpx.URL(_TARGET)
        request.url = url.copy_with(scheme=target.scheme, host=target.host, port=target.port,
                                    raw_path=(target.raw_path.rstrip(b"/") + url.raw_path))
        request.headers["host"] = f"{target.host}:{target.port}"


def handle_request(self, request):
    _rewrite(request)
    return _orig(self, request)


async def handle_async_request(self, request):
    _rewrite(request)
    return await _orig_async(self, request)


httpx.HTTPTransport.handle_request = handle_request
httpx.AsyncHTTPTransport.handle_async_request = handle_async_request

import grpc  # qdrant-client's gRPC channels to localhost:6334 go to the service's gRPC port

_GRPC = os.environ["CONGRUENCE_GRPC_TARGET"]  # 127.0.0.1:<port>


def _redirect(make):
    def channel(target, *args, **kwargs):
        if target in ("localhost:6334", "127.0.0.1:6334"):
            target = _GRPC
        return make(target, *args, **kwargs)
    return channel


grpc.insecure_channel = _redirect(grpc.insecure_channel)
grpc.aio.insecure_channel = _redirect(grpc.aio.insecure_channel)
"""


def extract_tests(repo: str, ref: str, dest: Path) -> Path:
    """``tests/`` of qdrant-client at ``ref`` under ``dest`` (``git archive``); returns ``dest``."""
    tar = dest / "tests.tar"
    with open(tar, "wb") as f:
        subprocess.run(["git", f"--git-dir={repo}", "archive", ref, "tests"], stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    return dest


def cause(message: str) -> str:
    """A failure's first error line with numbers, ids and quoted names blanked, to group alike failures."""
    line = next((x for x in message.splitlines() if x.strip()), "")[:200]
    line = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", line)
    return re.sub(r"\d+(\.\d+)?", "N", line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default="/work/.mirror/qdrant+qdrant-client/repo", help="qdrant-client git repository")
    ap.add_argument("--ref", default="master")
    ap.add_argument("--modules", default=",".join(MODULES), help="congruence test modules, comma-separated")
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds for the whole pytest run")
    ap.add_argument("--show", type=int, default=0, help="print this many failures' messages in full")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter that runs the tests, with its qdrant-client (default: this one); e.g. a "
                    "virtual environment holding the client version of the --ref checkout")  # fmt: skip
    a = ap.parse_args(argv)
    version = subprocess.run([a.python, "-c", "import importlib.metadata as m; print(m.version('qdrant-client'))"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    print(f"qdrant-client {version} ({a.python}), tests from {a.repo} @ {a.ref}; CPU: {cpu_model()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = extract_tests(a.repo, a.ref, Path(tmp))
        (Path(tmp) / "site").mkdir()
        (Path(tmp) / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        grpc_port = free_port()
        env = {"EMBED_QDRANT_GRPC_PORT": str(grpc_port)}
        with run_server(Path(a.models_dir), workdir=Path(tmp) / "service", env=env) as server:
            files = [f"tests/congruence_tests/{m}.py" for m in a.modules.split(",")]
            files = [f for f in files if (root / f).exists()]
            env = {**os.environ, "CONGRUENCE_TARGET": f"{server.url}/qdrant",
                   "CONGRUENCE_GRPC_TARGET": f"127.0.0.1:{grpc_port}",
                   "PYTHONPATH": os.pathsep.join([str(Path(tmp) / "site"), str(root)])}  # fmt: skip
            junit = Path(tmp) / "junit.xml"
            cmd = [a.python, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                   "-p", "no:xdist", "--continue-on-collection-errors", f"--junitxml={junit}", "-o", "addopts=",
                   "--rootdir", str(root)]  # fmt: skip
            try:
                subprocess.run(cmd, cwd=root, env=env, timeout=a.timeout, capture_output=True)
            except subprocess.TimeoutExpired:
                print("pytest timed out: the results below are partial", flush=True)
            cases = ET.parse(junit).getroot().iter("testcase") if junit.exists() else []
            per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
            causes: collections.Counter = collections.Counter()
            for tc in cases:
                mod = tc.get("classname", "").split(".")[-1] or tc.get("file", "?")
                bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
                if tc.find("skipped") is not None:
                    per[mod]["skipped"] += 1
                elif bad is not None:
                    per[mod]["failed" if bad.tag == "failure" else "errored"] += 1
                    causes[cause(bad.get("message") or bad.text or "")] += 1
                    if a.show > 0:
                        a.show -= 1
                        print(f"--- {mod}::{tc.get('name')}\n{(bad.text or '')[-1500:]}\n", flush=True)
                else:
                    per[mod]["passed"] += 1
    rows = [
        {"module": m, **{k: c[k] for k in ("passed", "failed", "errored", "skipped")}} for m, c in sorted(per.items())
    ]
    total = collections.Counter()
    for r in rows:
        total.update({k: r[k] for k in ("passed", "failed", "errored", "skipped")})
    print("\n| module | passed | failed | errored | skipped |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['module']} | {r['passed']} | {r['failed']} | {r['errored']} | {r['skipped']} |")
    print(f"| **all** | {total['passed']} | {total['failed']} | {total['errored']} | {total['skipped']} |")
    print("\n| failures | cause (first error line) |\n|---:|---|")
    for c, n in causes.most_common(40):
        print(f"| {n} | {c} |")
    write_json(a.json, rows + [{"cause": c, "n": n} for c, n in causes.most_common()])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
