"""LoRA (actor.lora): the adapters train and nothing else, the base with the adapters off is the reference, the
merged weights are the plain sum, and checkpoints and the export hold what they should.

The worker-level tests run one hybrid worker in this process (one rank, everything replicated; the sharded
path runs in tests/integration/test_sharding.py).
"""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from PIL import Image
from transformers import AutoModelForImageTextToText

from mmrl.config import ConfigError, load_config
from mmrl.models.encoding import encode_prompt, vision_token_ids
from mmrl.models.forward import PolicyForward
from mmrl.models.loading import load_model, load_processor
from mmrl.models.lora import ADAPTER_DIR, adapters_off, lora_layers, merged_state, target_modules
from mmrl.models.weights import to_hf_names
from mmrl.parallel.sharding import full_state
from mmrl.protocol import Batch
from mmrl.workers.actor import LogProbSpec, batched_logprobs
from mmrl.workers.hybrid import ActorRolloutRefWorker
from mmrl.workers.model_builder import build_model

CPU = torch.device("cpu")
RANK, ALPHA = 4, 8.0


def lora_config(model_dir, *extra):
    return load_config(None, [f"model.path={model_dir}", f"actor.lora.rank={RANK}", f"actor.lora.alpha={ALPHA}",
                              "actor.lr=1e-2", "actor.warmup_steps=0", "actor.num_mini_batches=1",
                              "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1", *extra])


