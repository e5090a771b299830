"""``python -m service.healthcheck``: exit 0 when the service on this host answers ``/ready`` with 200, else 1.

For container health checks (Docker ``HEALTHCHECK``, Compose ``healthcheck``): the address comes from the same
settings as the server (``EMBED_HOST``/``EMBED_PORT`` or ``--host``/``--port``), so changing the port in the
environment moves the check with it. A wildcard bind address (``0.0.0.0``, ``::``) is probed on loopback.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

from service.__main__ import settings_from_args


def main(argv: Sequence[str] | None = None) -> int:
    """Probe ``/ready`` once (2 s timeout); returns the exit status."""
    s = settings_from_args(argv)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(s.host, s.host)
    url = f"http://{f'[{host}]' if ':' in host else host}:{s.port}/ready"
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return 0 if r.status == 200 else 1
    except (urllib.error.URLError, OSError) as e:
        print(f"{url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
