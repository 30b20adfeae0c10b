"""Requantized llama.cpp targets on the tiny GGUF (SmolLM2-135M-Instruct Q4_1; requantizing it takes well
under a second): the cached file made once and reused, never a partial file, the runtime configurations that
select it, what `specdec costs` and a sweep record about the weights that ran (tensor weight types, weight
repacking, the ggml environment), old stores opening with the new column, one-line errors for a bad type,
and the greedy-agreement figures that state a requantized target's quality."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from specdec.measure.agreement import agreement, compare_outputs, greedy_ids
from specdec.models import requant
from specdec.runtimes import gguf as G
from specdec.runtimes import llamacpp as L

REPO = Path(__file__).resolve().parents[1]


def bulk(weight_types: dict) -> str:
    """The ggml type holding most bytes (JSON round trips do not keep `gguf_weight_types`' order)."""
    return max(weight_types, key=weight_types.get)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh, private model cache (requantized files are written under it)."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECDEC_QUIET", "1")
    return tmp_path / "cache"


@pytest.fixture
def quantizer_calls(monkeypatch) -> list:
    """Count the calls of llama.cpp's quantizer (`requantize_gguf`), which still runs."""
    calls = []
    real = G.requantize_gguf

    def counting(src, dst, weight_type, **kw):
        calls.append((Path(src), Path(dst), weight_type))
        return real(src, dst, weight_type, **kw)

    monkeypatch.setattr(G, "requantize_gguf", counting)
    return calls


# -------------------------------------------------------------------------------------------- the file


def test_requantized_file_is_made_once_and_reused(smollm2_gguf, cache, quantizer_calls):
    path = requant.requantized_gguf(smollm2_gguf, "q4_0", threads=1)
    assert path.is_file() and path.parent == cache / "gguf" / "requantized"
    assert path.name.startswith("SmolLM2-135M-Instruct.Q4_1-") and path.name.endswith(".Q4_0.gguf")
    assert next(iter(G.gguf_weight_types(path))) == "Q4_0"  # the bulk of the weights is Q4_0 now
    assert len(quantizer_calls) == 1
    mtime = path.stat().st_mtime_ns
    again = requant.requantized_gguf(smollm2_gguf, "Q4_0", threads=1)
    assert again == path and path.stat().st_mtime_ns == mtime
    assert len(quantizer_calls) == 1  # reused, not made again
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, f".{path.name}.lock",
                                                                    f"{path.name}.sha256.json"])


def test_a_preset_gguf_in_the_cache_keeps_its_plain_name(cache):
    src = cache / "gguf" / "model-q4_k_m.gguf"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"x")
    assert requant.requantized_path(src, "iq4_nl") == cache / "gguf" / "requantized" / "model-q4_k_m.IQ4_NL.gguf"


def test_a_killed_run_never_leaves_a_file_that_is_used(smollm2_gguf, cache, monkeypatch):
    dst = requant.requantized_path(smollm2_gguf, "Q8_0")

    def killed(src, part, weight_type, **kw):  # writes half a file, then the process "dies"
        Path(part).write_bytes(b"GGUF half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(G, "requantize_gguf", killed)
    with pytest.raises(KeyboardInterrupt):
        requant.requantized_gguf(smollm2_gguf, "Q8_0", threads=1)
    assert not dst.exists()
    # a SIGKILL leaves its temporary files behind: they are neither used nor kept
    leftover = dst.with_name(f".{dst.name}.12345.partial")
    leftover.write_bytes(b"GGUF truncated")
    leftover.with_name(leftover.name + ".part").write_bytes(b"GGUF truncated")
    monkeypatch.undo()
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(cache))
    monkeypatch.setenv("SPECDEC_QUIET", "1")
    path = requant.requantized_gguf(smollm2_gguf, "Q8_0", threads=1)
    assert path == dst and next(iter(G.gguf_weight_types(path))) == "Q8_0"
    assert not list(dst.parent.glob("*.partial*"))


