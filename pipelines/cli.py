"""The shared command line of every stage: ``--config FILE`` then ``section.key=value`` overrides."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from dataclasses import dataclass

from mmrl.config import Config, ConfigError
from mmrl.run_config import load_run_config


@dataclass(frozen=True)
class Command:
    """What the command line asked for: a YAML config (empty: the defaults) and the user's overrides."""

    config: str
    overrides: tuple[str, ...]

    def load(self, *stage_overrides: str) -> Config:
        """The run's config (:func:`mmrl.run_config.load_run_config`): the YAML, the user's overrides, then the
        stage's own, which win. A stage that changes the user's config does it here, never by editing a
        loaded one (whose derived values would keep the old keys'). A config error exits with its message."""
        try:
            return load_run_config(self.config or None, [*self.overrides, *stage_overrides])
        except ConfigError as err:
            sys.exit(f"config error: {err}")


def parse_command(description: str, argv: list[str] | None = None) -> Command:
    """Parse the stage's arguments (nothing is loaded yet)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default="configs/demo.yaml", help="YAML config (default: configs/demo.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.n=8 actor.lr=1e-4")
    args = parser.parse_args(argv)
    quiet_third_party()
    return Command(args.config, tuple(args.overrides))


def parse(description: str, argv: list[str] | None = None) -> Config:
    """Parse the stage's arguments into a checked, resolved Config; a config error exits with its message."""
    return parse_command(description, argv).load()


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
