"""The study report: several synthetic stores with known answers read side by side (`study.report`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from test_report import XSS, Store

from specdec.report import tables as T
from study import report as study

#: default-policy and draft K = 2 speedups per store and prompt type (exact on every prompt but a small wobble)
SPEEDUPS = {"fast": {"code": (1.5, 1.8), XSS: (1.2, 0.9)}, "slow": {"code": (0.9, 0.6), XSS: (1.1, 0.7)},
            "again": {"code": (1.3, 1.0), XSS: (1.0, 1.0)}}
#: target-only tokens/s of each store's configuration
BASE = {"fast": 10.0, "slow": 40.0, "again": 10.0}
#: each store's configuration: "again" times the same configuration as "fast", in another sweep
CONFIG = {"fast": "bf16", "slow": "fp32", "again": "bf16"}


def _store(path: Path, label: str, *, start_hour: int = 0, gap_after: int | None = None) -> Path:
    """Six prompts of two types; per prompt B, A/A, B, default policy, B, draft K = 2, B, and on the first
    code prompt only a draft K = 4 run at 5x (the fastest cell, but timed on one prompt); one run per minute
    from `start_hour`, with a two-hour pause after run `gap_after`."""
    config = CONFIG[label]
    st = Store(path).sweep(name=label).costs(config_label=config)
    base = BASE[label]
    for ptype, (default, k2) in SPEEDUPS[label].items():
        for p in range(6):
            common = {"prompt_id": f"{ptype}-{p}", "prompt_type": ptype, "config_label": config}
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
            if ptype == "code" and p == 0:
                st.run(method="draft", policy="fixed", k=4, tokens_per_s=base * 5.0, rounds=[(4, "1111")],
                       num_drafted=4, num_accepted=4, num_rejections=0, matches_baseline=1, **common)
                st.run(method="baseline", tokens_per_s=base, repeat=4, **common)
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


RUNS = 2 * 6 * 7 + 2  # per store


@pytest.fixture
def stores(tmp_path) -> list[Path]:
    return [_store(tmp_path / "fast.db", "fast"), _store(tmp_path / "slow.db", "slow", start_hour=5, gap_after=40),
            _store(tmp_path / "again.db", "again", start_hour=10)]


@pytest.fixture
def sources(stores):
    return study.load_sources(stores)


def test_a_configuration_in_two_stores_is_two_configurations(sources):
    names = study.config_names(sources)
    assert names == {("fast", "bf16"): "bf16 (fast)", ("again", "bf16"): "bf16 (again)", ("slow", "fp32"): "fp32"}
    cells = study.combined(sources, T.CELLS)
    assert set(cells["config_label"]) == {"bf16 (fast)", "bf16 (again)", "fp32"}
    assert set(cells.groupby("config_label")["store"].nunique()) == {1}  # one name, one store


def test_type_table_reads_each_store_on_its_own(sources):
    types = study.type_table(study.study_analysis(sources)).set_index(["store", "prompt_type"])
    assert len(types) == 6
    for label, per in SPEEDUPS.items():
        for ptype, (default, k2) in per.items():
            r = types.loc[(label, ptype)]
            # the 4x faster baseline of the slow store never enters another: each speedup is over its own
            assert r["default_speedup"] == pytest.approx(default, rel=1e-3)
            assert r["default_lo"] < r["default_speedup"] < r["default_hi"]
            # the best cell is among those on all 6 prompts: the one-prompt K = 4 run at 5x is not it
            assert r["speedup"] == pytest.approx(max(default, k2), rel=1e-3) and r["n_aligned"] == 6
            assert r["baseline_tok_s"] == pytest.approx(BASE[label])
            assert r["default_n"] == 6
    assert types.loc[("fast", "code"), "best"] == "bf16 (fast), draft K=2"
    assert types.loc[("slow", "code"), "default_verdict"] == "loss"


def test_headline_rows_pick_the_best_configuration_per_type(sources):
    a = study.study_analysis(sources)
    head = study.headline_rows(a).set_index("prompt_type")
    assert head.loc["code", "best"] == "bf16 (fast), draft K=2" and head.loc["code", "speedup"] == pytest.approx(1.8, rel=1e-3)
    assert head.loc[XSS, "best"] == "bf16 (fast), draft cost"  # 1.2x beats the slow store's 1.1x default
    assert list(study.headline_rows(a)["speedup"]) == sorted(head["speedup"], reverse=True)


def test_default_pivot_has_one_row_per_type_and_one_column_per_configuration(sources):
    a = study.study_analysis(sources)
    headers, rows = study.default_pivot(study.type_table(a), study.headline_rows(a))
    assert headers == ["prompt type", "bf16 (again)", "bf16 (fast)", "fp32", "best timed cell"]
    assert [r[0] for r in rows] == ["code", XSS]  # the headline's order: 1.8x before 1.2x
    assert rows[0][1].startswith("1.30x [") and rows[0][1].endswith(" win (6)")
    assert rows[0][2].startswith("1.50x [") and rows[0][2].endswith(" win (6)")
    assert rows[0][3].startswith("0.90x [") and rows[0][3].endswith(" loss (6)")
    assert rows[0][4].startswith("bf16 (fast), draft K=2: 1.80x [")


def test_fastest_way_to_generate_counts_tokens_per_second_not_speedup(sources):
    fast = study.fastest_table(study.study_analysis(sources)[T.CELLS])
    assert set(fast["config"]) == {"bf16 (fast)", "bf16 (again)", "fp32"}
    row = fast[(fast["config"] == "bf16 (fast)") & (fast["prompt_type"] == "code")].iloc[0]
    # 50 tok/s on one prompt is not set beside medians over six: the fastest six-prompt cell is draft K = 2
    assert (row["best_spec"], row["n_prompts"]) == ("draft K=2", 6) and row["spec_tok_s"] == pytest.approx(18.0, rel=0.01)
    per = study.fastest_per_type(fast).set_index("prompt_type")
    # the slow store's target-only (40 tok/s) beats every speculative cell of the bf16 stores (<= 18 tok/s), and
    # its own default policy on the XSS type (44 tok/s) beats its target-only
    assert per.loc["code", "fastest"] == "fp32 target-only" and per.loc["code", "tok_s"] == pytest.approx(40.0)
    assert per.loc[XSS, "fastest"] == "fp32 draft cost" and per.loc[XSS, "speculative"]
    # study.fastest builds the same table from cells stacked with a store column
    import pandas as pd

    raw = pd.concat([s.analysis[T.CELLS].assign(store=s.label) for s in sources], ignore_index=True)
    assert set(study.fastest_table(raw)["config"]) == set(fast["config"])


def test_fastest_table_picks_a_configurations_speculative_cell_by_paired_speedup():
    """Within one configuration the best speculative cell is the one with the highest paired speedup: in a
    store resumed on a faster machine, K = 4 timed there has the higher median tokens/s (2.5 against 2.0)
    yet runs 0.84x its own adjacent target-only runs, while the policy, timed on the slower machine, runs
    1.05x of its own."""
    import pandas as pd

    base = {"prompt_type": "natural", "config_label": "fp32", "n_aligned": 5}
    cells = pd.DataFrame([
        {**base, "method": "baseline", "policy": "-", "k": 0, "tok_s": 2.2, "speedup": 1.0},
        {**base, "method": "draft", "policy": "fixed", "k": 4, "tok_s": 2.5, "speedup": 0.84},
        {**base, "method": "draft", "policy": "cost", "k": 16, "tok_s": 2.0, "speedup": 1.05},
    ])
    row = study.fastest_table(cells).iloc[0]
    assert (row["best_spec"], row["speedup"], row["spec_tok_s"]) == ("draft cost", 1.05, 2.0)


def test_duration_counts_sittings(sources):
    dur = study.duration_table(sources).set_index("store")
    assert dur.loc["fast", "settings"] == "precision not recorded, 64 new tokens, greedy"  # the synthetic runs
    assert (dur.loc["fast", "runs"], dur.loc["fast", "sittings"]) == (RUNS, 1)
    # one run a minute, each 30 s long: first run's 30 s, then 60 s per following run
    assert dur.loc["fast", "wall_s"] == pytest.approx(30.0 + 60.0 * (RUNS - 1))
    assert dur.loc["slow", "sittings"] == 2  # a two-hour pause starts a second sitting; it is not counted
    assert dur.loc["slow", "wall_s"] == pytest.approx(2 * 30.0 + 60.0 * (RUNS - 2))
    assert dur.loc["slow", "generation_s"] == pytest.approx(30.0 * RUNS)
    assert dur.loc["slow", "first"] == "2026-12-01T05:01:00+00:00"


def test_settings_read_the_target_precision_each_store_records():
    """The precision is the configuration's: a store that records it per run keeps it (an int8 configuration's
    recorded ``float32+int8`` is not quantized twice), an older store's sweep ``--dtype`` is mapped by the
    configuration's rule, llama.cpp is ``gguf``, and an unknown label keeps what the store says."""
    import pandas as pd

    def settings(label: str, dtype: str) -> str:
        runs = pd.DataFrame({"config_label": [label], "dtype": [dtype], "max_new_tokens": [128],
                             "temperature": [0.0]})
        return study._settings(runs)

    assert settings("transformers-int8", "float32+int8") == "float32+int8, 128 new tokens, greedy"
    assert settings("transformers-int8", "float32") == "float32+int8, 128 new tokens, greedy"
    assert settings("transformers-bf16", "float32").startswith("bfloat16,")  # an older store: the sweep's dtype
    assert settings("transformers-bf16-int8", "bfloat16+int8").startswith("bfloat16+int8,")
    assert settings("llamacpp", "gguf").startswith("gguf,")
    assert settings("my-own-config", "float16+x").startswith("float16+x,")


