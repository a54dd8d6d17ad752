"""Celery entry point of the server worker pool (layer: workers).

``celery -A workers.server_worker worker -Q server`` — the app configured from
``VANCETOPE_*`` env with ``vancetope.run_tool`` registered.
"""

from workers.app import app
from workers.tasks import register

run_tool = register(app)

__all__ = ["app", "run_tool"]
