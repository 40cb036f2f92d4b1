"""Agents: the pluggable brain (DESIGN §1)."""
