"""The report's section on the drafters side by side (`drafters_section`): per prompt type, each drafter
the store holds (draft model, cross-tokenizer draft, prompt lookup, suffix, suffix with corpus) at its
trace's best K or its fixed K, and the paired ratios suffix vs prompt lookup and suffix with corpus vs suffix
(:mod:`specdec.report.drafters`)."""

from __future__ import annotations

from specdec.report import tables as T
from specdec.report.analysis import Analysis
from specdec.report.document import Section, ci, f, i, s, table_of
from specdec.report.drafters import DRAFTER_RATIOS

__all__ = ["drafters_section"]

#: The drafters the paired ratios are about (their numerators: suffix vs prompt lookup, ...).
_SUFFIX_DRAFTERS = tuple(a for a, _, _ in DRAFTER_RATIOS)


def _verdict(r) -> str:
    """The verdict cell; a cell whose every run was skipped (no prompt measured) says so and where to look."""
    if not r["n_prompts"]:
        return "not run: every run skipped (see Gaps)"
    return s(r["verdict"])


def drafters_section(a: Analysis) -> Section:
    """Per prompt type and configuration: each drafter's tokens per target forward and paired speedup over
    target-only decoding with its interval over the type's prompts; then the paired drafter ratios."""
    sec = Section("The drafters by prompt type", "drafters")
    table = a[T.DRAFTER_TABLE]
    if table.empty:
        sec.blocks.append("No drafter (draft, xtok, ngram, suffix, suffix_corpus) at a fixed K or its trace's "
                          "best K in this store.")
        return sec
    sec.blocks.append(
        "Each drafter as planned: 'best' = every prompt at the fixed K its acceptance trace predicted fastest "
        "(the K used are listed), else one row per fixed K. tokens/forward = tokens committed per target "
        "forward (bonus included); speedup = paired ratio to the neighbouring target-only runs, interval "
        "over the type's prompts. xtok is a draft with another tokenizer (it drafts text, re-tokenized for "
        "the target); suffix_corpus also matches the other prompts' target-only outputs; 'rounds drafted by' "
        "= the mixed drafter's rounds by the drafter it chose (or none).")
    t = table_of(table, [
        ("config", lambda r: s(r["config_label"])), ("prompt type", lambda r: s(r["prompt_type"])),
        ("drafter", lambda r: f"{r['method']} ({r['drafter']})"), ("K", lambda r: s(r["k"])),
        ("K used", lambda r: s(r["ks"])), ("prompts", lambda r: i(r["n_prompts"])),
        ("tokens/forward", lambda r: f(r["tokens_per_forward"])),
        ("acceptance", lambda r: f(r["acceptance_rate"])), ("speedup", lambda r: f(r["speedup"])),
        ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])), ("verdict", _verdict),
        *([("rounds drafted by", lambda r: s(r["sources"]))]
          if "sources" in table.columns and table["sources"].astype(bool).any() else []),
    ])
    t.caption = "Per prompt type, then all prompts pooled."
    t.limit = 400
    sec.blocks.append(t)
    ratios = a[T.DRAFTER_RATIOS]
    if ratios.empty:
        if not table["method"].isin(_SUFFIX_DRAFTERS).any():
            return sec  # no suffix drafter in the store: there is no ratio to miss
        sec.blocks.append("suffix vs prompt lookup: not measured on common prompts (needs both at the same K or "
                          "both at their trace's best K).")
        return sec
    rt = table_of(ratios, [
        ("config", lambda r: s(r["config_label"])), ("comparison", lambda r: s(r["comparison"])),
        ("prompt type", lambda r: s(r["prompt_type"])), ("K", lambda r: s(r["k"])),
        ("prompts", lambda r: i(r["n_prompts"])), ("ratio", lambda r: f(r["ratio"])),
        ("95% CI", lambda r: ci(r["ratio_lo"], r["ratio_hi"])), ("verdict", lambda r: s(r["verdict"])),
    ])
    rt.caption = ("Paired ratio A/B per prompt (each run over its own neighbouring target-only runs, then A over "
                  "B), interval over the prompts both ran on; above 1: A is faster.")
    sec.blocks.append(rt)
    return sec
