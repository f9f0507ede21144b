"""The version of sparsecomm, in a leaf module: the package re-exports it and the
reducer's handshake reads it at each call without importing the package (no cycle)."""

__version__ = "0.1.0"
