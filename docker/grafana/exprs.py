"""The PromQL expressions of a provisioned Grafana dashboard, ready to send to Prometheus.

Grafana's built-in range variables are replaced by fixed durations (:data:`GRAFANA_VARS`), so the
expressions parse as plain PromQL (``tests/test_grafana_dashboard.py``) and run against Prometheus'
``/api/v1/query`` (``docker/smoke.sh``).

Usage: ``python docker/grafana/exprs.py [dashboard.json]`` prints one JSON object per target:
``{"panel": title, "ref": refId, "expr": PromQL, "legend": legendFormat}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent / "dashboards" / "embed.json"
#: Grafana variables and the durations they stand for here (Prometheus scrapes every 15 s)
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that is not a row, rows' nested panels (collapsed rows) included."""
    out = []
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            out.extend(panels(p))
        else:
            out.append(p)
    return out


def expressions(dashboard: dict[str, Any]) -> list[dict[str, str]]:
    """``{panel, ref, expr, legend}`` for every target of every panel, Grafana variables replaced."""
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            expr = t["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append({"panel": p["title"], "ref": t["refId"], "expr": expr, "legend": t.get("legendFormat", "")})
    return out


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DASHBOARD
    for e in expressions(json.loads(path.read_text())):
        print(json.dumps(e))
