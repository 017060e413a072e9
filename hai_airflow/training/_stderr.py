"""Messages for the job's log: straight to stderr, so ``hai log`` shows them whatever logging is set up."""

from __future__ import annotations

import sys


def note(message: str) -> None:
    """Write one line about what the training helpers did."""
    print(f"hai-training: {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    """Write one warning line."""
    note(f"warning: {message}")
