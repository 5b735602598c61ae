"""Patches to third-party packages, each in one documented module, tested against the pinned versions
(tests/unit/test_patches.py)."""
