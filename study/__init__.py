"""The project's own study of speculative decoding, built on the `specdec` tool (not installed with it).

Run from the repository root (``python -m study.report ...``); `study/README.md` lists every module and the
stores it reads.
"""
