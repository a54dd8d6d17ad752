"""``python -m brain`` is the ``vancetope`` command."""

from brain.cli import main

main()
