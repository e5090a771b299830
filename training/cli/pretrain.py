"""``python -m training pretrain [--config FILE] [--print-config] [--<field>[.<sub>] VALUE ...]``.

Masked-LM pretraining of a BERT encoder (see :mod:`training.pretrain`). Every field of
:class:`training.pretrain.config.PretrainSettings` can be set in the YAML file, with an ``EMBED_PRETRAIN_*``
environment variable, or with a dotted flag, e.g.::

    python -m training pretrain --config configs/pretrain_raw_small.yaml --max_steps 100 --arch.layers 2

A run resumes from ``<output_dir>/checkpoint.pt``; a finished run (same config) is skipped.
"""

from __future__ import annotations

from training.cli.common import command, load_cli_settings, print_json, settings_parser
from training.pretrain.config import PretrainSettings


@command
def main(argv: list[str]) -> int:
    """Parse ``argv``, pretrain, print the recipe record; returns the exit status (2 on a config error)."""
    args, rest = settings_parser("pretrain", __doc__).parse_known_args(argv)
    cfg = load_cli_settings(args.config, rest, PretrainSettings)
    if args.print_config:
        print_json(cfg.recipe())
        return 0
    from training.pretrain.loop import Pretrainer

    print_json(Pretrainer(cfg).run())
    return 0