def test_write_study_escapes_store_text_and_draws_the_headline(stores, tmp_path):
    listed = tmp_path / "fast_report" / "report.html"  # a per-store report is listed by its path, as text
    listed.parent.mkdir()
    listed.write_text("<html></html>")
    res = study.write_study(stores, tmp_path / "out", reports=[str(listed)])
    html = res.html.read_text()
    assert XSS not in html and "&lt;script&gt;" in html
    assert not res.figure.skipped and Path(res.figure.png).stat().st_size > 0
    for title in ("How to read this", "Headline", "Per prompt type", "The fastest way to generate",
                  "The stores and how long they took", "Per-store reports", "Appendix: definitions"):
        assert title in html
    assert html.index('id="how"') < html.index('id="study_headline"') < html.index('id="types"')  # reading order
    assert str(listed) in html
    md = res.markdown.read_text()
    # the headline's verdict over every configuration: pooled default policy per configuration, exactness
    assert "fp32 0.99x" in md  # pooled over its 12 prompts: sqrt(0.9 x 1.1)
    assert "per type on the configuration of the type's best cell it wins on" in md  # not one configuration's count
    assert "bf16 (fast) 23 of 25 (92%)" in md  # one draft K = 2 run per type left the target-only output
    assert "fp32 target-only on 1 of 2" in md
    assert np.isfinite(res.types["default_speedup"].astype(float)).all()


