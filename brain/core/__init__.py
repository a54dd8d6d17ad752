"""The pure layer: decisions on trees, routes, states and limits. No Redis, Celery, store,
clock or environment; everything is a function of its arguments (docs/architecture.md).
"""
