"""Split names: which of an input's splits becomes which of mmrl's split files.

mmrl reads ``<data.dir>/<split>.parquet``: ``sft`` (SFT), ``train`` (RL), ``val`` (RL's and SFT's validation) and
``test`` (``make eval``). A ``datasets`` DatasetDict usually holds ``train`` / ``validation`` / ``test``, and other
tools name the validation split ``valid`` or ``dev``: those names are read as ``val``. Converting a DatasetDict
without ``data.split`` writes each of its splits to the file mmrl reads it from; with ``data.split`` only that one.
"""

from __future__ import annotations

from collections.abc import Sequence

MMRL_SPLITS = ("train", "val", "test", "sft")
ALIASES = {"validation": "val", "valid": "val", "dev": "val"}
"""Other names of mmrl's splits (the split is written under mmrl's name)."""
DEFAULT_SPLIT = "train"


def mmrl_split(name: str) -> str:
    """The split file ``name`` is written to: mmrl's name for an alias (``validation`` -> ``val``), else ``name``."""
    return ALIASES.get(name, name)


def _known_names() -> str:
    aliases = {split: [a for a, s in ALIASES.items() if s == split] for split in MMRL_SPLITS}
    return ", ".join(f"{s} ({', '.join(aliases[s])})" if aliases[s] else s for s in MMRL_SPLITS)


def source_split(names: Sequence[str], split: str, where: str) -> str:
    """The one of a DatasetDict's split ``names`` that ``split`` asks for: the same name, else the one with the same
    mmrl name (``val`` finds ``validation``). ``where`` names the input in errors."""
    if split in names:
        return split
    matches = [name for name in names if mmrl_split(name) == mmrl_split(split)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"{where} holds the splits {sorted(names)}, of which {sorted(matches)} all mean "
                         f"{mmrl_split(split)!r}; set data.split to the one you mean")
    raise ValueError(f"{where} holds the splits {sorted(names)}, none of them data.split={split!r} (nor another name "
                     f"of it; mmrl's splits: {_known_names()}); set data.split to one of {sorted(names)}, or leave it "
                     "empty to convert them all")


def plan_splits(names: Sequence[str] | None, split: str, where: str) -> list[tuple[str, str]]:
    """(split read, split file written) pairs for an input whose splits are ``names`` (None: a single file or
    Dataset, read whole) when ``data.split`` is ``split`` (empty: every split of a DatasetDict, else ``train``)."""
    if names is None:
        return [(split or DEFAULT_SPLIT, mmrl_split(split or DEFAULT_SPLIT))]
    if split:
        return [(source_split(names, split, where), mmrl_split(split))]
    unknown = [name for name in names if mmrl_split(name) not in MMRL_SPLITS]
    if unknown:
        raise ValueError(f"{where} holds the splits {sorted(names)}; mmrl does not read {sorted(unknown)} (its splits: "
                         f"{_known_names()}). Rename them in the DatasetDict, or convert one split alone with "
                         f"data.split=<name> (it is written to <name>.parquet)")
    targets = [mmrl_split(name) for name in names]
    clashes = sorted({t for t in targets if targets.count(t) > 1})
    if clashes:
        doubled = sorted(name for name in names if mmrl_split(name) in clashes)
        raise ValueError(f"{where} holds the splits {doubled}, which all mean {clashes}; convert one of them with "
                         "data.split=<name>, or merge them in the DatasetDict")
    return [(name, mmrl_split(name)) for name in sorted(names, key=lambda n: MMRL_SPLITS.index(mmrl_split(n)))]


__all__ = ["ALIASES", "MMRL_SPLITS", "mmrl_split", "plan_splits", "source_split"]
