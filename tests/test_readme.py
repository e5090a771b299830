"""README.md stays true: its first two commands, CI calling the test one (last, and nothing else that tests), and
every setting documented."""

from __future__ import annotations

import re

from service.settings import Settings
from tests.server_utils import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def test_first_commands_and_ci() -> None:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands[:2] == ["make serve", "make test"]
    ci = [
        line.strip()
        for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))
    ]
    # CI may prepare the machine (chromium for the console test), then runs exactly the README's test command
    assert ci[-1] == "make test", ci
    assert [line for line in ci if re.search(r"\b(make|pytest|ruff)\b", line)] == ["make test"], ci
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^serve:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_every_setting_is_documented() -> None:
    for name, field in Settings.model_fields.items():
        row = re.search(rf"^\| `{name}` \| `([^`]*)` \|", README, re.M)
        assert row, f"setting {name} missing from README's settings table"
        default = field.get_default(call_default_factory=True)
        default = ",".join(default) or "(empty)" if isinstance(default, list) else str(default)
        assert row.group(1) == default, f"README says {name}={row.group(1)}, code says {default}"


def test_client_snippets_are_the_ones_the_tests_run() -> None:
    """Every snippet of README's "Use it from your client" is, verbatim, a ``# --- snippet`` block of the client
    tests, and every such block is in README."""
    import textwrap

    tests = (REPO_ROOT / "tests" / "service" / "http" / "qdrant" / "test_qdrant_clients.py").read_text()
    ran = {
        m.group(1): textwrap.dedent(m.group(2)).strip("\n")
        for m in re.finditer(r"# --- snippet: ([^\n]+)\n(.*?)\n\s*# --- end snippet", tests, re.S)
    }
    shown = dict(re.findall(r"<!-- snippet: ([^>]+?) -->\n```python\n(.*?)\n```", README, re.S))
    assert set(ran) == set(shown) and len(ran) >= 5, (sorted(ran), sorted(shown))
    for name, code in ran.items():
        assert shown[name] == code, (
            f"README's {name} snippet differs from the one tests/service/http/qdrant/test_qdrant_clients.py runs"
        )