def test_a_bad_type_is_one_line_before_anything_is_written(smollm2_gguf, cache):
    with pytest.raises(ValueError, match="unknown GGUF weight type 'Q5_X'; choose one of Q4_0, IQ4_NL") as exc:
        requant.requantized_gguf(smollm2_gguf, "Q5_X")
    assert "\n" not in str(exc.value)
    assert not (cache / "gguf").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--backend", "llamacpp", "--gguf-type", "Q5_X"], "unknown GGUF weight type 'Q5_X'"),
    (["--gguf-type", "Q4_0"], "--gguf-type applies to the llama.cpp backend only"),
])  # fmt: skip
def test_cli_bad_gguf_type_is_one_line(smollm2_gguf, cache, capsys, argv, message):
    from specdec.entrypoints.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--target", str(smollm2_gguf), "--draft", str(smollm2_gguf), "--prompt", "hi", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdec: error: ") and message in err and len(err.splitlines()) == 1
    assert not (cache / "gguf").exists()


# ---------------------------------------------------------------------------------------- selection


def test_runtime_configs_select_the_type_for_the_target():
    from specdec.catalogue.runtimes import RUNTIME_CONFIGS, config_for_backends

    for label, t in (("llamacpp-q4_0", "Q4_0"), ("llamacpp-iq4_nl", "IQ4_NL"), ("llamacpp-q8_0", "Q8_0")):
        rc = RUNTIME_CONFIGS[label]
        assert (rc.target_backend, rc.draft_backend, rc.gguf_type) == ("llamacpp", "llamacpp", t)
        assert rc.load_kwargs("float32") == {"dtype": "float32", "gguf_type": t}
        assert rc.target_precision("float32") == f"gguf:{t}"
        requant.check_gguf_type(t)
    assert RUNTIME_CONFIGS["llamacpp"].target_precision("float32") == "gguf"
    assert "gguf_type" not in RUNTIME_CONFIGS["llamacpp"].load_kwargs("float32")
    assert config_for_backends("llamacpp", "llamacpp") == "llamacpp"  # --backend llamacpp: the shipped file
    for label, t in (("llamacpp-q4_0-padded", "Q4_0"), ("llamacpp-iq4_nl-padded", "IQ4_NL")):
        rc = RUNTIME_CONFIGS[label]
        assert rc.pad_verify and rc.gguf_type == t and rc.target_precision("float32") == f"gguf:{t}"
        assert not RUNTIME_CONFIGS[label.removesuffix("-padded")].pad_verify


@pytest.mark.slow  # loads the tiny GGUF's tokenizer or pair: 10-50 s on a shared 2-core box
def test_load_pair_requantizes_the_target_only(smollm2_gguf, cache):
    from specdec.runtimes.loading import load_pair

    pair = load_pair(str(smollm2_gguf), str(smollm2_gguf), backend="llamacpp", threads=1, n_ctx=256,
                     gguf_type="iq4_nl")
    try:
        assert pair.target.gguf_type == "IQ4_NL" and pair.draft.gguf_type is None
        assert pair.target.backend.model_path.endswith(".IQ4_NL.gguf")
        assert pair.draft.backend.model_path == str(smollm2_gguf)
    finally:
        pair.target.backend.close()
        pair.draft.backend.close()
    with pytest.raises(ValueError, match="llama.cpp backend only"):
        load_pair(str(smollm2_gguf), None, backend="transformers", gguf_type="Q4_0")


# ------------------------------------------------------------------------------------------ records


def _costs(argv, capsys):
    from specdec.entrypoints.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["costs", "--backend", "llamacpp", "--max-n", "3", "--repeats", "1", "--context-tokens", "8",
              "--threads", "1", "--bandwidth-mib", "4", *argv])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.slow  # loads the tiny GGUF's tokenizer or pair: 10-50 s on a shared 2-core box
