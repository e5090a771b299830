"""Free TCP ports on this host's loopback."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port of ``127.0.0.1`` that nothing listened on a moment ago."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]
