"""The torchvision shim (mmrl/patches/torchvision_shim.py) against the installed, pinned versions."""

import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import torch
import pytest

from mmrl.patches.torchvision_shim import FAILURE_MARK, MODULE_NAME, torchvision_needs_shim

SHIM_FILE = Path(sysconfig.get_paths()["purelib"]) / f"{MODULE_NAME}.py"
WITHOUT_SHIM = (
    "import sys\n"
    f"sys.meta_path[:] = [f for f in sys.meta_path if type(f).__module__ != {MODULE_NAME!r}]\n"
    "import torchvision\n"
)


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_torchvision_imports_in_a_fresh_process_of_this_environment():
    """What `make install` promises: no 'torchvision::nms does not exist' anywhere (Ray workers, vLLM)."""
    assert not torchvision_needs_shim()
    probe = run("from torchvision.transforms import v2\nimport torch\n"
                "print(tuple(v2.Resize((4, 6))(torch.zeros(3, 8, 8)).shape))")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "(3, 4, 6)"


@pytest.mark.skipif(not SHIM_FILE.exists(), reason="torchvision's compiled ops load here: no shim installed")
def test_the_shim_is_what_makes_the_import_work():
    """With the shim's import hook removed, this environment's torchvision fails exactly as documented."""
    failed = run(WITHOUT_SHIM)
    assert failed.returncode != 0 and FAILURE_MARK in failed.stderr


def test_the_video_processor_runs_with_the_installed_torchvision(tiny_model_dir):
    """transformers' video processor needs torchvision's transforms: 8 frames of 56x56 -> a (4, 4, 4) grid."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    frames = np.random.default_rng(0).integers(0, 255, size=(8, 56, 56, 3), dtype=np.uint8)
    out = processor.video_processor(videos=[frames], return_tensors="pt")
    assert out["video_grid_thw"].tolist() == [[4, 4, 4]]
    assert out["pixel_values_videos"].shape == (4 * 4 * 4, 3 * 2 * 14 * 14)


def test_a_package_whose_library_cannot_load_is_found_and_this_environment_has_none(tmp_path, monkeypatch):
    from mmrl.patches.broken_packages import CANDIDATES, fails_to_load

    fake = tmp_path / "brokenlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise OSError('Could not load this library: libbroken.so')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert fails_to_load("brokenlib")
    assert not fails_to_load("json")  # loads
    assert not fails_to_load("no_such_package_at_all")  # absent is not broken
    assert not any(fails_to_load(name) for name in CANDIDATES)  # make install removed them where broken


def test_keep_torch_threads_undoes_a_library_that_takes_them():
    import torch

    from mmrl.patches.vllm_threads import keep_torch_threads

    before = torch.get_num_threads()
    with keep_torch_threads():
        torch.set_num_threads(1)
        torch.set_num_threads = lambda n: None  # what vLLM's CPU worker does to the whole process
    assert torch.get_num_threads() == before
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1  # the real function is back
    torch.set_num_threads(before)


@pytest.mark.parametrize("bias", [False, True])
def test_the_patch_embedding_as_a_matrix_product_equals_the_conv3d(bias):
    """Qwen2.5-VL's Conv3d (kernel = stride = the whole patch) against patch_embed.linear_forward: outputs to
    1e-5 and the weight's gradient to 1e-5, on random patches; the patch is installed by load_model."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed

    from mmrl.patches import patch_embed

    torch.manual_seed(0)
    module = Qwen2_5_VisionPatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3, embed_dim=32)
    if bias:
        module.proj.bias = torch.nn.Parameter(torch.randn(32))
    patches = torch.randn(40, 3 * 2 * 14 * 14)
    original = patch_embed.ORIGINAL.get(Qwen2_5_VisionPatchEmbed, Qwen2_5_VisionPatchEmbed.forward)
    results = []
    for forward in (original, patch_embed.linear_forward):
        module.zero_grad()
        out = forward(module, patches)
        out.pow(2).sum().backward()
        results.append((out.detach(), module.proj.weight.grad.clone()))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-4, rtol=1e-5)
    patch_embed.apply()
    assert Qwen2_5_VisionPatchEmbed.forward is patch_embed.linear_forward


def test_transformers_generation_imports_without_sklearn_and_sklearn_still_imports_after():
    """mmrl.patches.lean_imports: `import mmrl.models` leaves scikit-learn unimported, and importable."""
    probe = run("import sys\nimport mmrl.models\n"
                "import transformers.generation.candidate_generator as c\n"
                "print('sklearn' in sys.modules, hasattr(c, 'roc_curve'))\n"
                "import sklearn.metrics\nprint(sklearn.metrics.roc_curve.__name__)")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["False", "False", "roc_curve"]
