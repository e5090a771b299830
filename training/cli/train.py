"""``python -m training train [--config FILE] [--publish MODELS_DIR] [--print-config] [--<field>[.<sub>] VALUE ...]``.

Runs a training job. Every field of :class:`training.config.TrainSettings` can be set in the YAML file, with an
``EMBED_TRAIN_*`` environment variable, or with a dotted flag (highest precedence), e.g.::

    python -m training train --config configs/simcse_3r.yaml --max_steps 200 --three_r.c_init 0.2

``--print-config`` prints the resolved settings and exits.

``--publish DIR`` (e.g. ``--publish models/``) exports the trained model as the next version of
``artifact_name`` in ``DIR`` (``DIR/<artifact_name>/<max existing numeric version + 1>/``, unless
``--artifact_version`` is given); a running service activates it with
``POST /admin/models/<artifact_name>/activate``, or by itself with ``--model-control poll``.
"""

from __future__ import annotations

import logging

from training.cli.common import command, load_cli_settings, print_json, settings_parser
from training.config import parse_overrides


@command
def main(argv: list[str]) -> int:
    """Parse ``argv``, train, export; returns the exit status (2 on a usage/config error)."""
    p = settings_parser("train", __doc__)
    p.add_argument("--publish", metavar="MODELS_DIR", help="export as the next version of artifact_name there")
    args, rest = p.parse_known_args(argv)
    publish = {"models_dir": str(args.publish), "export": True} if args.publish else {}
    cfg = load_cli_settings(args.config, rest, extra=publish)
    if args.publish and "artifact_version" not in parse_overrides(rest):
        from training.publishing import next_version

        cfg.artifact_version = next_version(args.publish, cfg.artifact_name)
    if args.print_config:
        print_json(cfg.recipe())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from training.trainer import train

    results = train(cfg)
    print_json({k: v for k, v in results.items() if k != "scores"})
    return 0
