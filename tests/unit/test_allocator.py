"""The CPU workers' allocator settings (mmrl.memory.allocator): a block allocated and freed again and again is
faulted in once, not every time; they reach the workers on a CPU only."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from mmrl.config import ResourcesConfig
from mmrl.controller.session import WORKER_ENV, worker_env
from mmrl.memory.allocator import ALLOCATOR_ENV, allocator_env

# 20 times: a 48 MB block (over glibc's largest mmap threshold) allocated, written and freed; prints the minor
# page faults those 20 cycles cost.
CYCLES = """
import resource
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
bytearray(48 << 20)  # the first touch is paid either way
start = faults()
for _ in range(20):
    block = bytearray(48 << 20)
    del block
print(faults() - start)
"""


def page_faults(env: dict[str, str]) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", CYCLES], env=clean | env, capture_output=True, text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")
def test_a_freed_large_block_is_reused_without_faulting_its_pages_in_again():
    pages = (48 << 20) // os.sysconf("SC_PAGE_SIZE")
    default, kept = page_faults({}), page_faults(ALLOCATOR_ENV)
    assert default > 10 * pages  # glibc's defaults: mmap'd, unmapped on free, faulted in again each cycle
    assert kept < pages  # kept in the heap: reused, no page faulted in again


def test_the_workers_get_the_settings_on_a_cpu_only():
    assert allocator_env("cuda") == {} and allocator_env("cpu") == ALLOCATOR_ENV
    assert worker_env(ResourcesConfig(device="cpu")) == WORKER_ENV | ALLOCATOR_ENV
    auto = worker_env(ResourcesConfig(device="auto"))
    assert auto == (WORKER_ENV if torch.cuda.is_available() else WORKER_ENV | ALLOCATOR_ENV)
