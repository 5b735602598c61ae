"""LoRA adapters on a vision-language model, through peft: injection, switching them off, merged weights, export.

The adapters are injected into the Hugging Face model in place (``peft.inject_adapter_in_model``), so the
module tree keeps its shape: the vision tower and the decoder layers stay where the family's groups declare
them (:mod:`mmrl.models.families.groups`), and each adapted ``nn.Linear`` becomes a peft ``lora.Linear`` holding
the frozen layer as ``base_layer`` and the trained ``lora_A`` (r, in) and ``lora_B`` (out, r). Its output is
``base(x) + scaling * B(A(dropout(x)))``, ``scaling = alpha / r``.

Three views of one adapted model:

- trained: the adapters on (the actor's forward and update);
- base: the adapters off (:func:`adapters_off`): exactly the frozen checkpoint, the KL reference;
- merged: ``W + scaling * B @ A`` per adapted layer, under the base model's own parameter names
  (:func:`merged_state`), computed one layer at a time into new tensors: what a rollout engine loads and the
  Hugging Face export writes. The trained model is never merged in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor

from mmrl.config import LoRAConfig
from mmrl.models.families import family_of
from mmrl.models.forward import core_model

ADAPTER = "default"  # peft's adapter name: one adapter per model
BASE = ".base_layer"
LORA_PARTS = (f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight")
ADAPTER_PREFIX = "base_model.model."  # the key prefix of peft's adapter files (a PeftModel around the HF model)
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_DIR = "adapter"  # the adapter folder inside a Hugging Face export of a LoRA policy


def target_modules(model: nn.Module, cfg: LoRAConfig) -> list[str]:
    """The full names (in ``model``) of the linear layers that get adapters: those of the language model whose
    name ends with one of ``cfg.target_modules``, and with ``include_vision`` every linear layer of the vision
    tower. Raises ValueError naming ``actor.lora.target_modules`` when a name matches no linear layer."""
    core = core_model(model)
    family = family_of(core.config)
    layers = family.decoder_layers(core)
    llm = {id(m) for layer in layers for m in layer.modules()}
    vision = {id(m) for m in family.vision(core).modules()} if cfg.include_vision else set()
    chosen, used = [], set()
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        hits = {t for t in cfg.target_modules if name == t or name.endswith("." + t)} if id(module) in llm else set()
        used |= hits
        if hits or id(module) in vision:
            chosen.append(name)
    unused = [t for t in cfg.target_modules if t not in used]
    if unused:
        names = sorted({n.rsplit(".", 1)[-1] for layer in layers for n, m in layer.named_modules()
                        if isinstance(m, nn.Linear)})
        raise ValueError(f"actor.lora.target_modules: {unused} match no linear layer of the language model; "
                         f"its linear layers are named {', '.join(names)}")
    return chosen


def peft_config(cfg: LoRAConfig, layers: list[str]) -> LoraConfig:
    """peft's LoraConfig for ``cfg`` on the linear layers named (in full) ``layers``."""
    return LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=layers, bias="none")


def apply_lora(model: nn.Module, cfg: LoRAConfig, seed: int) -> nn.Module:
    """Inject adapters into ``model`` in place and freeze everything else; returns ``model``.

    ``lora_A`` is initialised from ``seed`` (every rank builds the same adapters; the caller's random state is
    left as it was) and ``lora_B`` is zero, so the adapted model starts equal to the base.
    """
    config = peft_config(cfg, target_modules(model, cfg))
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    # The embeddings' outputs (the LLM's and the vision tower's) require grad, as with trained embeddings. FSDP2
    # reduces a unit's gradients when the gradient of its input is computed, or at the end of the backward when
    # its input needs none. With frozen embeddings, whether the first decoder layer's input needs a gradient would
    # depend on whether the rank's micro-batch holds images (their features carry the vision adapters'), so
    # ranks would reduce in different orders and hang.
    model.enable_input_require_grads()
    return model


def export_config(model: nn.Module, cfg: LoRAConfig) -> LoraConfig:
    """peft's LoraConfig of the adapters injected into the Hugging Face ``model``."""
    return peft_config(cfg, sorted(lora_layers(model)))