def test_costs_json_records_weight_types_repacking_and_ggml_env(smollm2_gguf, cache, capsys, monkeypatch):
    monkeypatch.setenv("GGML_CPU_TILED_MM", "0")
    monkeypatch.delenv("GGML_CPU_TILED_MM_FORCE", raising=False)
    out = json.loads(_costs(["--target", str(smollm2_gguf), "--draft", str(smollm2_gguf), "--gguf-type", "Q4_0",
                             "--json"], capsys).strip().splitlines()[-1])
    rt = out["runtime"]
    assert out["gguf_type"] == "Q4_0"
    assert rt["target"]["gguf_type"] == "Q4_0" and bulk(rt["target"]["weight_types"]) == "Q4_0"
    assert rt["draft"]["gguf_type"] is None and bulk(rt["draft"]["weight_types"]) == "Q4_1"
    on, note = L.repack_default()
    assert rt["target"]["repack"] is on and rt["target"]["repack_note"] == note
    assert rt["ggml_env"] == {"GGML_CPU_TILED_MM": "0", "GGML_CPU_TILED_MM_FORCE": None}


@pytest.mark.slow  # loads the tiny GGUF's tokenizer or pair: 10-50 s on a shared 2-core box
def test_costs_text_says_when_amx_keeps_repacking_off(smollm2_gguf, cache, capsys, monkeypatch):
    import specdec.runtimes.precision

    monkeypatch.setattr(specdec.runtimes.precision, "cpu_flags", lambda: {"avx512f", "amx_int8"})
    text = _costs(["--target", str(smollm2_gguf), "--draft", str(smollm2_gguf)], capsys)
    lines = text.splitlines()
    assert any(line.startswith("target on llama.cpp: SmolLM2-135M-Instruct.Q4_1.gguf; weights Q4_1")
               and line.endswith("repacking off") for line in lines)
    amx = [line for line in lines if "amx_int8" in line]
    assert len(amx) == 1 and "repacking off" in amx[0] and "AMX" in amx[0]
    assert "ggml environment: GGML_CPU_TILED_MM=" in text


def test_no_amx_note_where_repacking_runs():
    from specdec.runtimes.llamacpp_record import amx_note

    record = {"target": {"runtime": "llamacpp", "repack": True}, "draft": None}
    assert amx_note(record, flags={"avx512f"}) is None
    asked_off = {"target": {"runtime": "llamacpp", "repack": False}, "draft": None}
    assert amx_note(asked_off, flags={"avx512f"}) is None  # off because asked for, not because of AMX
    assert "amx_tile" in amx_note(asked_off, flags={"amx_tile"})


@pytest.mark.slow  # loads the tiny GGUF's tokenizer or pair: 10-50 s on a shared 2-core box
def test_a_tiny_sweep_stores_the_type_that_ran_and_the_runtime_record(smollm2_gguf, cache, prompt_file, tmp_path):
    from specdec.bench import sweep as S
    from specdec.bench.store import Store

    cfg = S.make_config({
        "target": str(smollm2_gguf), "draft": str(smollm2_gguf), "prompts": str(prompt_file), "prompt_types": "code",
        "methods": "baseline,draft", "ks": "2", "secondary_ks": "2", "max_new_tokens": 6, "peers": False, "policies": "none",
        "cost_repeats": 1, "calibration_repeats": 1, "warmup_tokens": 1, "threads": 1,
        "configs": "llamacpp,llamacpp-q4_0",
    })  # fmt: skip
    db = tmp_path / "s.db"
    result = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    assert result.failed == 0
    with Store(db, readonly=True) as store:
        rows = store.conn.execute("SELECT config_label, dtype FROM runs WHERE error IS NULL").fetchall()
        records = store.runtime_records(result.sweep_id)
        machine = json.loads(store.conn.execute("SELECT machine_json FROM sweeps").fetchone()[0])
    assert {tuple(r) for r in rows} == {("llamacpp", "gguf"), ("llamacpp-q4_0", "gguf:Q4_0")}
    q4 = records["llamacpp-q4_0"]
    assert bulk(q4["target"]["weight_types"]) == "Q4_0" and q4["target"]["gguf_type"] == "Q4_0"
    assert bulk(q4["draft"]["weight_types"]) == "Q4_1"
    assert bulk(records["llamacpp"]["target"]["weight_types"]) == "Q4_1"
    assert q4["target"]["repack"] is L.repack_default()[0]
    assert set(q4["ggml_env"]) == {"GGML_CPU_TILED_MM", "GGML_CPU_TILED_MM_FORCE"}
    assert set(machine["ggml_env"]) == {"GGML_CPU_TILED_MM", "GGML_CPU_TILED_MM_FORCE"}

    # the side-by-side table: every speculative cell against its own and the fastest target-only decoding
    from conftest import load_benchmark

    bench = load_benchmark("llamacpp_side_by_side")
    table = bench.side_by_side(db)
    assert {k: v["dtype"] for k, v in table["configs"].items()} == {"llamacpp": "gguf", "llamacpp-q4_0": "gguf:Q4_0"}
    fastest = table["fastest"]
    assert table["configs"][fastest]["baseline_tokens_per_s"] == max(
        c["baseline_tokens_per_s"] for c in table["configs"].values())
    cells = {(c["config_label"], c["method"], c["k"]): c for c in table["cells"]}
    assert {("llamacpp", "draft", 2), ("llamacpp-q4_0", "draft", 2)} <= set(cells)
    mine = cells[(fastest, "draft", 2)]
    assert mine["speedup_own"] == pytest.approx(mine["speedup_fastest"]) and mine["speedup_own"] > 0
    assert "<- fastest target-only" in bench.format_table(table)


