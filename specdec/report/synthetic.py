"""specdec's loop and llama.cpp's own at a set acceptance rate, against the analytical model.

A synthetic-acceptance measurement (``benchmarks/synthetic_acceptance.py``, stored with
`specdec.bench.store.Store.save_synthetic`) decodes one prompt on both loops with the draft model drafting
exactly K tokens a round and draft position i accepted with probability alpha given the earlier ones, whatever
the tokens (llama.cpp's ``--spec-synth-rates``; specdec's ``synthetic=``): the rounds cost what real rounds
cost while the acceptance is set, so the loops are compared, not the drafts. Its document holds ``runs`` (one
per timed decode: ``rep``, ``loop`` "specdec" | "native", ``alpha`` (None for target-only), ``k`` (0 for
target-only), ``decode_tokens_per_s``, ``tokens``, ``rounds``, ``round_s``), the cost curve ``costs``
(`specdec.measure.timing.measure_costs` on specdec's llama.cpp backend), ``machine``, ``type``,
``prompt_tokens``, ``new`` and ``threads``.

Per (loop, alpha, K) the speedup is each run's decode rate over the mean of its own loop's target-only runs of
the same repetition (geometric mean and 95% t-interval over repetitions; fewer than 5 are labelled), and the
prediction is ``E[tokens per round](alpha, K) t_target(1) / round_s(K)`` (Leviathan et al. 2023) with the round
priced on the measured curve (`specdec.core.costs.CostCurve.round_s`), also at the tokens per round the runs
drew ("at drawn": the cost model's error without the draws' noise).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from specdec.core.costs import CostCurve
from specdec.core.stats import ratio_interval
from specdec.core.theory import expected_tokens_per_round

__all__ = ["COLUMNS", "LOOPS", "summarize", "synthetic_table"]

#: The two loops a measurement times: specdec's and llama.cpp's own (``llama-server``).
LOOPS = ("specdec", "native")
#: The columns of `synthetic_table`.
COLUMNS = [
    "measured_at", "machine", "loop", "alpha", "k", "n", "tok_s", "tokens_per_round", "expected_tokens_per_round",
    "speedup", "lo", "hi", "verdict", "predicted", "measured_over_predicted", "at_drawn", "round_ms", "beyond_ms",
]  # fmt: skip


def summarize(doc: Mapping[str, Any]) -> list[dict]:
    """Per loop: its target-only row (``k`` 0: decode rate, round and its cost beyond ``t_target(1)``), then per
    (alpha, K) in first-run order: ``n`` repetitions, ``speedup`` (a `specdec.core.stats.RatioInterval`),
    ``predicted``, ``predicted_at_drawn``, ``tokens_per_round`` (measured) and ``expected_tokens_per_round``,
    ``decode_tokens_per_s`` and ``round_s`` (means), ``beyond_s`` (the round's wall time minus the curve's price
    of its forwards). Seconds throughout.

    Raises:
        KeyError: a speculative run's repetition has no target-only run of its loop.
    """
    curve = CostCurve.from_costs(doc["costs"])
    t1 = curve.target_step_s
    base: dict[tuple[int, str], list[dict]] = {}
    for r in doc["runs"]:
        if r["k"] == 0:
            base.setdefault((r["rep"], r["loop"]), []).append(r)
    rows = []
    for loop in LOOPS:
        own = [x for (_, lp), rs in sorted(base.items()) if lp == loop for x in rs]
        if not own:
            continue
        round_s = statistics.fmean(x["round_s"] for x in own)
        rows.append({"loop": loop, "alpha": None, "k": 0, "round_s": round_s, "beyond_s": round_s - t1,
                     "decode_tokens_per_s": statistics.fmean(x["decode_tokens_per_s"] for x in own)})  # fmt: skip
        for alpha, k in dict.fromkeys((r["alpha"], r["k"]) for r in doc["runs"] if r["k"]):
            runs = [r for r in doc["runs"] if (r["loop"], r["alpha"], r["k"]) == (loop, alpha, k)]
            if not runs:
                continue
            ratios = [r["decode_tokens_per_s"] / statistics.fmean(x["decode_tokens_per_s"]
                                                                    for x in base[(r["rep"], loop)])
                      for r in runs]  # fmt: skip
            predicted_round = curve.round_s(k)  # the draft's K steps (and catch-up) + t_target(K + 1)
            round_s = statistics.fmean(r["round_s"] for r in runs)
            per_round = statistics.fmean(r["tokens"] / r["rounds"] for r in runs)
            expected = float(expected_tokens_per_round(alpha, k))
            rows.append({
                "loop": loop, "alpha": alpha, "k": k, "n": len(runs), "speedup": ratio_interval(ratios),
                "predicted": expected * t1 / predicted_round, "predicted_at_drawn": per_round * t1 / predicted_round,
                "tokens_per_round": per_round, "expected_tokens_per_round": expected,
                "decode_tokens_per_s": statistics.fmean(r["decode_tokens_per_s"] for r in runs),
                "round_s": round_s, "beyond_s": round_s - predicted_round,
            })  # fmt: skip
    return rows


def _machine(doc: Mapping[str, Any]) -> str:
    m = doc.get("machine") or {}
    native = (m.get("native") or {}).get("version", "?")
    return f"{m.get('cpu_model', '?')}, {doc.get('threads', '?')} threads, host {m.get('host', '?')}, llama-server {native}"


def synthetic_table(docs: Iterable[Mapping[str, Any]] | None) -> pd.DataFrame:
    """One row per loop and (alpha, K) of each stored measurement (`summarize`), target-only rows included
    (``k`` 0, speedup 1 by definition). ``tok_s`` decode tokens/s; ``speedup`` / ``lo`` / ``hi`` / ``verdict``
    over the loop's own target-only; ``measured_over_predicted`` and ``at_drawn`` the speedup over the
    prediction at E(alpha, K) and at the drawn tokens per round; ``round_ms`` and ``beyond_ms`` per round.
    Empty (with `COLUMNS`) where nothing is stored."""
    out = []
    for doc in docs or ():
        head = {"measured_at": doc.get("created_at"), "machine": _machine(doc)}
        for r in summarize(doc):
            rec = dict.fromkeys(COLUMNS) | head | {
                "loop": r["loop"], "alpha": r["alpha"], "k": r["k"], "tok_s": r["decode_tokens_per_s"],
                "round_ms": r["round_s"] * 1e3, "beyond_ms": r["beyond_s"] * 1e3}  # fmt: skip
            if r["k"]:
                s = r["speedup"]
                rec |= {"n": r["n"], "tokens_per_round": r["tokens_per_round"],
                        "expected_tokens_per_round": r["expected_tokens_per_round"], "speedup": s.center,
                        "lo": s.lo, "hi": s.hi, "verdict": s.verdict, "predicted": r["predicted"],
                        "measured_over_predicted": s.center / r["predicted"],
                        "at_drawn": s.center / r["predicted_at_drawn"]}  # fmt: skip
            else:
                rec |= {"tokens_per_round": 1.0, "expected_tokens_per_round": 1.0, "speedup": 1.0}
            out.append(rec)
    return pd.DataFrame(out, columns=COLUMNS)
