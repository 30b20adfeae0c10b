"""The `specdec` CLI on tiny local checkpoints: JSON output, baseline comparison, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import one_row


def run(*args, env=None):
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, env=e, check=False,
                          timeout=300)


def test_generate_json_with_baseline(tiny_pair, near_draft_dir):
    p = run("generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir),
            "--prompt", "hello world the quick brown fox", "--k", "4", "--max-new-tokens", "24",
            "--baseline", "--json", "--threads", "1", "--drafter", "draft")
    assert p.returncode == 0, p.stderr
    out = one_row(json.loads(p.stdout))  # stdout is the JSON object alone (the text goes to stderr)
    for key in ("token_ids", "text", "finish_reason", "num_rounds", "num_drafted", "num_accepted",
                "acceptance_rate", "block_efficiency", "tokens_per_s", "ttft_s", "baseline_token_ids",
                "baseline_tokens_per_s", "speedup"):
        assert key in out, key
    assert len(out["token_ids"]) == 24
    assert out["token_ids"] == out["baseline_token_ids"] and out["identical_to_baseline"]
    assert out["num_drafted"] > 0 and 0 < out["num_accepted"] <= out["num_drafted"]


def test_sampled_generate_json_records_its_sampling_and_baseline_says_a_difference_is_expected(tiny_pair):
    p = run("generate", "--target", str(tiny_pair.target_dir), "--draft", str(tiny_pair.draft_dir),
            "--prompt", "hello world the quick brown fox", "--k", "3", "--max-new-tokens", "12", "--temperature",
            "0.7", "--top-k", "40", "--top-p", "0.95", "--seed", "3", "--baseline", "--json", "--threads", "1",
            "--drafter", "draft")
    assert p.returncode == 0, p.stderr
    out = one_row(json.loads(p.stdout))
    assert (out["temperature"], out["top_k"], out["top_p"], out["seed"]) == (0.7, 40, 0.95, 3)
    assert not out["identical_to_baseline"]  # two draws of 12 tokens from a random 1000-token model
    assert "DIFFERENT" not in p.stderr and "outputs differ (sampled" in p.stderr


def test_generate_defaults_to_the_machines_fastest_exact_dtype_and_names_it(tiny_pair):
    """The default dtype is `specdec.runtimes.precision.default_dtype` (bf16 where the CPU has native bf16 kernels);
    --dtype float32 asks for fp32; the statistics line and the JSON name what ran."""
    from specdec.runtimes.precision import default_dtype

    args = ("generate", "--target", str(tiny_pair.target_dir), "--draft", str(tiny_pair.draft_dir),
            "--prompt", "hello world", "--k", "2", "--max-new-tokens", "6", "--threads", "1")
    p = run(*args, "--json")
    assert p.returncode == 0, p.stderr
    out = one_row(json.loads(p.stdout))
    assert out["dtype"] == out["draft_dtype"] == default_dtype("cpu") and out["backend"] == "transformers"
    assert f"ran transformers {default_dtype('cpu')}" in p.stderr
    p = run(*args, "--dtype", "float32")
    assert p.returncode == 0, p.stderr
    assert "ran transformers float32" in p.stdout
    p = run(*args, "--dtype", "float32", "--draft-dtype", "auto", "--json")
    assert json.loads(p.stdout)["runtime"]["draft_dtype"] == default_dtype("cpu")


def test_divergence_line_says_what_a_difference_means_in_each_dtype():
    from specdec.entrypoints.output import divergence_line

    div = {"step": 7, "eager_token": 11, "compiled_token": 12, "margin": 0.0312}
    bf16 = divergence_line(div, "bfloat16")
    assert bf16.startswith("first difference at new token 7: baseline 11, speculative 12; target top-2 logit "
                           "margin there 0.0312")
    assert "near-tie" in bf16 and "--dtype float32 gives token-identical output" in bf16
    assert "unexpected" in divergence_line(div, "float32") and "near-tie" not in divergence_line(div, "float32")
    assert "llama.cpp" in divergence_line(div, None) and "near-tie" in divergence_line(div, None)


def test_generate_zero_tokens_with_baseline_prints_strict_json(tiny_pair):
    p = run("generate", "--target", str(tiny_pair.target_dir), "--draft", str(tiny_pair.draft_dir),
            "--prompt", "hello", "--k", "2", "--max-new-tokens", "0", "--baseline", "--json", "--threads", "1")
    assert p.returncode == 0, p.stderr

    def no_nan(name):
        raise AssertionError(f"{name} in JSON output")

    out = one_row(json.loads(p.stdout.strip().splitlines()[-1], parse_constant=no_nan))
    assert out["token_ids"] == [] and out["baseline_tokens_per_s"] is None and out["speedup"] is None


def test_generate_ngram_and_policy(tiny_pair):
    p = run("generate", "--target", str(tiny_pair.target_dir), "--prompt", "abc abc abc abc abc abc",
            "--drafter", "ngram", "--policy", "heuristic", "--k", "2", "--max-new-tokens", "12", "--json")
    assert p.returncode == 0, p.stderr
    out = one_row(json.loads(p.stdout.strip().splitlines()[-1]))
    n = len(out["token_ids"])
    assert n == 12 or (n < 12 and out["finish_reason"] == "eos")
    assert len(out["rounds_k"]) == out["num_rounds"]
    # the oracle: target-only greedy decoding of the same prompt (prompt lookup + heuristic K must not change
    # a single token), and prompt lookup did draft on this repetitive prompt
    from specdec.engine.decoding import autoregressive_generate
    from specdec.prompts import encode_prompt
    from specdec.runtimes.loading import load_pair

    pair = load_pair(str(tiny_pair.target_dir), None)
    ids = encode_prompt(pair.tokenizer, "abc abc abc abc abc abc")
    ref = autoregressive_generate(pair.target.backend, ids, 12, eos_ids=pair.eos_ids, vocab_size=pair.vocab_size)
    assert out["token_ids"] == ref.token_ids and out["finish_reason"] == ref.finish_reason
    assert out["num_drafted"] > 0


def test_generate_defaults_to_the_cost_policy_unless_k_is_given(tiny_pair, near_draft_dir, tmp_path):
    from specdec.catalogue.policies import resolve_policy

    def default_policy(name, k):
        entry, k = resolve_policy(name, k)
        return entry.name, k

    assert default_policy(None, None) == ("cost", 64)
    assert default_policy(None, 3) == ("fixed", 3)
    assert default_policy("Heuristic", None) == ("heuristic", 4)
    assert default_policy("confidence", None) == ("confidence", 16)
    assert default_policy("cost", 8) == ("cost", 8)
    args = ("generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir),
            "--prompt", "hello world the quick brown fox", "--max-new-tokens", "16", "--baseline", "--json",
            "--threads", "1")
    env = {"SPECDEC_CACHE_DIR": str(tmp_path)}
    p = run(*args, env=env)
    assert p.returncode == 0, p.stderr
    out = one_row(json.loads(p.stdout.strip().splitlines()[-1]))
    assert (out["policy"], out["k"]) == ("cost", 64)
    assert out["identical_to_baseline"] and len(out["rounds_k"]) == out["num_rounds"]
    assert all(0 <= k <= 64 for k in out["rounds_k"])
    # only an adaptive policy estimates alpha; each round records the estimate it chose K with
    assert len(out["rounds_alpha"]) == out["num_rounds"] and all(0 <= a <= 1 for a in out["rounds_alpha"])
    assert "costs measured" in p.stderr and len(list((tmp_path / "costs").glob("*.json"))) == 1
    assert "measuring forward costs" in p.stderr  # a progress line before the measurement
    again = run(*args, env=env)  # the second run reuses the measurement
    assert again.returncode == 0 and "costs from" in again.stderr, again.stderr
    assert "measuring" not in again.stderr
    fresh = run(*args, "--remeasure-costs", env=env)  # ... unless asked to measure again
    assert fresh.returncode == 0 and "costs measured" in fresh.stderr, fresh.stderr
    assert len(list((tmp_path / "costs").glob("*.json"))) == 1  # the same setup's file, overwritten
    fixed = run(*args[:-4], "--k", "2", "--json", "--threads", "1", env=env)
    out = one_row(json.loads(fixed.stdout.strip().splitlines()[-1]))
    assert (out["policy"], out["k"]) == ("fixed", 2) and set(out["rounds_k"]) <= {0, 1, 2}
    assert out["rounds_alpha"] == [None] * out["num_rounds"]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--k", "0"], "--k must be an integer >= 1"),
        (["--policy", "bandit"], "unknown --policy 'bandit'"),
        (["--threads", "-1"], "--threads must be >= 1"),
        # the default cost policy would measure costs first: the overflow must be reported before that
        (["--max-new-tokens", "100000"], "exceeds the target's context"),
        (["--prompt", "   "], "prompt is empty"),
        (["--target", "/nonexistent/model-dir"], "/nonexistent/model-dir"),
        # sampling settings are named by their flags; nonsense is refused, not run
        (["--temperature", "inf"], "--temperature must be >= 0 and finite"),
        (["--temperature", "0.7", "--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--top-p", "0.5"], "--top-p 0.5 needs --temperature > 0"),
        (["--top-k", "5"], "--top-k 5 needs --temperature > 0"),
    ],
)
def test_bad_input_is_one_line(tiny_pair, extra, needle):
    args = ["generate", "--target", str(tiny_pair.target_dir), "--draft", str(tiny_pair.draft_dir),
            "--prompt", "hello"]
    # later flags win in typer; put the override last
    p = run(*args, *extra)
    assert p.returncode == 2
    lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("specdec: error:"), p.stderr
    assert needle in lines[0]
    assert "Traceback" not in p.stderr


def test_incompatible_tokenizers_refused(tiny_pair, tmp_path, smollm2_gguf):
    p = run("generate", "--target", str(tiny_pair.target_dir), "--draft", str(smollm2_gguf), "--prompt", "hi",
            "--draft-backend", "llamacpp")
    assert p.returncode == 2
    assert "incompatible tokenizers" in p.stderr and "Traceback" not in p.stderr


def test_unknown_pair_and_models_listing():
    p = run("generate", "--pair", "no-such-pair", "--prompt", "x")
    assert p.returncode == 2 and "no-such-pair" in p.stderr and "Traceback" not in p.stderr
    p = run("models", "--json")
    assert p.returncode == 0
    names = [r["name"] for r in json.loads(p.stdout)]
    assert {"qwen2.5-coder", "gpt2-medium", "gpt2-large"} <= set(names)


def test_models_listing_piped_keeps_every_name_and_path_whole():
    """Piped (not a terminal): one tab-separated row per preset, nothing cut, so `| grep` finds it."""
    rows = json.loads(run("models", "--json").stdout)
    p = run("models", env={"COLUMNS": "40"})
    assert p.returncode == 0, p.stderr
    assert "\u2026" not in p.stdout  # no ellipsis anywhere
    lines = p.stdout.splitlines()
    assert lines[0].split("\t")[0] == "preset"
    for r in rows:
        (line,) = [ln for ln in lines[1:] if ln.split("\t")[0].split(" ")[0] == r["name"]]
        assert f"{r['draft']} -> {r['target']}" in line
    assert any("qwen2.5-coder" in ln for ln in lines if "(default)" in ln)


def test_models_listing_on_a_narrow_terminal_folds_but_never_cuts():
    """On a 60-column terminal the table folds long cells onto more lines; preset names stay whole."""
    import pty
    import re

    rows = json.loads(run("models", "--json").stdout)
    main, sub = pty.openpty()
    env = dict(os.environ, COLUMNS="60", LINES="50", OMP_NUM_THREADS="1", TERM="dumb")
    proc = subprocess.Popen([sys.executable, "-m", "specdec", "models"], stdout=sub, stderr=sub, env=env)
    os.close(sub)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    os.close(main)
    screen = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", b"".join(chunks).decode())
    assert "\u2026" not in screen
    assert max(len(ln) for ln in screen.splitlines()) <= 60
    for r in rows:
        assert re.search(rf"(^|\W){re.escape(r['name'])}(\W|$)", screen), r["name"]


def test_c20_a_plan_that_cannot_fit_is_refused_before_any_run(tiny_pair, tmp_path):
    """The built-in code prompts (~275 tiny-tokenizer tokens) overflow the tiny 128-token context.
    The sweep names them in one line before any run (nothing is attempted or stored); with
    --skip-long-prompts it leaves them out, says so, and runs the rest."""
    import sqlite3

    db = tmp_path / "s.db"
    args = ["sweep", "--target", str(tiny_pair.target_dir), "--draft", str(tiny_pair.draft_dir), "--ks", "1",
            "--max-new-tokens", "8", "--db", str(db), "--no-peers", "--methods", "baseline", "--policies",
            "none", "--no-progress", "--threads", "1"]
    p = run(*args, "--prompt-types", "code")
    assert p.returncode == 2, p.stdout + p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert line.startswith("specdec: error:") and "code-01" in line and "do not fit" in line
    assert "--skip-long-prompts" in line and "Traceback" not in p.stderr
    with sqlite3.connect(db) as c:  # refused before anything ran: no run, not even the sweep's row
        assert c.execute("select count(*) from runs").fetchone()[0] == 0
        assert c.execute("select count(*) from sweeps").fetchone()[0] == 0
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "short-01", "type": "natural", "prompt": "the quick brown fox"}) + "\n"
                       + json.dumps({"id": "long-01", "type": "code", "prompt": "def f(x): return x " * 60}) + "\n")
    p = run(*args, "--prompts", str(prompts), "--skip-long-prompts")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "skipping 2 runs of 1 prompt(s)" in p.stdout and "long-01" in p.stdout  # its 2 baseline runs
    with sqlite3.connect(db) as c:
        prompts_run = {r[0] for r in c.execute("select prompt_id from runs where error is null")}
    assert prompts_run == {"short-01"}


def test_c3_divergence_is_reported_with_margin(tiny_pair, near_draft_dir, monkeypatch, capsys):
    """Case C3: when greedy speculative output differs from target-only (as half-precision kernels can make
    it), `generate --baseline` reports the first differing step and the target's top-2 logit margin there.
    The divergence is simulated by flipping one token of the speculative output."""
    # specdec.bench.methods binds speculative_generate by name: first imported under the patch, it would keep
    # the flipped one for every later sweep in this process
    import specdec.bench.methods  # noqa: F401
    from specdec.engine import decoding
    from specdec.entrypoints.cli import main

    real = decoding.speculative_generate

    def flipped(*args, **kwargs):
        res = real(*args, **kwargs)
        if len(res.token_ids) > 5:
            res.token_ids[5] = (res.token_ids[5] + 1) % 1000
        return res

    monkeypatch.setattr(decoding, "speculative_generate", flipped)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompt",
              "hello world the quick brown fox", "--k", "3", "--max-new-tokens", "12", "--baseline", "--json"])
    assert exit_info.value.code in (0, None)
    captured = capsys.readouterr()
    out = one_row(json.loads(captured.out.strip().splitlines()[-1]))
    assert out["identical_to_baseline"] is False
    div = out["divergence"]
    assert div["step"] == 5 and div["eager_token"] == out["baseline_token_ids"][5]
    assert div["compiled_token"] == out["token_ids"][5] and div["margin"] > 0
    assert div["top1"] == out["baseline_token_ids"][5]  # greedy baseline took the target's argmax
    assert "first difference at new token 5" in captured.err
    assert out["dtype"] in captured.err.split("first difference", 1)[1]  # says which dtype it happened in


def _long_sweep_args(tiny_pair, tmp_path, db) -> list[str]:
    """A `specdec sweep` command line on the tiny pair into `db`, long enough (~100 runs of 100 tokens, one
    thread) that a test can act on it while it runs."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p-{i:02d}", "type": "natural", "prompt": f"the fox {i} runs"})
                               + "\n" for i in range(8)))
    return [sys.executable, "-m", "specdec", "sweep", "--target", str(tiny_pair.target_dir), "--draft",
            str(tiny_pair.draft_dir), "--prompts", str(prompts), "--ks", "1,2,4,8,16", "--max-new-tokens", "100",
            "--db", str(db), "--no-peers", "--policies", "none", "--no-progress", "--threads", "1"]