def test_an_existing_store_opens_and_gains_the_runtime_column(tmp_path):
    from specdec.bench.store import Store

    src = REPO / "results" / "main_job.db"
    if not src.is_file():
        pytest.skip("results/main_job.db is not in this checkout")
    db = tmp_path / "old.db"
    shutil.copy(src, db)
    before = sqlite3.connect(db)
    old_cols = [r[1] for r in before.execute("PRAGMA table_info(roofline)")]
    old_rows = before.execute("SELECT * FROM roofline").fetchall()
    sid = before.execute("SELECT sweep_id FROM sweeps").fetchone()[0]
    before.close()
    assert "runtime_json" not in old_cols and old_rows
    with Store(db) as store:
        assert store.runtime_records(sid) == {}  # old rows: no record (NULL)
        kept = store.conn.execute(f"SELECT {', '.join(old_cols)} FROM roofline").fetchall()
        assert [tuple(r) for r in kept] == [tuple(r) for r in old_rows]
        record = {"target": {"runtime": "llamacpp", "weight_types": {"Q4_0": 10}, "repack": True}}
        store.save_roofline(sid, "llamacpp-q4_0", 10, None, {"gbps": 1.0}, runtime=record)
        assert store.runtime_records(sid) == {"llamacpp-q4_0": record}


# ------------------------------------------------------------------------------------------ quality


def test_agreement_figures():
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == {"first_divergence": 4, "identical_share": 1.0,
                                                     "identical": True}
    assert agreement([1, 2, 9, 4], [1, 2, 3, 4]) == {"first_divergence": 2, "identical_share": 0.75,
                                                     "identical": False}
    assert agreement([1], [1, 2]) == {"first_divergence": 1, "identical_share": 0.5, "identical": False}
    table = compare_outputs({"a": [[1, 2], [3, 4]]}, {"ref": [[1, 2], [3, 5]]}, ["p1", "p2"])
    a = table["a"]["ref"]
    assert (a["prompts_identical"], a["prompts"], a["mean_first_divergence"], a["mean_identical_share"]) == (
        1, 2, 1.5, 0.75)
    with pytest.raises(ValueError, match="1 outputs for 2 prompts"):
        compare_outputs({"a": [[1]]}, {"ref": [[1], [2]]})


