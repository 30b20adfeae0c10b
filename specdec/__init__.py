"""specdec: speculative decoding implemented exactly, measured honestly against target-only decoding."""

__version__ = "0.1.0"
