"""The ``vancetope`` command (layer: brain/cli). Parses flags, calls the brain, shows results.

One module per family of commands; importing them registers their commands on ``cli``.
"""

from brain.cli import clients, secrets, services, trees, web  # noqa: F401 - they register commands
from brain.cli.base import accept_settings_options, cli, main

accept_settings_options(cli)

__all__ = ["cli", "main"]
