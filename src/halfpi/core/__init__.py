"""The Sans-I/O core: protocol rules as plain functions and classes.

Nothing under this package may import asyncio, sqlite3, sockets or read the
clock; time is always an argument. ``tests/core/test_purity.py`` enforces it.
"""
