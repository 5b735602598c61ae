"""A trained policy as an MLflow model: the Hugging Face checkpoint folder inside a pyfunc model.

``mlflow.pyfunc.load_model("models:/<model id>")`` (or ``runs:/<run id>/policy``) loads it back; ``predict`` takes
prompts (a list of dicts or a DataFrame with ``prompt``, the text with ``<image>`` placeholders, and ``images``, PNG
bytes or paths; optional ``system`` and ``max_new_tokens``, default 32) and returns one greedy answer each.
"""

from __future__ import annotations

import io
from typing import Any

import mlflow.pyfunc
import torch
from PIL import Image

CHECKPOINT = "checkpoint"
"""The artifact key of the Hugging Face folder."""


class PolicyModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context: Any) -> None:
        from mmrl.models.loading import load_model, load_processor
        from mmrl.rollout.hf import HFRolloutEngine

        path = context.artifacts[CHECKPOINT]
        self.processor = load_processor(path)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.engine = HFRolloutEngine(load_model(path, device=device).eval(), self.processor, device)

    def predict(self, context, model_input, params=None):  # noqa: ANN001 (MLflow reads type hints as a schema)
        """Prompts -> one greedy answer (str) each."""
        from mmrl.models.encoding import encode_prompt
        from mmrl.rollout.base import SamplingParams

        rows = model_input.to_dict("records") if hasattr(model_input, "to_dict") else list(model_input)
        prompts = []
        for i, row in enumerate(rows):
            messages = [{"role": "user", "content": row["prompt"]}]
            if row.get("system"):
                messages.insert(0, {"role": "system", "content": row["system"]})
            images = [_image(item) for item in row.get("images") or []]
            prompts.append(encode_prompt(self.processor, messages, images, name=f"input {i}"))
        answers = []
        for prompt, row in zip(prompts, rows):  # each its own length; greedy answers do not depend on the batch
            tokens = int(row.get("max_new_tokens") or 32)
            answers += self.engine.generate([prompt], SamplingParams(n=1, greedy=True, max_new_tokens=tokens)).texts
        return answers


def _image(item: Any) -> Image.Image:
    if isinstance(item, (bytes, bytearray)):
        return Image.open(io.BytesIO(item)).convert("RGB")
    if isinstance(item, Image.Image):
        return item.convert("RGB")
    return Image.open(item).convert("RGB")


def log_policy(checkpoint: str, register_as: str = "") -> Any:
    """Log ``checkpoint`` (a Hugging Face folder) as the active run's ``policy`` model, registered as
    ``register_as`` when given; returns MLflow's ModelInfo."""
    return mlflow.pyfunc.log_model(
        name="policy", python_model=PolicyModel(), artifacts={CHECKPOINT: checkpoint},
        pip_requirements=["torch", "transformers", "pillow"],  # mmrl's own environment loads it back
        registered_model_name=register_as or None,
    )
