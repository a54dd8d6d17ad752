"""Celery entry point of the server worker pool (layer: workers).

``celery -A workers.server_worker worker -Q server`` (or ``server.<pool>``) — the app configured from
``VANCETOPE_*`` env with ``vancetope.run_tool`` registered; ``http_get`` may reach the
internal targets ``VANCETOPE_HTTP_ALLOW`` lists (the brain's ``http_allow`` setting).
"""

import os

from workers.app import app
from workers.pool_presence import PoolPresence
from workers.tasks import register
from workers.tools.builtin import builtin_tools
from workers.tools.netguard import HttpAllow

# Status asks whether anyone consumes a pool's queue: this worker says so (workers.pool_presence).
app.steps["consumer"].add(PoolPresence)
run_tool = register(app, builtins=builtin_tools(HttpAllow.from_env(os.environ)))

__all__ = ["app", "run_tool"]