@pytest.mark.slow  # loads the tiny GGUF's tokenizer or pair: 10-50 s on a shared 2-core box
def test_quality_of_a_requantized_target_on_tiny_models(smollm2_gguf, cache):
    from conftest import load_benchmark

    bench = load_benchmark("llamacpp_candidates")
    cands = bench.candidates(smollm2_gguf, ["Q8_0", "Q4_0"], threads=1)
    assert [c[0] for c in cands][2:] == ["Q8_0 (pure) repack on", "Q4_0 (pure) repack on"]
    shipped_label = next(label for label, path, repack in cands if path == smollm2_gguf and repack)
    backends = {label: L.load_llamacpp(path, n_ctx=256, n_threads=1, extra_buffers=repack)
                for label, path, repack in cands if label == shipped_label or path != smollm2_gguf}
    reference = L.load_llamacpp(smollm2_gguf, n_ctx=256, n_threads=1)  # stands in for the fp32 reference
    try:
        shipped = backends[shipped_label]
        ids = {"code": shipped.tokenize("def fibonacci(n):\n"), "prose": shipped.tokenize("The capital of France")}
        q = bench.quality(backends, ids, 12, shipped_label, fp32=reference)
        own = q["agreement"][shipped_label]["shipped"]
        assert own["prompts_identical"] == 2 and own["mean_identical_share"] == 1.0  # itself
        assert q["outputs"]["fp32 reference"] == q["outputs"][shipped_label]
        for label in ("Q8_0 (pure) repack on", "Q4_0 (pure) repack on"):
            for ref in ("shipped", "fp32"):
                a = q["agreement"][label][ref]
                assert a["prompts"] == 2 and 0 <= a["mean_first_divergence"] <= 12
                assert set(a["per_prompt"]) == {"code", "prose"}
                outs = q["outputs"][label]
                assert a["per_prompt"]["code"] == agreement(outs[0], q["outputs"][shipped_label][0])
        # the figures are the models' own greedy outputs
        assert q["outputs"]["Q8_0 (pure) repack on"][0] == greedy_ids(backends["Q8_0 (pure) repack on"],
                                                                      ids["code"], 12)
    finally:
        for be in (*backends.values(), reference):
            be.close()


def test_side_by_side_per_type_picks_the_fastest_target_only_and_the_best_cell_against_it(tmp_path):
    """A store made by hand: configuration "b" decodes code faster target-only, "a" prose; per type the table
    must pick that configuration and price every speculative cell against it, over the type's prompts."""
    import sqlite3

    from conftest import load_benchmark

    db = tmp_path / "side.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE sweeps (sweep_id TEXT)")
    conn.execute("CREATE TABLE runs (sweep_id TEXT, config_label TEXT, dtype TEXT, prompt_id TEXT, prompt_type TEXT, "
                 "method TEXT, policy TEXT, k INTEGER, tokens_per_s REAL, matches_baseline INTEGER, error TEXT)")
    conn.execute("INSERT INTO sweeps VALUES ('s')")
    rows = []
    base = {("a", "code"): 10.0, ("b", "code"): 20.0, ("a", "prose"): 30.0, ("b", "prose"): 20.0}
    spec = {("a", "code"): (24.0, 25.0, 26.0), ("b", "code"): (22.0, 22.0, 22.0),
            ("a", "prose"): (36.0, 36.0), ("b", "prose"): (30.0, 30.0)}
    for (cfg, t), values in spec.items():
        for i, v in enumerate(values):
            pid = f"{t}-{i}"
            rows += [("s", cfg, "gguf", pid, t, "baseline", None, None, base[cfg, t], 1, None),
                     ("s", cfg, "gguf", pid, t, "suffix", "cost", 16, v, 1, None),
                     ("s", cfg, "gguf", pid, t, "baseline", None, None, base[cfg, t], 1, None)]
    conn.executemany("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
    conn.commit()
    conn.close()

    bench = load_benchmark("llamacpp_side_by_side")
    table = bench.side_by_side(db)
    code, prose = table["types"]["code"], table["types"]["prose"]
    assert code["fastest"] == "b" and prose["fastest"] == "a"
    assert code["target_only"] == pytest.approx({"a": 10.0, "b": 20.0})
    assert code["best"]["config_label"] == "a" and code["best"]["prompts"] == 3
    assert code["best"]["speedup"] == pytest.approx((24 * 25 * 26) ** (1 / 3) / 20)  # against b, not its own a
    assert code["best"]["lo"] < code["best"]["speedup"] < code["best"]["hi"]
    assert prose["best"]["config_label"] == "a" and prose["best"]["speedup"] == pytest.approx(1.2)
    assert "code" in bench.format_table(table) and "1.25x" in bench.format_table(table)