def test_c23_a_second_sweep_on_a_busy_store_is_told_so(tiny_pair, tmp_path):
    """Two identical sweeps on one --db, the second (with --resume) started while the first runs.
    The second waits (bounded by --wait-for-store) and stops with a message naming the other process;
    nothing is lost or duplicated; rerun afterwards, it finds everything done."""
    import sqlite3
    import time

    db = tmp_path / "busy.db"
    args = _long_sweep_args(tiny_pair, tmp_path, db)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lock = tmp_path / "busy.db.lock"
    deadline = time.monotonic() + 120
    while not (lock.exists() and "pid" in lock.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    second = subprocess.run([*args, "--resume", "--wait-for-store", "1"], capture_output=True, text=True,
                            env=env, timeout=300, check=False)
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, out + err
    assert second.returncode == 2, second.stdout + second.stderr
    (line,) = [ln for ln in second.stderr.splitlines() if ln.strip()]
    assert f"another process (pid {first.pid}) is writing this results store" in line
    assert "wait for it to finish, or use another --db" in line and "not a specdec results database" not in line
    with sqlite3.connect(db) as c:
        keys = [r[0] for r in c.execute("select cell_key from runs")]
    assert keys and len(keys) == len(set(keys))  # nothing duplicated
    again = run(*args[3:], "--resume")
    assert again.returncode == 0 and "0 to run" in again.stdout, again.stdout + again.stderr


def test_sigterm_stops_a_sweep_with_status_143_and_keeps_its_runs(tiny_pair, tmp_path):
    """`kill PID` (SIGTERM; a SLURM time limit sends it too) on a running `specdec sweep`: the sweep is
    marked interrupted, its finished runs stay in the store, the resume hint is printed, and the exit status
    is the shell's 128 + SIGTERM (143), not Ctrl-C's 130."""
    import signal
    import sqlite3
    import time

    db = tmp_path / "term.db"
    args = _long_sweep_args(tiny_pair, tmp_path, db)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))

    def stored() -> int:
        try:
            with sqlite3.connect(db) as c:
                return c.execute("select count(*) from runs").fetchone()[0]
        except sqlite3.Error:  # not created yet
            return 0

    deadline = time.monotonic() + 120
    while stored() < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, "the sweep finished before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert "rerun the same command with --resume to continue" in err
    with sqlite3.connect(db) as c:
        (status,) = c.execute("select status from sweeps").fetchone()
        kept = c.execute("select count(*) from runs").fetchone()[0]
    assert status == "interrupted" and kept >= 2