def randomise_b(root: torch.nn.Module, seed: int = 0) -> None:
    """lora_B starts at zero (the adapted model starts as the base): give it values so the adapters matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(root).values():
            weight = layer.lora_B["default"].weight
            weight.copy_(torch.randn(weight.shape, generator=gen) * 0.1)


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    """Two image prompts and one text prompt, two random responses each, with random advantages."""
    processor = load_processor(tiny_model_dir)
    prompts = [encode_prompt(processor, [{"role": "user", "content": "<image>What colour?"}],
                             [Image.new("RGB", (56, 56), c)]) for c in [(255, 0, 0), (0, 0, 255)]]
    prompts.append(encode_prompt(processor, [{"role": "user", "content": "Text only?"}], []))
    gen = torch.Generator().manual_seed(0)
    responses = torch.randint(20, 200, (6, 5), generator=gen)
    mask = torch.ones(6, 5)
    mask[1, 3:] = 0
    return Batch(tensors={"responses": responses, "response_mask": mask,
                          "advantages": torch.randn(6, 1, generator=gen) * mask},
                 objects={"prompt": [p for p in prompts for _ in range(2)]})


@pytest.fixture(scope="module")
def spec(tiny_model_dir):
    processor = load_processor(tiny_model_dir)
    return LogProbSpec(processor.tokenizer.pad_token_id, vision_token_ids(processor), 1.0, 64)


# ---- config and targets --------------------------------------------------------------------------


def test_config_defaults_and_errors_name_the_key():
    cfg = load_config(None, [])
    assert cfg.actor.lora.rank == 0 and not cfg.actor.lora.include_vision  # off by default
    assert cfg.actor.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"]
    with pytest.raises(ConfigError, match="did you mean actor.lora.rank"):
        load_config(None, ["actor.lora.rnak=8"])
    with pytest.raises(ConfigError, match="actor.lora.alpha=0.0 must be > 0"):
        load_config(None, ["actor.lora.alpha=0"])
    with pytest.raises(ConfigError, match="actor.lora.target_modules=.*not a layer name: \\['q proj'\\]"):
        load_config(None, ["actor.lora.rank=8", "actor.lora.target_modules=['q proj']"])
    with pytest.raises(ConfigError, match="actor.lora.target_modules=\\[\\] must name"):
        load_config(None, ["actor.lora.rank=8", "actor.lora.target_modules=[]"])
    with pytest.raises(ConfigError, match="include_vision=true .* actor.vision.freeze=true"):
        load_config(None, ["actor.lora.rank=8", "actor.lora.include_vision=true", "actor.vision.freeze=true"])


def test_targets_are_the_language_models_linear_layers_and_the_vision_towers_only_when_included(tiny_model_dir):
    model = load_model(tiny_model_dir)
    cfg = load_config(None, ["actor.lora.rank=4"]).actor.lora
    llm = target_modules(model, cfg)
    layers = model.config.text_config.num_hidden_layers
    assert len(llm) == 7 * layers and all(".language_model.layers." in name for name in llm)
    # The vision blocks have gate/up/down projections too: they stay out.
    assert not any(".visual." in name for name in llm)
    cfg.include_vision = True
    both = target_modules(model, cfg)
    vision = [n for n, m in model.model.visual.named_modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(both) == sorted(llm + [f"model.visual.{n}" for n in vision])
    cfg.target_modules = ["q_proj", "qkv"]
    with pytest.raises(ValueError, match="actor.lora.target_modules: \\['qkv'\\] match no linear layer.*down_proj"):
        target_modules(model, cfg)


def test_the_lora_actor_trains_only_adapters_seeded_and_starts_as_the_base(tiny_model_dir):
    cfg = lora_config(tiny_model_dir)
    state = torch.get_rng_state()
    actor = build_model(cfg, "lora_actor", str(tiny_model_dir), device=CPU, distributed=False)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random stream is untouched
    names = {n for n, p in actor.root.named_parameters() if p.requires_grad}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert {id(p) for p in actor.trainable()} == {id(p) for p in actor.root.parameters() if p.requires_grad}
    assert not any(p.requires_grad for p in actor.root.core.visual.parameters())
    again = build_model(cfg, "lora_actor", str(tiny_model_dir), device=CPU, distributed=False)
    assert all(torch.equal(p, q) for p, q in zip(actor.root.parameters(), again.root.parameters()))  # every rank
    base = dict(load_model(tiny_model_dir).named_parameters())
    merged = dict(to_hf_names(merged_state(lora_layers(actor.root), full_state(actor.root))))
    assert merged.keys() == base.keys() and all(torch.equal(merged[n], base[n]) for n in base)  # B = 0
    included = lora_config(tiny_model_dir, "actor.lora.include_vision=true")
    with_vision = build_model(included, "lora_actor", str(tiny_model_dir), device=CPU, distributed=False)
    trained = [n for n, p in with_vision.root.core.visual.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n in trained)


# ---- merged weights and the adapters switched off ------------------------------------------------


def test_merged_weights_are_base_plus_scaled_b_times_a(tiny_model_dir):
    actor = build_model(lora_config(tiny_model_dir), "lora_actor", str(tiny_model_dir), device=CPU,
                        distributed=False)
    randomise_b(actor.root)
    base = dict(load_model(tiny_model_dir).named_parameters())
    merged = dict(to_hf_names(merged_state(lora_layers(actor.root), full_state(actor.root))))
    assert merged.keys() == base.keys()
    params = dict(actor.root.named_parameters())
    adapted = 0
    for name, tensor in merged.items():
        layer = f"model.{name.removesuffix('.weight')}"
        if f"{layer}.lora_A.default.weight" not in params:
            assert torch.equal(tensor, base[name]), name  # not adapted (biases of adapted layers included)
            continue
        a, b = params[f"{layer}.lora_A.default.weight"], params[f"{layer}.lora_B.default.weight"]
        expected = base[name].detach().clone()
        for k in range(RANK):  # W + (alpha / r) * sum_k outer(B[:, k], A[k, :])
            expected += (ALPHA / RANK) * torch.outer(b[:, k], a[k, :]).detach()
        assert torch.allclose(tensor, expected, atol=1e-6, rtol=0), name
        assert not torch.equal(tensor, base[name])
        adapted += 1
    assert adapted == len(lora_layers(actor.root))
    assert all(torch.equal(base[n], p) for n, p in to_hf_names(
        (n.replace(".base_layer", ""), p) for n, p in params.items() if ".lora_" not in n))  # never merged in place


def test_with_adapters_off_the_log_probs_are_the_base_models_exactly(tiny_model_dir, batch, spec):
    actor = build_model(lora_config(tiny_model_dir), "lora_actor", str(tiny_model_dir), device=CPU,
                        distributed=False)
    randomise_b(actor.root)
    base, _ = batched_logprobs(PolicyForward(load_model(tiny_model_dir)), batch, spec, CPU, False)
    adapted, _ = batched_logprobs(actor.root, batch, spec, CPU, False)
    with adapters_off(actor.root) as off:
        without, _ = batched_logprobs(off, batch, spec, CPU, False)
    assert torch.equal(without, base)
    assert float((adapted - base).abs().max()) > 1e-3
    again, _ = batched_logprobs(actor.root, batch, spec, CPU, False)
    assert torch.equal(again, adapted)  # switched on again
    assert all(p.requires_grad for n, p in actor.root.named_parameters() if ".lora_" in n)


# ---- the hybrid worker with LoRA -----------------------------------------------------------------


def lora_worker(model_dir, *extra) -> ActorRolloutRefWorker:
    worker = ActorRolloutRefWorker(0, 1, device="cpu")
    worker.init_model(lora_config(model_dir, *extra), str(model_dir))
    return worker


def params(worker: ActorRolloutRefWorker) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in worker.actor.root.named_parameters()}


def test_an_update_moves_only_adapters_and_the_reference_stays_the_base(tiny_model_dir, batch, spec):
    worker = lora_worker(tiny_model_dir)
    assert worker.reference is None  # no second copy of the weights
    before = params(worker)
    ref = worker.compute_ref_log_probs(batch)["ref_log_probs"]
    worker.update_actor(batch.union(Batch(tensors={"ref_log_probs": ref})))
    after = params(worker)
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and all(".lora_" in n for n in moved)
    assert any(".lora_B." in n for n in moved)
    base, _ = batched_logprobs(PolicyForward(load_model(tiny_model_dir)), batch, spec, CPU, False)
    # A separately loaded base: equal up to float rounding (the two passes may take different CPU kernels: 5e-7
    # apart on some machines), far below the update's effect checked next.
    torch.testing.assert_close(worker.compute_ref_log_probs(batch)["ref_log_probs"], base, atol=1e-6, rtol=0)
    policy = worker.compute_log_probs(batch)["old_log_probs"]
    assert float((policy - base).abs().max()) > 1e-4


def test_a_checkpoint_holds_the_adapters_and_resumes_exactly(tiny_model_dir, batch, tmp_path):
    def step(worker):
        ref = worker.compute_ref_log_probs(batch)["ref_log_probs"]
        worker.update_actor(batch.union(Batch(tensors={"ref_log_probs": ref})))

    worker = lora_worker(tiny_model_dir)
    step(worker)
    worker.save_state(str(tmp_path / "lora"))
    step(worker)
    expected = params(worker)
    resumed = lora_worker(tiny_model_dir)
    resumed.load_state(str(tmp_path / "lora"))
    step(resumed)
    assert all(torch.equal(expected[n], p) for n, p in params(resumed).items())

    full = ActorRolloutRefWorker(0, 1, device="cpu")
    full.init_model(lora_config(tiny_model_dir, "actor.lora.rank=0"), str(tiny_model_dir))
    step(full)
    full.save_state(str(tmp_path / "full"))

    def stored(folder: Path) -> dict[str, int]:
        """Elements per tensor of a torch.distributed.checkpoint folder (the optimizer's scalars left out)."""
        metadata = dcp.FileSystemReader(str(folder / "model_optim")).read_metadata().state_dict_metadata
        return {key: math.prod(item.size) for key, item in metadata.items()
                if isinstance(item, TensorStorageMetadata) and len(item.size)}

    lora, everything = stored(tmp_path / "lora"), stored(tmp_path / "full")
    adapters = sum(p.numel() for n, p in worker.actor.root.named_parameters() if ".lora_" in n)
    total = sum(p.numel() for p in full.actor.root.parameters())
    assert all(".lora_" in key for key in lora)
    assert sum(lora.values()) == 3 * adapters  # the adapters and their two Adam moments, nothing of the base
    assert sum(everything.values()) == 3 * total
    assert adapters < 0.05 * total

    def size(folder: Path) -> int:
        return sum(f.stat().st_size for f in (folder / "model_optim").iterdir())

    # On disk too (here the per-tensor metadata of the small adapters weighs more than their values).
    assert size(tmp_path / "lora") < 0.5 * size(tmp_path / "full")


def test_the_export_writes_a_merged_model_and_the_adapters(tiny_model_dir, batch, spec, tmp_path):
    from peft import PeftModel

    worker = lora_worker(tiny_model_dir)
    randomise_b(worker.actor.root)
    lora, _ = batched_logprobs(worker.actor.root, batch, spec, CPU, False)
    path = Path(worker.save_checkpoint(str(tmp_path / "checkpoint")))
    assert not (path / "adapter_config.json").exists()  # the Auto classes load the merged model as it is
    merged = AutoModelForImageTextToText.from_pretrained(path)
    logp, _ = batched_logprobs(PolicyForward(merged), batch, spec, CPU, False)
    assert torch.allclose(logp, lora, atol=1e-5, rtol=0), float((logp - lora).abs().max())
    assert not any(".lora_" in n or ".base_layer" in n for n, _ in merged.named_parameters())
    adapted = PeftModel.from_pretrained(load_model(tiny_model_dir), str(path / ADAPTER_DIR))
    logp, _ = batched_logprobs(PolicyForward(adapted.base_model.model), batch, spec, CPU, False)
    assert torch.allclose(logp, lora, atol=1e-6, rtol=0)


def test_the_engine_samples_the_trained_policy_from_merged_weights(tiny_model_dir, batch, spec):
    """The hf engine of a replicated LoRA actor does not run on the actor's module: it receives the merged weights
    (new tensors for the adapted layers, the actor's own for the rest: no copy), and samples the policy."""
    from mmrl.rollout.base import SamplingParams
    from mmrl.rollout.samples import sample_encoded

    worker = lora_worker(tiny_model_dir)
    engine = worker.engine()
    assert engine.owns_weights and not any(".lora_" in n for n, _ in engine.model.named_parameters())
    randomise_b(worker.actor.root)
    worker.version += 1
    assert worker.sync_weights() == 1
    merged = dict(worker.hf_weights())
    actor = {n.removeprefix("model."): p for n, p in worker.actor.root.named_parameters()}
    for name, param in engine.model.named_parameters():
        assert torch.equal(param, merged[name]), name
        if name in actor:  # not adapted: the actor's tensor itself
            assert param.data_ptr() == actor[name].data_ptr(), name
    prompts = batch["prompt"][::2]
    out = sample_encoded(engine, prompts, SamplingParams(n=2, max_new_tokens=5), worker.version, with_prompts=True)
    logp = worker.compute_log_probs(out)["old_log_probs"]
    assert float(((logp - out["rollout_log_probs"]).abs() * out["response_mask"]).max()) < 1e-4


def test_a_lora_checkpoint_resumes_only_over_its_base_and_rank(tmp_path):
    from mmrl.trainer.checkpoint import check_resumable

    folder = tmp_path / "step_3"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"step": 3, "init": str(tmp_path / "sft"), "lora_rank": 8}))
    cfg = load_config(None, ["actor.lora.rank=8"])
    check_resumable(folder, cfg, str(tmp_path / "sft"))
    with pytest.raises(ValueError, match=f"adapters over {tmp_path / 'sft'}, not over trainer.init=.*other"):
        check_resumable(folder, cfg, str(tmp_path / "other"))
    with pytest.raises(ValueError, match="saved with actor.lora.rank=8, this run has actor.lora.rank=0"):
        check_resumable(folder, load_config(None, []), str(tmp_path / "sft"))
    (folder / "meta.json").write_text(json.dumps({"step": 3, "init": "x"}))  # saved before LoRA existed
    check_resumable(folder, load_config(None, []), str(tmp_path / "sft"))
