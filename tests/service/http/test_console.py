"""The web console at ``/console/`` in a real headless browser (Debian's chromium driven by Playwright) against the
real service with a collection of STS-B sentences.

Checked as a person would: the page loads with no console error and no failed request, shows the active model and
the collection; a search for an STS-B sentence finds it first with score ~1, its payload shown; the similarity tester
shows the API's cosine for an STS-B pair; the activate button asks for an admin key, refuses a wrong one, activates
a new version with the right one, and the collection's re-embedding shows up and completes. With API keys on, the
page itself loads without a key and the API calls work once the key is entered. Screenshots
(``console-*.png``) go to a temporary directory, or to ``$EMBED_CONSOLE_SHOTS`` (the README's come from
``EMBED_CONSOLE_SHOTS=docs/img pytest tests/service/http/test_console.py``).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.artifact_utils import NAME, versioned_copy
from tests.server_utils import REPO_ROOT, run_server
from training.data.sts import load_stsb

pytestmark = pytest.mark.timeout(600)

CHROMIUM = os.environ.get("EMBED_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and Path("/usr/bin/chromium").exists():
    CHROMIUM = "/usr/bin/chromium"
if CHROMIUM is None:
    pytest.skip(
        "chromium not found (apt-get install chromium, or set EMBED_TEST_CHROMIUM): the console browser test needs it",
        allow_module_level=True,
    )

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402  (after the skip: dev extra)

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]  # fmt: skip
ADMIN_KEY = "console-admin-key"
USER_KEY = "console-user-key"
N = 400


@pytest.fixture(scope="module")
def stsb():
    test = load_stsb("test")
    return test, list(dict.fromkeys(test.sent1 + test.sent2))[:N]


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the screenshots go."""
    d = Path(os.environ.get("EMBED_CONSOLE_SHOTS") or tmp_path_factory.mktemp("console-shots"))
    d = d if d.is_absolute() else REPO_ROOT / d
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def served(default_artifact, tmp_path_factory, stsb):
    """The service (admin key only: the API is open) with collection ``stsb``: N STS-B test sentences, flat."""
    root = tmp_path_factory.mktemp("console")
    models = root / "models"
    versioned_copy(default_artifact, models, NAME, "1")
    args = ["--default-model", NAME, "--admin-api-keys", ADMIN_KEY, "--log-level", "warning"]
    _, sentences = stsb
    with run_server(models, workdir=root, args=args) as srv, httpx.Client(base_url=srv.url, timeout=120) as c:
        assert c.put("/collections/stsb", json={"index": "flat"}).status_code == 200
        for i in range(0, N, 200):
            pts = [
                {"id": j, "text": sentences[j], "payload": {"row": j, "split": "test"}}
                for j in range(i, min(N, i + 200))
            ]
            assert c.put("/collections/stsb/points", json={"points": pts}).status_code == 200
        yield {"url": srv.url, "client": c, "models": models, "artifact": default_artifact}


