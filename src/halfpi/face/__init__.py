"""Faces: the Python SDK, the reducer every Face shares, headless and terminal faces."""
