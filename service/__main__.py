"""``python -m service``: start the embedding service with uvicorn.

Every :class:`~service.settings.Settings` field has a flag (``max_batch_tokens`` →
``--max-batch-tokens``); flags override ``EMBED_*`` environment variables, which
override defaults. List settings take comma-separated values
(``--api-keys k1,k2``, ``--providers CPUExecutionProvider``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from service.settings import Settings


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
    """Parse settings and serve until SIGINT/SIGTERM."""
    import uvicorn

    from service.app import create_app
    from service.http.protocol import protocol_class

    settings = settings_from_args(argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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


def draining_server(config, app, drain_s: float):
    """A ``uvicorn.Server`` with a drain window: on the first SIGTERM, ``/ready`` answers 503 ``draining`` for
    ``drain_s`` seconds while every request is still served (a load balancer stops routing here), then uvicorn's
    graceful shutdown starts (no new connections; in-flight requests finish within ``graceful_timeout_s``).
    SIGINT, or a second SIGTERM, shuts down at once."""
    import signal

    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if sig == signal.SIGTERM and drain_s > 0 and not app.state.draining and not self.should_exit:
                app.state.draining = True
                logging.getLogger("service").info("SIGTERM: draining for %.1f s, then shutting down", drain_s)
                asyncio.get_running_loop().call_later(drain_s, super().handle_exit, sig, frame)
                return
            super().handle_exit(sig, frame)

    return _Server(config)


if __name__ == "__main__":
    main()
