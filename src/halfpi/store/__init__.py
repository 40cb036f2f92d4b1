"""Durable stores behind the Store seam."""
