"""What the commands share: their exit codes and the plain-text table a listing prints."""

from __future__ import annotations

from collections.abc import Sequence

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_CONFIG = 2  # the config file cannot be read or is invalid
EXIT_USAGE = 2  # `parley migrate`: a request it cannot carry out as given


def table(rows: Sequence[Sequence[str]]) -> str:
    """Each column as wide as its widest cell, two spaces apart; the first row is the head."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
