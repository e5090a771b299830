"""``python -m training pretrain [--config FILE] [--print-config] [--<field>[.<sub>] VALUE ...]``.

Masked-LM pretraining of a BERT encoder (see :mod:`training.pretrain`). Every field of
:class:`training.pretrain.config.PretrainSettings` can be set in the YAML file, with an ``EMBED_PRETRAIN_*``
environment variable, or with a dotted flag, e.g.::

    python -m training pretrain --config configs/pretrain_raw_small.yaml --max_steps 100 --arch.layers 2

A run resumes from ``<output_dir>/checkpoint.pt``; a finished run (same config) is skipped.
"""

from __future__ import annotations

import argparse
import json
import sys

from training.config import load_settings, parse_overrides
from training.pretrain.config import PretrainSettings


def main(argv: list[str]) -> int:
    """Parse ``argv``, pretrain, print the recipe record; returns the exit status (2 on a config error)."""
    parser = argparse.ArgumentParser(prog="python -m training pretrain", description=__doc__.split("\n\n")[1])
    parser.add_argument("--config", help="YAML file")
    parser.add_argument("--print-config", action="store_true", help="print the resolved settings and exit")
    args, rest = parser.parse_known_args(argv)
    try:
        cfg = load_settings(args.config, parse_overrides(rest), PretrainSettings)
    except (ValueError, FileNotFoundError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(cfg.recipe(), indent=2))
        return 0
    from training.pretrain.loop import Pretrainer

    print(json.dumps(Pretrainer(cfg).run(), indent=2))
    return 0