def lora_layers(module: nn.Module) -> dict[str, LoraLayer]:
    """The adapted layers of ``module`` by name (empty for a model without LoRA)."""
    return {name: m for name, m in module.named_modules() if isinstance(m, LoraLayer)}


def has_lora(module: nn.Module) -> bool:
    return any(isinstance(m, LoraLayer) for m in module.modules())


@contextmanager
def adapters_off(module: nn.Module) -> Iterator[nn.Module]:
    """Within the block ``module`` computes with its adapters switched off (its outputs are the base model's,
    bit for bit); they are switched on again after it, trainable as before."""
    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    if not layers:
        raise ValueError(f"{type(module).__name__} has no adapters to switch off")
    # peft's switch also clears the adapters' requires_grad; they are kept, since FSDP2 reads them once, at the
    # first forward (which may be this one).
    flags = [(param, param.requires_grad) for layer in layers for param in layer.parameters()]
    for layer in layers:
        layer.enable_adapters(False)
    for param, flag in flags:
        param.requires_grad_(flag)
    try:
        yield module
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for param, flag in flags:
            param.requires_grad_(flag)


def merged_state(
    layers: dict[str, LoraLayer], named_tensors: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of a module holding the adapted ``layers`` (by name in that module) -> (base name,
    merged tensor), lazily: an adapted layer's ``<layer>.base_layer.weight`` (out, in) and its ``lora_A`` (r, in)
    and ``lora_B`` (out, r) become one ``<layer>.weight = W + scaling * B @ A`` (a new tensor, computed in
    float32, in W's dtype); its bias becomes ``<layer>.bias``; other tensors pass as they are.

    The three parts of a layer are held until all have arrived (one layer's worth at a time), so the input may
    be a stream of gathered shards that every rank iterates in step.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        owner, part = _split(name, layers)
        if owner is None:
            yield name, tensor
            continue
        if part == ".bias":
            yield owner + part, tensor
            continue
        parts = pending.setdefault(owner, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[owner]
            yield owner + ".weight", _merge(layers[owner], parts)
    assert not pending, f"adapted layers with missing parts: {sorted(pending)}"


def _split(name: str, layers: dict[str, LoraLayer]) -> tuple[str | None, str]:
    """'<layer>.base_layer.weight' -> ('<layer>', 'weight'); lora parts -> ('<layer>', 'A' | 'B'); a bias ->
    ('<layer>', '.bias'); any other name -> (None, '')."""
    for kind, suffix in zip("AB", LORA_PARTS):
        if name.endswith(suffix):
            return name[: -len(suffix)], kind
    for part, key in ((".weight", "weight"), (".bias", ".bias")):
        if name.endswith(BASE + part):
            return name[: -len(BASE + part)], key
    if ".lora_" in name:
        raise ValueError(f"{name}: only plain LoRA (lora_A, lora_B) adapters can be merged")
    return None, ""


def _merge(layer: LoraLayer, parts: dict[str, torch.Tensor]) -> torch.Tensor:
    weight, a, b = parts["weight"], parts["A"], parts["B"]
    delta = layer.scaling[ADAPTER] * (b.float() @ a.float())
    return (weight.float() + delta).to(weight.dtype)


def adapter_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of each adapter parameter of ``module``, one at a time (a sharded one is all-gathered:
    every rank iterates in step)."""
    for name, param in module.named_parameters():
        if ".lora_" in name:
            yield name, (param.full_tensor() if isinstance(param, DTensor) else param).detach()


def adapter_state(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The adapters among (Hugging Face-model name, tensor) pairs, keyed as peft's adapter files key them
    (``base_model.model.<layer>.lora_A.weight``), on the CPU."""
    state = {}
    for name, tensor in named_tensors:
        for suffix in LORA_PARTS:
            if name.endswith(suffix):
                key = ADAPTER_PREFIX + name[: -len(suffix)] + suffix.replace(f".{ADAPTER}", "")
                state[key] = tensor.detach().cpu().contiguous()
    return state


def save_adapters(folder: str | Path, state: dict[str, torch.Tensor], config: LoraConfig, base: str) -> Path:
    """Write a peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) that
    ``PeftModel.from_pretrained(<the model at base>, folder)`` loads."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    config = LoraConfig(**{**config.to_dict(), "base_model_name_or_path": str(base)})
    config.save_pretrained(str(path))
    save_file(state, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return path
