"""The Mind: actors, registry, recovery."""
