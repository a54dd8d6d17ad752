"""The brain's Redis glue: hot state, parked lists, presence, ACL users, tool pins, the reading
of what clients wrote, and Lua scripts in lua/. Imports core and the store only (docs/architecture.md).
"""
