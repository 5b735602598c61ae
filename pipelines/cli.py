"""The shared command line of every stage: ``--config FILE`` then ``section.key=value`` overrides."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from mmrl.config import Config, ConfigError, load_config


def parse(description: str, argv: list[str] | None = None) -> Config:
    """Parse the stage's arguments into a validated Config; a config error exits with its message."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default=os.environ.get("MMRL_CONFIG", "configs/demo.yaml"),
                        help="YAML config (default: configs/demo.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8 actor.lr=1e-4")
    args = parser.parse_args(argv)
    quiet_third_party()
    try:
        return load_config(args.config or None, args.overrides)
    except ConfigError as err:
        sys.exit(f"config error: {err}")


def quiet_third_party() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in ("mlflow", "alembic", "urllib3", "httpx", "transformers", "datasets"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
