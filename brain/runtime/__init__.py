"""The running brain: the scheduler, the intake of what comes back, the relay, the reconciler,
reloads, schedules, the vault. Wires core decisions to hot state, the store and Celery, with its
collaborators handed in; starts no process (docs/architecture.md).
"""
