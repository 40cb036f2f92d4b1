"""Shared test machinery: real Mind processes, a raw Face client, a faulty proxy."""
