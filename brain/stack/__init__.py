"""Processes: the embedded stack, its supervisor, redis-server, children, Flower's password.
Starts, watches and stops; decides nothing about trees (docs/architecture.md).
"""
