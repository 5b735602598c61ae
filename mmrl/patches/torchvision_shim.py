"""Let the pure-Python parts of a CUDA torchvision wheel import beside a CPU torch.

Why: every torchvision wheel on PyPI for Linux x86_64 is a CUDA build. Beside ``torch==2.13.0+cpu``
its compiled ops fail to load and ``import torchvision`` raises
``RuntimeError: operator torchvision::nms does not exist`` (its Python code registers fake kernels for
ops whose schemas only the missing C++ library defines). transformers' video processor,
qwen_vl_utils and vLLM's Qwen2.5-VL model file only need torchvision's pure-Python transforms.

What: define the two op schemas that torchvision's import touches (``nms`` and ``qnms``), before
torchvision is first imported. ``torchvision.ops`` and its C image decoders still do not work.

How it is activated: ``python -m mmrl.patches.torchvision_shim`` (run by ``make install``) checks in a
subprocess whether torchvision imports as it is; only when it fails with the error above does it write
a tiny module and a ``.pth`` file into site-packages. The ``.pth`` puts an import hook on
``sys.meta_path`` that applies the schemas the first time ``torchvision`` is imported, in every process
of the environment (Ray workers and vLLM's spawned engine core included), and costs nothing otherwise.
A GPU install, where torchvision loads, gets nothing.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

MODULE_NAME = "_mmrl_torchvision_shim"

# The module written into site-packages. Standard library only at import time: it runs at the start of
# every Python process in the environment.
SHIM_SOURCE = '''\
"""Written by mmrl (mmrl/patches/torchvision_shim.py): defines torchvision's op schemas for a CPU torch."""
import importlib.abc
import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def define_schemas():
    import torch

    for name, schema in _SCHEMAS.items():
        try:
            torch.ops.torchvision.__getattr__(name)
        except (AttributeError, RuntimeError):
            lib = torch.library.Library("torchvision", "FRAGMENT")
            lib.define(schema)
            _LIBS.append(lib)  # a Library object must stay alive for its definitions to stay


_LIBS = []


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            define_schemas()
        return None


sys.meta_path.insert(0, _Hook())
'''

FAILURE_MARK = "torchvision::nms does not exist"


def torchvision_needs_shim(python: str = sys.executable) -> bool:
    """True when ``import torchvision`` fails in a fresh interpreter with the missing-op error."""
    probe = subprocess.run([python, "-c", "import torchvision"], capture_output=True, text=True)
    return probe.returncode != 0 and FAILURE_MARK in probe.stderr


def install(site_packages: Path | None = None) -> bool:
    """Write the shim module and its ``.pth`` into site-packages when torchvision needs it.

    Returns True when the shim is (now) installed.
    """
    site = Path(site_packages or sysconfig.get_paths()["purelib"])
    module_file, pth_file = site / f"{MODULE_NAME}.py", site / f"{MODULE_NAME}.pth"
    if module_file.exists():
        return True
    if not torchvision_needs_shim():
        return False
    module_file.write_text(SHIM_SOURCE)
    pth_file.write_text(f"import {MODULE_NAME}\n")
    if torchvision_needs_shim():
        raise RuntimeError(
            f"torchvision still fails to import after writing {module_file}; "
            "install a torchvision build that matches torch instead"
        )
    return True


if __name__ == "__main__":
    active = install()
    print(f"torchvision shim: {'installed' if active else 'not needed'}")
