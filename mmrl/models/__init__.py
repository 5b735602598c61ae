"""Model loading, the tiny-model factory and the one multimodal encoding path."""

from mmrl.patches.lean_imports import import_generation_without_sklearn

import_generation_without_sklearn()  # before any transformers model import: a worker's start, 2-3 CPU-s less
