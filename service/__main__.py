"""``python -m service``: start the embedding service with uvicorn.

Every :class:`~service.settings.Settings` field has a flag (``max_batch_tokens`` →
``--max-batch-tokens``); flags override ``EMBED_*`` environment variables, which
override defaults. List settings take comma-separated values
(``--api-keys k1,k2``, ``--providers CPUExecutionProvider``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from service.settings import Settings
from service.supervisor import draining_server, supervise


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one ``--kebab-case`` flag per settings field (all optional)."""
    p = argparse.ArgumentParser(prog="python -m service", description="Sentence-embedding service (ONNX Runtime).")
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = ",".join(default)
        p.add_argument(
            flag,
            dest=name,
            default=None,
            metavar=name.upper(),
            help=f"{field.description or ''} (env EMBED_{name.upper()}; default {default!r})",
        )
    return p


def settings_from_args(argv: Sequence[str] | None = None) -> Settings:
    """Settings from env + defaults, overridden by the flags present in ``argv``.

    Raises:
        SystemExit: an invalid flag or value (argparse-style message).
    """
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        return Settings(**overrides)
    except Exception as e:  # pydantic ValidationError: print it like argparse would
        print(f"python -m service: invalid settings: {e}", file=sys.stderr)
        raise SystemExit(2) from e


def main(argv: Sequence[str] | None = None) -> None:
    """Parse settings and serve until SIGINT/SIGTERM: one process, or with ``api_workers`` > 1 (0: by the device) a
    supervisor of a core process and that many front processes (``service.supervisor``)."""
    settings = settings_from_args(argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.api_workers == 0:  # by the device (Settings.api_workers)
        from service.device_defaults import gpu_api_workers
        from service.inference.providers import runs_on_gpu

        settings = settings.model_copy(
            update={"api_workers": gpu_api_workers() if runs_on_gpu(settings.providers) else 1}
        )
    if settings.api_workers > 1:  # a core and api_workers front processes on one port (service.supervisor)
        raise SystemExit(supervise(settings))
    import uvicorn

    from service.app import create_app
    from service.http.protocol import protocol_class

    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=settings.graceful_timeout_s,
        http=protocol_class(),  # the HTTP parser's own 400s in the JSON envelope (service.http.protocol)
    )
    draining_server(config, app, settings.drain_s).run()


if __name__ == "__main__":
    main()