def open_console(browser, url: str) -> tuple[Page, list[str]]:
    """A new page on the console; returns it and the list its console errors, page errors and failures go to."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"requestfailed: {r.url} {r.failure}"))
    page.goto(f"{url}/console/")
    return page, problems


def test_console_shows_models_and_collections_without_errors(browser, served, shots) -> None:
    page, problems = open_console(browser, served["url"])
    expect(page.locator("#ready")).to_have_text("ready")
    expect(page.locator("#active-model")).to_have_text(f"{NAME}:1")
    expect(page.locator("#active-detail")).to_contain_text("384 dims")
    row = page.locator("#collections tbody tr", has_text="stsb")
    expect(row).to_contain_text("flat")
    expect(row.locator("td").nth(3)).to_have_text(str(N))
    expect(page.locator("#search-collection")).to_have_value("stsb")
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.locator("#refresh").click()
    page.wait_for_load_state("networkidle")
    assert requests and all(u.startswith(served["url"]) for u in requests), requests  # nothing from elsewhere
    page.screenshot(path=str(shots / "console-overview.png"), full_page=True)
    assert problems == []
    page.close()


def test_search_finds_the_sentence_with_its_payload(browser, served, stsb, shots) -> None:
    _, sentences = stsb
    query = sentences[123]
    page, problems = open_console(browser, served["url"])
    expect(page.locator("#search-collection")).to_have_value("stsb")
    page.fill("#search-query", query)
    page.fill("#search-k", "5")
    page.click("#search-form button[type=submit]")
    hits = page.locator("#hits tbody tr")
    expect(hits).to_have_count(5)
    first = hits.nth(0)
    expect(first.locator("td.text")).to_have_text(query)
    assert float(first.locator("td.score").inner_text()) >= 0.999
    expect(first).to_contain_text('"row":123')
    scores = [float(s) for s in page.locator("#hits td.score").all_inner_texts()]
    assert scores == sorted(scores, reverse=True)
    # the same hits as the API itself answers
    api = served["client"].post("/collections/stsb/search", json={"query": query, "top_k": 5}).json()
    assert [str(h["id"]) for h in api] == [hits.nth(i).locator("td").nth(1).inner_text() for i in range(5)]
    page.screenshot(path=str(shots / "console-search.png"), full_page=True)
    assert problems == []
    page.close()


def test_similarity_tester_shows_the_cosine(browser, served, stsb, shots) -> None:
    test, _ = stsb
    i = int(test.scores.argmax())  # an STS-B pair rated most similar
    a, b = test.sent1[i], test.sent2[i]
    want = served["client"].post("/similarity", json={"pairs": [[a, b]]}).json()["scores"][0]
    page, problems = open_console(browser, served["url"])
    page.fill("#sim-a", a)
    page.fill("#sim-b", b)
    page.click("#similarity-form button[type=submit]")
    expect(page.locator("#sim-result")).to_be_visible()
    assert abs(float(page.locator("#sim-score").inner_text()) - want) < 1e-4
    assert want > 0.5
    page.screenshot(path=str(shots / "console-similarity.png"), full_page=True)
    assert problems == []
    page.close()


def test_activate_asks_for_an_admin_key_and_swaps_the_model(browser, served, shots) -> None:
    versioned_copy(served["artifact"], served["models"], NAME, "2")
    assert served["client"].post("/admin/models/reload", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).is_success
    page, problems = open_console(browser, served["url"])
    button = page.locator(f'#models button[data-model="{NAME}"][data-version="2"]')
    expect(button).to_be_enabled()
    button.click()
    dialog = page.locator("#activate-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#activate-target")).to_have_text(f"{NAME}:2")
    page.fill("#admin-key", "not-the-key")
    page.click("#activate-confirm")
    expect(page.locator("#activate-error")).to_contain_text("401")
    page.screenshot(path=str(shots / "console-activate.png"), full_page=True)
    page.fill("#admin-key", ADMIN_KEY)
    page.click("#activate-confirm")
    # the dialog closes once /admin answers: after the model is loaded, warmed up and canary-checked (seconds, more
    # beside the rest of a parallel suite than playwright's 5 s default wait)
    expect(dialog).to_be_hidden(timeout=60_000)
    expect(page.locator("#active-model")).to_have_text(f"{NAME}:2")
    row = page.locator("#collections tbody tr", has_text="stsb")
    expect(row).to_contain_text(f"→ {NAME}:2")
    deadline = time.monotonic() + 180
    while "completed" not in row.inner_text():
        assert time.monotonic() < deadline, row.inner_text()
        page.locator("#refresh").click()
        page.wait_for_timeout(500)
    expect(row).to_contain_text(f"{N}/{N}")
    page.screenshot(path=str(shots / "console-reembedded.png"), full_page=True)
    # the wrong key's 401 is the one expected resource error
    assert [p for p in problems if "401" not in p] == []
    page.close()


def test_console_with_api_keys_loads_then_asks_for_the_key(browser, default_artifact, tmp_path) -> None:
    args = ["--api-keys", USER_KEY, "--log-level", "warning"]
    with run_server(default_artifact.parent, workdir=tmp_path, args=args) as srv:
        page, problems = open_console(browser, srv.url)  # the page itself needs no key
        expect(page.locator("#message")).to_contain_text("401")
        expect(page.locator("#message")).to_contain_text("API key")
        page.fill("#api-key", USER_KEY)
        page.locator("#api-key").dispatch_event("change")
        expect(page.locator("#active-model")).to_have_text(f"{default_artifact.name}:1")
        expect(page.locator("#message")).to_be_hidden()
        assert [p for p in problems if "401" not in p] == []
        page.close()
        assert httpx.get(f"{srv.url}/console/console.js").status_code == 200
        assert httpx.post(f"{srv.url}/console/x", json={}).status_code == 401  # only reads are open
