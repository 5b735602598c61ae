"""Model loading, the model families and their table, the media forms, the one multimodal encoding path, the
tiny-model factory."""

from mmrl.patches.lean_imports import import_generation_without_sklearn

import_generation_without_sklearn()  # before any transformers model import: a worker's start, 2-3 CPU-s less
