"""``python -m training train [--config FILE] [--key value ...]``: run a training job.

Every field of :class:`training.config.TrainSettings` can be set in the YAML file, with an
``EMBED_TRAIN_*`` environment variable, or with a dotted CLI flag (highest precedence), e.g.::

    python -m training train --config configs/simcse_3r.yaml --max_steps 200 --three_r.c_init 0.2

``--print-config`` prints the resolved settings and exits.

``--publish DIR`` (e.g. ``--publish models/``) exports the trained model as the next version of
``artifact_name`` in ``DIR`` (``DIR/<artifact_name>/<max existing numeric version + 1>/``, unless
``--artifact_version`` is given); a running service activates it with
``POST /admin/models/<artifact_name>/activate``, or by itself with ``--model-control poll``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from training.config import load_settings, parse_overrides

USAGE = (
    "usage: python -m training train [--config FILE] [--publish MODELS_DIR] [--print-config] "
    "[--<field>[.<sub>] VALUE ...]"
)


def next_version(models_dir: str | Path, name: str) -> str:
    """One more than the largest numeric version directory in ``models_dir/name/`` ("1" when there is none)."""
    d = Path(models_dir) / name
    nums = [int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit()] if d.is_dir() else []
    return str(max(nums, default=0) + 1)


def main(argv: list[str]) -> int:
    """Parse ``argv``, train, export; returns the exit status (2 on a usage/config error)."""
    argv = list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print(USAGE)
        return 0
    config = None
    publish = None
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
        elif a == "--publish" or a.startswith("--publish="):
            if a == "--publish" and i + 1 >= len(argv):
                print("--publish needs a models directory\n" + USAGE, file=sys.stderr)
                return 2
            publish = argv[i + 1] if a == "--publish" else a.split("=", 1)[1]
            i += 2 if a == "--publish" else 1
        elif a == "--print-config":
            show = True
            i += 1
        else:
            rest.append(a)
            i += 1
    try:
        overrides = parse_overrides(rest)
        if publish is not None:
            overrides.update(models_dir=str(publish), export=True)
        cfg = load_settings(config, overrides)
    except (ValueError, FileNotFoundError) as e:
        print(f"config error: {e}\n{USAGE}", file=sys.stderr)
        return 2
    if publish is not None and "artifact_version" not in overrides:
        cfg.artifact_version = next_version(publish, cfg.artifact_name)
    if show:
        print(json.dumps(cfg.recipe(), indent=2))
        return 0
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from training.trainer import train

    results = train(cfg)
    print(json.dumps({k: v for k, v in results.items() if k != "scores"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
