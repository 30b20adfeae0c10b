"""The catalogue: every drafter (`drafters`), K policy (`policies`) and runtime configuration (`runtimes`) the
project offers, each named once, and which of our methods each library peer is compared with (`peers`).

Every entry point reads it: the command line, the Python API (one prompt and a batch), the sweep's methods,
the trace replay and the report's names. Importing it loads neither torch nor a model: each entry builds
its object on demand.
"""
