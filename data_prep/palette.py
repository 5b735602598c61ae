"""The colours and backgrounds every synthetic task draws with (one definition, shared by image and video
tasks). Far apart in RGB, and far from every background grey, so a pixel's colour is never ambiguous."""

from __future__ import annotations

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 210, 20),
    "purple": (130, 40, 170),
    "orange": (250, 130, 10),
}
BACKGROUND_RANGE = (200, 240)  # light grey levels
