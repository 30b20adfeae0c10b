"""The report's vocabulary: method and policy names, row labels and the cell key, declared once.

Words used by every module of :mod:`specdec.report`:

* A **cell** is one ``(config_label, pair, prompt_type, method, policy, k)`` (`CELL_KEY`): all repeats of
  all prompts of one prompt type measured with one method, policy and K on one runtime configuration.
  ``policy`` is ``"-"`` and ``k`` is 0 where the store has NULL (baseline, peers without K); ``pair``
  falls back to the target name where the store has none (prompt lookup).
* A **pooled row** is a cell with ``prompt_type`` = `ALL_PROMPTS`: the same key with every prompt type
  pooled (the ``overall`` table). It is not called a cell anywhere in the report.
* The store's ``runs.cell_key`` is a **run key** (one timed generation: the sweep's per-prompt unit x
  repeat; see ``specdec/bench/store.py``). The report never groups by it.

The method names here are the report's view of the bench's method registry (`specdec.bench.methods`); the
peers and which of ours each is compared with come from `specdec.catalogue.peers`, which both halves read. They are
kept apart so that importing the report never imports the bench.
"""

from __future__ import annotations

from specdec.catalogue.drafters import DRAFTERS
from specdec.catalogue.peers import PEER_PAIRS
from specdec.catalogue.policies import ADAPTIVE_POLICIES

__all__ = [
    "ADAPTIVE_POLICIES",
    "ALL_PROMPTS",
    "BASELINE",
    "CELL_KEY",
    "EACH_TYPE_BEST_K",
    "FIXED_POLICIES",
    "OUR_DRAFTERS",
    "PEER_METHODS",
    "SINGLE_RUN",
    "SPEC_METHODS",
]

#: Label of the pooled rows (every prompt type pooled).
ALL_PROMPTS = "(all prompts)"
#: Label of the pooled row that sets an adaptive policy against each prompt type's own best fixed K.
EACH_TYPE_BEST_K = "(all prompts, each type's best K)"
#: Verdict of a cell holding a single run of a single prompt: a point estimate without an interval.
SINGLE_RUN = "single run (no interval)"

#: Our target-only decoding: the denominator of every speedup.
BASELINE = "baseline"
#: Our speculative methods the analytical model applies to (fixed K, per-token acceptance).
SPEC_METHODS = tuple(n for n, e in DRAFTERS.items() if e.analytic is not None)
#: Every speculative method of ours (every drafter of the catalogue): the headline's cells and the exactness count.
OUR_DRAFTERS = tuple(DRAFTERS)
#: Peer implementations measured in the same run.
PEER_METHODS = tuple(dict.fromkeys(peer for _, peer in PEER_PAIRS))
#: Policies that choose K per round.
#: Policies under which a cell keeps one K throughout (``"-"``: the store had no policy).
FIXED_POLICIES = ("fixed", "-")
#: The columns that name a cell.
CELL_KEY = ["config_label", "pair", "prompt_type", "method", "policy", "k"]
