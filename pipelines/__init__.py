"""Runnable stages, one module each; the Makefile calls ``python -m pipelines.<stage>``."""
