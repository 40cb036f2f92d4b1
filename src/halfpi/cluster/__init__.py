"""Cluster mode's pieces (DESIGN §10): conversation leases on Redis."""
