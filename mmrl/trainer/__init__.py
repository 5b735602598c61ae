"""Drivers: the RL loop, SFT, evaluation."""
