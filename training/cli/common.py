"""The one shape of every ``python -m training <command>`` command line.

A command is a module with ``main(argv: list[str] | None = None) -> int`` made by :func:`command`: argparse
parses (``--help`` prints the module docstring and the options, and returns 0), a usage error prints argparse's
message and returns 2, as does a configuration error. Commands driven by a settings object (``train``,
``pretrain``) share :func:`settings_parser` / :func:`load_cli_settings`: ``--config FILE``, ``--print-config`` and
dotted overrides (``--lr 5e-5 --three_r.enabled true``) that take precedence over ``EMBED_*`` variables and the
YAML file.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

from training.config import load_settings, parse_overrides


class ConfigError(Exception):
    """Bad command-line settings (unknown key, bad value, missing file); the message says which."""


def command(fn: Callable[[list[str]], int | None]) -> Callable[[list[str] | None], int]:
    """Wrap ``fn(argv)`` into a ``main``: ``argv`` defaults to ``sys.argv[1:]``; argparse's exits (``--help``: 0,
    usage error: 2) and :class:`ConfigError` (2, message on stderr) become return values."""

    @functools.wraps(fn)
    def main(argv: list[str] | None = None) -> int:
        try:
            return int(fn(list(sys.argv[1:] if argv is None else argv)) or 0)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
        except ConfigError as e:
            print(f"config error: {e}", file=sys.stderr)
            return 2

    return main


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """An argument parser for ``python -m training <name>`` whose help shows the command module's docstring."""
    return argparse.ArgumentParser(
        prog=f"python -m training {name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )


def settings_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """:func:`parser` with ``--config`` and ``--print-config``; other ``--key value`` pairs are overrides."""
    p = parser(name, doc)
    p.add_argument("--config", help="YAML settings file")
    p.add_argument("--print-config", action="store_true", help="print the resolved settings and exit")
    return p


def load_cli_settings(config: str | None, rest: list[str], settings_cls=None, extra: dict[str, Any] | None = None):
    """Settings from ``config``, the environment, the dotted overrides in ``rest`` and ``extra`` (highest).

    Raises:
        ConfigError: a malformed override, a missing file, or a value the settings reject.
    """
    try:
        overrides = parse_overrides(rest)
        overrides.update(extra or {})
        return load_settings(config, overrides, settings_cls)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from e


def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON (non-JSON values through ``str``)."""
    print(json.dumps(obj, indent=2, default=str))
