"""Which of our methods each library peer is compared with, declared once for both halves of the project.

The bench's method registry (`specdec.bench.methods`) checks every pair names registered methods, and the
report (`specdec.report.comparisons.peer_table`) compares exactly these pairs, without importing the bench.
"""

from __future__ import annotations

__all__ = ["NATIVE_PEERS", "NATIVE_TARGET", "PEER_PAIRS"]

#: ``(ours, peer)`` method names (``runs.method``). K must match where the peer takes K; a peer without K is
#: compared with each of our K (llama.cpp's model-free drafters, at llama.cpp's own draft lengths); a peer may
#: have several of ours (prompt lookup: our rule and transformers' rule in our engine, like for like).
PEER_PAIRS = (
    ("baseline", "hf_generate"),
    ("draft", "hf_assisted"),
    ("ngram", "hf_prompt_lookup"),
    ("ngram_hf", "hf_prompt_lookup"),
    ("ngram", "llama_prompt_lookup"),
    ("baseline", "native_target"),
    ("draft", "native_draft"),
    ("ngram", "native_ngram_simple"),
    ("ngram", "native_ngram_map_k"),
    ("ngram", "native_ngram_map_k4v"),
    ("ngram", "native_ngram_mod"),
    ("ngram", "native_ngram_cache"),
    ("suffix", "native_ngram_mod"),
    ("suffix", "native_ngram_cache"),
)

#: llama.cpp's own methods timed as peers (`specdec.bench.native_peers`): llama.cpp's name (its
#: ``--spec-type``; ``target`` is its decoding without speculation) -> the sweep's method name (``runs.method``).
NATIVE_PEERS = {
    "target": "native_target",
    "draft-simple": "native_draft",
    **{m: "native_" + m.replace("-", "_") for m in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                                                   "ngram-cache")},
}
#: llama.cpp's own target-only decoding: what its speculative methods are divided by in the report.
NATIVE_TARGET = NATIVE_PEERS["target"]