@pytest.mark.parametrize("extra", [["--backend", "foo"], ["--draft-backend", "foo"],
                                   ["--batch-size", "2", "--backend", "foo"]])
def test_unknown_backend_is_one_line_before_any_load(extra):
    """The default preset prints a progress line before it loads: an unknown runtime is refused before it."""
    p = run("generate", "--prompt", "def fib(n):", "--max-new-tokens", "2", *extra)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error: unknown --") and "foo" in lines[0], p.stderr


def test_generate_prints_the_cost_policys_note(tiny_pair, tmp_path):
    """The cost policy's note on the run (target-only because no K pays, or its probes) is shown, so a run
    that never drafted says why instead of just 'acceptance n/a'."""
    p = run("generate", "--target", str(tiny_pair.target_dir), "--draft", str(tiny_pair.draft_dir),
            "--prompt", "hello world", "--max-new-tokens", "6", env={"SPECDEC_CACHE_DIR": str(tmp_path / "c")})
    assert p.returncode == 0, p.stderr
    notes = [x for x in p.stdout.splitlines() if x.startswith("cost policy: ")]
    assert len(notes) == 1 and ("probes" in notes[0] or "target-only" in notes[0]), p.stdout
    assert " rounds" in notes[0] and "drafted in " in notes[0], notes[0]
