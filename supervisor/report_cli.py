"""The `qw report`, `qw why` and `qw demo …` commands (registered on the main app)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `qw` app."""
