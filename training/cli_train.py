"""``python -m training train [--config FILE] [--key value ...]``: run a training job.

Every field of :class:`training.config.TrainSettings` can be set in the YAML file, with an
``EMBED_TRAIN_*`` environment variable, or with a dotted CLI flag (highest precedence), e.g.::

    python -m training train --config configs/simcse_3r.yaml --max_steps 200 --three_r.c_init 0.2

``--print-config`` prints the resolved settings and exits.
"""

from __future__ import annotations

import json
import sys

from training.config import load_settings, parse_overrides

USAGE = "usage: python -m training train [--config FILE] [--print-config] [--<field>[.<sub>] VALUE ...]"


def main(argv: list[str]) -> int:
    """Parse ``argv``, train, export; returns the exit status (2 on a usage/config error)."""
    argv = list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print(USAGE)
        return 0
    config = None
    show = False
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--config":
            if i + 1 >= len(argv):
                print("--config needs a file\n" + USAGE, file=sys.stderr)
                return 2
            config = argv[i + 1]
            i += 2
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
            i += 1
        elif a == "--print-config":
            show = True
            i += 1
        else:
            rest.append(a)
            i += 1
    try:
        cfg = load_settings(config, parse_overrides(rest))
    except (ValueError, FileNotFoundError) as e:
        print(f"config error: {e}\n{USAGE}", file=sys.stderr)
        return 2
    if show:
        print(json.dumps(cfg.recipe(), indent=2))
        return 0
    from training.trainer import train

    results = train(cfg)
    print(json.dumps({k: v for k, v in results.items() if k != "scores"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
