"""The study report: several synthetic stores with known answers read side by side (`specdec.report.study`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from test_report import XSS, Store

from specdec.report import study

#: default-policy and draft K = 2 speedups per store and prompt type (exact on every prompt but one small wobble)
SPEEDUPS = {"fast": {"code": (1.5, 1.8), XSS: (1.2, 0.9)}, "slow": {"code": (0.9, 0.6), XSS: (1.1, 0.7)}}
#: target-only tokens/s of each store's configuration
BASE = {"fast": 10.0, "slow": 40.0}


def _store(path: Path, label: str, *, start_hour: int = 0, gap_after: int | None = None) -> Path:
    """Six prompts of two types; per prompt B, A/A, B, default policy, B, draft K = 2, B; one run per minute
    from `start_hour`, with a two-hour pause after run `gap_after`."""
    st = Store(path).sweep(name=label).costs(config_label=label)
    base = BASE[label]
    for ptype, (default, k2) in SPEEDUPS[label].items():
        for p in range(6):
            common = {"prompt_id": f"{ptype}-{p}", "prompt_type": ptype, "config_label": label}
            wobble = 1 + 0.01 * (p - 2.5)  # an interval of non-zero width
            st.run(method="baseline", tokens_per_s=base, repeat=0, **common)
            st.run(method="aa", tokens_per_s=base * wobble, **common)
            st.run(method="baseline", tokens_per_s=base, repeat=1, **common)
            st.run(method="draft", policy="cost", k=16, tokens_per_s=base * default * wobble, rounds=[(2, "11")],
                   num_drafted=2, num_accepted=2, num_rejections=0, matches_baseline=1, **common)
            st.run(method="baseline", tokens_per_s=base, repeat=2, **common)
            st.run(method="draft", policy="fixed", k=2, tokens_per_s=base * k2 * wobble, rounds=[(2, "10")],
                   num_drafted=2, num_accepted=1, num_rejections=1, matches_baseline=int(p > 0), **common)
            st.run(method="baseline", tokens_per_s=base, repeat=3, **common)
    path = st.close()
    con = sqlite3.connect(path)
    ids = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id")]
    t = start_hour * 3600.0
    for n, run_id in enumerate(ids):
        t += 60.0 + (7200.0 if gap_after is not None and n == gap_after + 1 else 0.0)
        con.execute("UPDATE runs SET created_at = ?, total_s = 30.0 WHERE run_id = ?",
                    (f"2026-12-01T{int(t // 3600):02d}:{int(t % 3600 // 60):02d}:00+00:00", run_id))
    con.commit()
    con.close()
    return path


@pytest.fixture
def stores(tmp_path) -> list[Path]:
    return [_store(tmp_path / "fast.db", "fast"), _store(tmp_path / "slow.db", "slow", start_hour=5, gap_after=40)]


def test_type_table_reads_each_store_on_its_own(stores):
    types = study.type_table(study.load_sources(stores)).set_index(["store", "prompt_type"])
    assert len(types) == 4
    for label, per in SPEEDUPS.items():
        for ptype, (default, k2) in per.items():
            r = types.loc[(label, ptype)]
            # the 4x faster baseline of the other store never enters: each speedup is over its own target-only
            assert r["default_speedup"] == pytest.approx(default, rel=1e-3)
            assert r["default_lo"] < r["default_speedup"] < r["default_hi"]
            assert r["speedup"] == pytest.approx(max(default, k2), rel=1e-3)
            assert r["baseline_tok_s"] == pytest.approx(BASE[label])
            assert r["config_label"] == label and r["default_n"] == 6
    assert types.loc[("fast", "code"), "best"] == "fast, draft K=2"
    assert types.loc[("slow", "code"), "default_verdict"] == "loss"


def test_headline_rows_pick_the_best_configuration_per_type(stores):
    types = study.type_table(study.load_sources(stores))
    head = study.headline_rows(types).set_index("prompt_type")
    assert head.loc["code", "best"] == "fast, draft K=2" and head.loc["code", "speedup"] == pytest.approx(1.8, rel=1e-3)
    assert head.loc[XSS, "best"] == "fast, draft cost"  # 1.2x beats the slow store's 1.1x default
    assert list(study.headline_rows(types)["speedup"]) == sorted(head["speedup"], reverse=True)


def test_default_pivot_has_one_row_per_type_and_one_column_per_configuration(stores):
    headers, rows = study.default_pivot(study.type_table(study.load_sources(stores)))
    assert headers == ["prompt type", "fast (fast)", "slow (slow)", "best timed cell"]
    assert [r[0] for r in rows] == ["code", XSS]  # the headline's order: 1.8x before 1.2x
    assert rows[0][1].startswith("1.50x [") and rows[0][1].endswith(" win (6)")
    assert rows[0][2].startswith("0.90x [") and rows[0][2].endswith(" loss (6)")
    assert rows[0][3].startswith("fast, draft K=2: 1.80x [")


def test_fastest_way_to_generate_counts_tokens_per_second_not_speedup(stores):
    import pandas as pd

    from specdec.report import tables as T

    sources = study.load_sources(stores)
    fast = study.fastest_table(pd.concat([s.analysis[T.CELLS] for s in sources], ignore_index=True))
    per = study.fastest_per_type(fast).set_index("prompt_type")
    # the slow store's target-only (40 tok/s) beats the fast store's best speculative cell (18 tok/s), and its
    # own default policy on the XSS type (44 tok/s) beats its target-only
    assert per.loc["code", "fastest"] == "slow target-only" and per.loc["code", "tok_s"] == pytest.approx(40.0)
    assert per.loc[XSS, "fastest"] == "slow draft cost" and per.loc[XSS, "speculative"]


def test_duration_counts_sittings(stores):
    dur = study.duration_table(study.load_sources(stores)).set_index("store")
    runs = 2 * 6 * 7
    assert (dur.loc["fast", "runs"], dur.loc["fast", "sittings"]) == (runs, 1)
    # one run a minute, each 30 s long: first run's 30 s, then 60 s per following run
    assert dur.loc["fast", "wall_s"] == pytest.approx(30.0 + 60.0 * (runs - 1))
    assert dur.loc["slow", "sittings"] == 2  # a two-hour pause starts a second sitting; it is not counted
    assert dur.loc["slow", "wall_s"] == pytest.approx(2 * 30.0 + 60.0 * (runs - 2))
    assert dur.loc["slow", "generation_s"] == pytest.approx(30.0 * runs)


def test_write_study_escapes_store_text_and_draws_the_headline(stores, tmp_path):
    res = study.write_study(stores, tmp_path / "out", reports=["results/fast_report/report.html"])
    html = res.html.read_text()
    assert XSS not in html and "&lt;script&gt;" in html
    assert not res.figure.skipped and Path(res.figure.png).stat().st_size > 0
    for title in ("How to read this", "Headline", "Per prompt type", "The fastest way to generate",
                  "How long it took", "Per-store reports", "Appendix: definitions"):
        assert title in html
    assert html.index('id="how"') < html.index('id="study_headline"') < html.index('id="types"')  # reading order
    md = res.markdown.read_text()
    assert "wins on 2 of 2 types" in md  # the fast store's default policy on both types
    assert "slow 0.99x" in md  # pooled over its 12 prompts: sqrt(0.9 x 1.1)
    assert "fast 22 of 24 (92%)" in md  # one draft K = 2 run per type left the target-only output
    assert np.isfinite(res.types["default_speedup"].astype(float)).all()


def test_cli_study_and_its_errors(stores, tmp_path, capsys):
    from specdec.cli import main

    out = tmp_path / "cli"
    with pytest.raises(SystemExit) as ok:
        main(["study", "--db", str(stores[0]), "--db", str(stores[1]), "--out", str(out)])
    assert ok.value.code == 0 and (out / "report.html").exists() and "2 stores" in capsys.readouterr().out
    twin = tmp_path / "again"
    twin.mkdir()
    (twin / "fast.db").write_bytes(Path(stores[0]).read_bytes())
    with pytest.raises(ValueError, match="share a file name"):
        study.load_sources([stores[0], twin / "fast.db"])
    with pytest.raises(SystemExit) as exc:
        main(["study", "--db", str(tmp_path / "missing.db"), "--out", str(out)])
    assert exc.value.code == 2 and "missing.db" in capsys.readouterr().err
