"""The Journal seam: the bounded hot window of recent events (DESIGN §4.2)."""