def test_markdown_never_links_or_loads_what_a_store_says(tmp_path):
    """A prompt type holding Markdown link or image syntax reaches report.md with that syntax broken (a viewer
    would otherwise load an outside image); the HTML escapes it as text."""
    evil = "![t](https://evil.example/t.png) [x](https://evil.example)"
    path = _store(tmp_path / "fast.db", "fast")
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET prompt_type = ? WHERE prompt_type = 'code'", (evil,))
    con.commit()
    con.close()
    res = study.write_study([path], tmp_path / "out")
    md = res.markdown.read_text()
    assert "](https" not in md and "![t]" not in md and "!\\[t]\\(https" in md
    assert "evil.example" in res.html.read_text() and "src=\"https" not in res.html.read_text()


def test_cli_study_and_its_errors(stores, tmp_path, capsys, monkeypatch):
    from specdec.entrypoints.cli import main as specdec_main
    from study.report import main

    out = tmp_path / "cli"
    assert main(["--db", str(stores[0]), "--db", str(stores[1]), "--out", str(out)]) == 0
    assert (out / "report.html").exists() and "2 stores" in capsys.readouterr().out
    # the tool has no study command: the study is run from the repository, not installed
    with pytest.raises(SystemExit) as exc:
        specdec_main(["study", "--db", str(stores[0]), "--out", str(tmp_path / "tool")])
    assert exc.value.code == 2 and not (tmp_path / "tool").exists()
    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / "fast.db").write_bytes(Path(stores[0]).read_bytes())
    # two stores of one file name in two folders are labelled by folder; the same path twice is refused
    assert study.store_labels([stores[0], twin / "fast.db"]) == [f"{tmp_path.name}/fast", "twin/fast"]
    with pytest.raises(ValueError, match="share the label '.*fast'"):
        study.load_sources([stores[0], stores[0]])
    # every path is checked before any store is analysed; an empty store is refused in one line
    with pytest.raises(FileNotFoundError, match="nowhere.db"):
        study.load_sources([stores[0], tmp_path / "nowhere.db"])
    empty = tmp_path / "empty.db"
    Store(empty).sweep().close()
    with pytest.raises(ValueError, match="no runs"):
        study.load_sources([empty])
    capsys.readouterr()
    assert main(["--db", str(tmp_path / "missing.db"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("study.report: error: ") and "missing.db" in err and err.count("\n") == 1
    # an empty --out is refused (Path("") would write into the current directory)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert main(["--db", str(stores[0]), "--out", " "]) == 2
    assert "--out is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        specdec_main(["report", "--db", str(stores[0]), "--out", " "])
    assert exc.value.code == 2 and "--out is empty" in capsys.readouterr().err
    assert not any((tmp_path / "cwd").iterdir())


@pytest.mark.parametrize("right", [2.0, 8.0])
def test_bar_labels_end_inside_the_axes_without_a_wide_margin(right):
    """The headline's labels are fitted on the renderer: the longest ends inside the axes and the axis stops
    just after it (the old padding in data units left the axis at 8.6 with its last label ending at 6.5)."""
    from specdec.report.figure_kit import fit_texts_right, new_figure

    fig = new_figure(10, 4)
    ax = fig.subplots()
    ax.barh([0, 1], [right - 1, 0.5], left=1.0)
    texts = [ax.text(right + 0.03, 0, "3.41x mixed:llamacpp-draft-bf16, draft cost", fontsize=7),
             ax.text(1.53, 1, "short", fontsize=7)]
    fit_texts_right(ax, texts, 0.9, right + 0.05)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    axes_right = ax.get_window_extent(r).x1
    ends = [t.get_window_extent(r).x1 for t in texts]
    assert max(ends) <= axes_right  # nothing drawn past the axes
    assert axes_right - max(ends) < 15  # and no empty band beyond the 6 px margin (a few px of rounding)
    assert ax.get_xlim()[0] == pytest.approx(0.9) and ax.get_xlim()[1] > right + 0.05


def _peer_store(path: Path, ours_over_peer: float, *, base: float, new_tokens: int = 128) -> Path:
    """Three code prompts (ids p-0..p-2, the same in every such store) of one configuration: per prompt B,
    draft K = 4, B, hf_generate, B, hf_assisted K = 4, B; our target-only and draft runs are
    `ours_over_peer` x (1 +- 2 %) as fast as transformers' (target-only at `base` tokens/s)."""
    st = Store(path).sweep(name=path.stem).costs(config_label="fp32")
    for p in range(3):
        common = {"prompt_id": f"p-{p}", "prompt_type": "code", "config_label": "fp32", "new_tokens": new_tokens}
        r = ours_over_peer * (1 + 0.02 * (p - 1))
        st.run(method="baseline", tokens_per_s=base, repeat=0, **common)
        st.run(method="draft", policy="fixed", k=4, tokens_per_s=2 * base, rounds=[(4, "1111")], num_drafted=4,
               num_accepted=4, num_rejections=0, matches_baseline=1, **common)
        st.run(method="baseline", tokens_per_s=base, repeat=1, **common)
        st.run(method="hf_generate", tokens_per_s=base / r, matches_baseline=1, **common)
        st.run(method="baseline", tokens_per_s=base, repeat=2, **common)
        st.run(method="hf_assisted", k=4, tokens_per_s=2 * base / r, matches_baseline=int(p > 0), **common)
        st.run(method="baseline", tokens_per_s=base, repeat=3, **common)
    return st.close()


def test_peer_comparisons_pool_prompts_of_several_stores_without_dividing_across_them(stores, tmp_path):
    """Two stores time the same prompt ids at very different speeds (two machines): the pooled ratio is the
    geometric mean of the six in-store ratios (1.2 on three prompts, 0.8 on three), never a ratio of one
    store's runs to the other's; a store of other settings (64 new tokens) is its own row; stores with no
    peer add nothing."""
    a = _peer_store(tmp_path / "peers_a.db", 1.2, base=10.0)
    b = _peer_store(tmp_path / "peers_b.db", 0.8, base=40.0)
    c = _peer_store(tmp_path / "peers_c.db", 1.5, base=10.0, new_tokens=64)
    peers = study.study_peers(study.load_sources([stores[0], a, b, c])).set_index(["config_label", "prompt_type", "peer"])
    pooled = peers.loc[("fp32, precision not recorded, 128 new tokens, greedy", "code", "hf_generate")]
    assert pooled["n_prompts"] == 6 and pooled["stores"] == "peers_a, peers_b"
    assert pooled["ratio"] == pytest.approx(np.sqrt(1.2 * 0.8), rel=1e-3)
    assert pooled["ratio_lo"] < pooled["ratio"] < pooled["ratio_hi"] and pooled["verdict"] != "win"
    assisted = peers.loc[("fp32, precision not recorded, 128 new tokens, greedy", "code", "hf_assisted K=4")]
    assert assisted["ratio"] == pytest.approx(pooled["ratio"], rel=1e-9)
    assert (assisted["ours_match"], assisted["peer_match"]) == (1.0, pytest.approx(4 / 6))
    other = peers.loc[("fp32, precision not recorded, 64 new tokens, greedy", "code", "hf_generate")]
    assert other["n_prompts"] == 3 and other["ratio"] == pytest.approx(1.5, rel=1e-3) and other["stores"] == "peers_c"
    assert "fast" not in ", ".join(peers["stores"])  # the fixture's stores time no peer
    assert study.study_peers(study.load_sources(stores)).empty


def test_peer_stores_enter_only_the_peer_section_and_the_durations(stores, tmp_path, capsys):
    from study.report import main

    a = _peer_store(tmp_path / "peers_a.db", 1.2, base=10.0)
    b = _peer_store(tmp_path / "peers_b.db", 0.8, base=40.0)
    res = study.write_study(stores[:2], tmp_path / "out", peer_dbs=[a, b])
    assert set(res.types["store"]) == {"fast", "slow"}  # no column or row of the peer stores' cells
    md = res.markdown.read_text()
    assert "Against transformers' own decoders" in md and "peers_a, peers_b" in md
    dur = md[md.index("The stores and how long they took"):]
    assert "peers_a" in dur and "peers_b" in dur
    without = study.write_study(stores[:2], tmp_path / "plain")
    assert "Against transformers' own decoders" not in without.markdown.read_text()
    assert main(["--db", str(stores[0]), "--peers-db", str(a), "--out", str(tmp_path / "cli")]) == 0
    assert "2 stores" in capsys.readouterr().out
    with pytest.raises(ValueError, match="at least one store"):
        study.write_study([], tmp_path / "none", peer_dbs=[a])
