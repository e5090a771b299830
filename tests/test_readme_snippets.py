"""README.md's ``<!-- ci-run: NAME -->`` Python blocks, taken from README.md as they are and run against a real
service: LlamaIndex's TEI reranker class (``llama-index-postprocessor-tei-rerank``), unchanged, reranking a dense
retrieval over SciFact abstracts made through the service's own ``/v1`` and ``/qdrant``, with the session's tiny
reranker served beside the default encoder."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import REPO_ROOT, run_server

pytestmark = pytest.mark.timeout(300)

RUN_MARK = re.compile(r"<!-- ci-run: ([^>]+?) -->\n```python\n(.*?)\n```", re.S)


def readme_blocks() -> dict[str, str]:
    """``{name: code}`` of every ``<!-- ci-run: NAME -->`` block of README.md."""
    return dict(RUN_MARK.findall((REPO_ROOT / "README.md").read_text()))


@pytest.fixture(scope="module")
def server(default_artifact: Path, reranker_artifact: Path, tmp_path_factory):
    assert default_artifact.parent == reranker_artifact.parent
    args = ["--default-model", default_artifact.name, "--rerank-models", reranker_artifact.name]
    args += ["--intra-op-threads", "1", "--log-level", "warning"]
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("readme-rag"), args=args) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture(scope="module")
def scifact():
    """A SciFact train claim, its judged abstracts, and 40 abstracts to retrieve from."""
    from training.data.scifact import load_scifact

    data = load_scifact(max_queries=3, max_corpus=40, seed=7)
    q = sorted(data.qrels)[0]
    return data.queries[q], [data.corpus[d] for d in sorted(data.qrels[q])], list(data.corpus.values())


def test_the_readme_has_the_block() -> None:
    assert "LlamaIndex reranker" in readme_blocks(), sorted(readme_blocks())


def test_llamaindex_tei_reranker_reranks_a_retrieval_through_the_service(server, scifact) -> None:
    pytest.importorskip(
        "llama_index.postprocessor.tei_rerank",
        reason="llama-index-postprocessor-tei-rerank is not installed (pyproject's dev extras bring it)",
    )
    claim, judged, abstracts = scifact
    namespace = {"url": server.url, "claim": claim, "abstracts": abstracts}
    exec(compile(readme_blocks()["LlamaIndex reranker"], "README.md: LlamaIndex reranker", "exec"), namespace)
    retrieved, reranked = namespace["retrieved"], namespace["reranked"]
    texts = [n.node.get_content() for n in retrieved]
    assert len(texts) == 10 and set(judged) & set(texts), "the first stage retrieves a judged abstract"
    # the service's own TEI /rerank on the same 10 passages: the class kept its order and scores, top 3
    r = httpx.post(f"{server.url}/rerank", json={"query": claim, "texts": texts}, timeout=60)
    assert r.status_code == 200, r.text
    direct = [(texts[x["index"]], x["score"]) for x in r.json()][:3]
    got = [(n.node.get_content(), n.score) for n in reranked]
    assert [t for t, _ in got] == [t for t, _ in direct]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in direct], atol=1e-6)
    assert [t for t, _ in got] != texts[:3]  # not the first stage's top 3 as it was: reranked
    assert httpx.delete(f"{server.url}/collections/scifact", timeout=60).status_code == 200
