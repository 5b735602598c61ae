"""How an evaluation's episodes used their tools: calls per episode, the share of episodes that called one, and,
on rows that record where to look (the zoom task's ``extra``: ``shape_box`` inside ``cell_box``, stored
pixels), the share of region calls (``zoom_in``, ``crop``) that looked at the right place
(:func:`mmrl.agent.regions.region_hit`)."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image

from mmrl.agent.regions import call_region, region_hit

REGION_TOOLS = ("zoom_in", "crop")


@dataclass
class ToolUse:
    """Counts over the episodes :meth:`add` saw."""

    episodes: int = 0
    calling: int = 0
    calls: int = 0
    region_calls: int = 0
    """Region calls on rows with a ground truth of where to look."""
    region_hits: int = 0

    def add(self, row: Mapping[str, Any], episode: Mapping[str, Any]) -> None:
        """One data row (its ``images`` as bytes, its ``extra`` as JSON) and its episode's record
        (:func:`mmrl.agent.rollout.episode_record`)."""
        self.episodes += 1
        self.calls += len(episode["calls"])
        self.calling += bool(episode["calls"])
        extra = json.loads(row.get("extra") or "{}")
        if "shape_box" not in extra or "cell_box" not in extra:
            return
        for call in episode["calls"]:
            if call["name"] in REGION_TOOLS and "arguments" in call:
                self.region_calls += 1
                self.region_hits += _hits(call["arguments"], row["images"], episode["model_image_sizes"], extra)

    def metrics(self, prefix: str) -> dict[str, float]:
        """``<prefix>/tool_calls_per_episode``, ``<prefix>/episodes_with_calls`` and, where region calls had a
        ground truth, ``<prefix>/region_hits`` (their share that held the target)."""
        out = {f"{prefix}/tool_calls_per_episode": self.calls / max(self.episodes, 1),
               f"{prefix}/episodes_with_calls": self.calling / max(self.episodes, 1)}
        if self.region_calls:
            out[f"{prefix}/region_hits"] = self.region_hits / self.region_calls
        return out


def _hits(arguments: Mapping[str, Any], images: list[bytes], seen: list[list[int]], extra: Mapping[str, Any]) -> bool:
    """Whether a region call held the target: the ground truth is on the row's first image, which the call
    must name (``image`` 0, the default)."""
    bbox = arguments.get("bbox_2d")
    if arguments.get("image", 0) != 0 or not images or not seen or not isinstance(bbox, list) or len(bbox) != 4:
        return False
    with Image.open(io.BytesIO(images[0])) as image:
        size = image.size
    try:
        region = call_region(bbox, tuple(seen[0]), size)
    except TypeError:  # a non-number in the box (call_region already answers None for a box the tools refuse)
        region = None
    return region_hit(region, tuple(extra["shape_box"]), tuple(extra["cell_box"]))
