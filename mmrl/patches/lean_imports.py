"""Keep scikit-learn out of ``import transformers``.

Why: transformers' assisted-decoding module (``transformers.generation.candidate_generator``) imports
``sklearn.metrics`` at import time whenever scikit-learn is installed (mlflow depends on it, so it is). That
import is about a fifth of the CPU time of a worker's start (2-3 of about 10 CPU-seconds on this machine's
cores), paid by every Ray rank and the driver, for one function (``roc_curve``) that only assisted generation
with a tuned confidence threshold calls, which mmrl never runs.

What: :func:`import_generation_without_sklearn` imports that module while ``sklearn`` is marked unimportable,
then lifts the mark, so that a later ``import sklearn`` (a user's plugin, mlflow's sklearn flavour) works as
usual. Where the module was imported already, it does nothing.
"""

from __future__ import annotations

import importlib
import sys

GENERATION_MODULE = "transformers.generation.candidate_generator"


def import_generation_without_sklearn() -> None:
    """Import transformers' generation utilities without importing scikit-learn."""
    if GENERATION_MODULE in sys.modules or "sklearn" in sys.modules:
        return
    sys.modules["sklearn"] = None  # find_spec() then reports it missing; transformers skips the import
    try:
        importlib.import_module(GENERATION_MODULE)
    finally:
        if sys.modules.get("sklearn", 0) is None:
            del sys.modules["sklearn"]
