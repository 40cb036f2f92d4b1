"""halfpi: an always-on agent Mind, its Faces and its Hands, kept in agreement."""

__version__ = "0.1.0"
