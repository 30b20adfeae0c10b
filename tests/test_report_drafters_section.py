"""The report's "drafters by prompt type" section as a reader sees it: a drafter cell whose runs were all
skipped says so, and the suffix ratio line appears only when the store holds a suffix drafter."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec.report import tables as T
from specdec.report.document import Table
from specdec.report.sections_drafters import drafters_section

COLS = ["config_label", "prompt_type", "method", "drafter", "k", "ks", "n_prompts", "tokens_per_forward",
        "acceptance_rate", "speedup", "speedup_lo", "speedup_hi", "verdict"]


def _row(ptype, method, n, verdict):
    """One drafter-table row; `n` = 0 is a cell whose runs were all skipped (the table leaves ks/verdict '')."""
    measured = n > 0
    return ["transformers-bf16", ptype, method, "x", "best", "2" if measured else "", n,
            2.0 if measured else np.nan, 0.8 if measured else np.nan, 1.5 if measured else np.nan,
            np.nan, np.nan, verdict]


def _section(rows):
    """The section rendered from a drafter table of `rows` and no paired ratios."""
    a = {T.DRAFTER_TABLE: pd.DataFrame(rows, columns=COLS), T.DRAFTER_RATIOS: pd.DataFrame()}
    return drafters_section(a)


def test_a_cell_with_every_run_skipped_says_so():
    sec = _section([_row("code", "draft", 1, "single run (no interval)"), _row("technical_ml", "draft", 0, "")])
    table = next(b for b in sec.blocks if isinstance(b, Table))
    verdicts = {r[1]: r[-1] for r in table.rows}
    assert verdicts["code"] == "single run (no interval)"
    assert verdicts["technical_ml"].startswith("not run")


def test_suffix_ratio_line_only_when_a_suffix_drafter_ran():
    no_suffix = _section([_row("code", "draft", 1, "win"), _row("code", "ngram", 1, "win")])
    assert not any(isinstance(b, str) and "suffix vs prompt lookup" in b for b in no_suffix.blocks)
    with_suffix = _section([_row("code", "suffix", 1, "win"), _row("code", "ngram", 1, "win")])
    assert any(isinstance(b, str) and "suffix vs prompt lookup" in b for b in with_suffix.blocks)
