"""The Hand: an executor process on a device (DESIGN §8)."""
