"""Why a line of input could not become a row: a short kind (the quarantine's reason key) and a message."""

from __future__ import annotations


class RowRejected(Exception):
    """A line that cannot become a row; ``kind`` is a short reason key, ``reason`` names the fix.

    Picklable (it crosses from the video-decoding process back to the converter).
    """

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(kind, reason)
        self.kind = kind
        self.reason = reason

    def __str__(self) -> str:
        return self.reason
