"""The results store's schema and identities: tables and columns (declared once), the sweep id, the run key.

Schema (version 1; `docs/STORE.md` documents every column):

- ``sweeps``: one row per sweep configuration. ``sweep_id`` is ``sha256[:16]`` of the canonical JSON of the
  configuration that gives rows their meaning (`sweep_id_for`).
- ``runs``: one row per timed generation (a cell x repeat), unique by ``cell_key``
  (``sweep_id|config_label|prompt_id|method|k|policy|repeat``); a batched run of B prompts is B rows
  (``batch_size``, ``batch_id``, ``row``). A failed run is a row with ``error`` set.
- ``rounds``: the per-round trace of our own runs (baseline, draft, ngram), keyed by ``(run_id, round_idx)``.
- ``costs``: measured step/forward times per sweep x config_label x role x n_tokens.
- ``meta``: ``schema_version``.

Derived figures (acceptance rate, alpha-hat, speedup, ...) are never stored: they are computed at analysis
time from the raw counts (see `specdec.core.metrics`). `specdec.bench.store` re-exports every public name.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "BATCH_TABLES",
    "ROUND_COLUMNS",
    "RUN_COLUMNS",
    "SAMPLING_KEYS",
    "SCHEMA_VERSION",
    "TABLES",
    "batch_group",
    "batch_id_for",
    "canonical_json",
    "cell_key",
    "columns",
    "model_identity",
    "same_axis",
    "sweep_id_for",
]

SCHEMA_VERSION = "1"

#: The schema, declared once: table -> ((column, SQL type and constraints), ...). `_SCHEMA` (the SQL),
#: `RUN_COLUMNS`, `ROUND_COLUMNS` and `columns` derive from it; docs/STORE.md documents every column.
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "meta": (("key", "TEXT PRIMARY KEY"), ("value", "TEXT")),
    "sweeps": (
        ("sweep_id", "TEXT PRIMARY KEY"), ("name", "TEXT"), ("config_json", "TEXT NOT NULL"),
        ("created_at", "TEXT"), ("git_commit", "TEXT"), ("machine_json", "TEXT"), ("status", "TEXT"),
    ),
    "runs": (
        ("run_id", "INTEGER PRIMARY KEY"), ("sweep_id", "TEXT REFERENCES sweeps(sweep_id)"),
        ("cell_key", "TEXT NOT NULL UNIQUE"), ("config_label", "TEXT"),
        ("pair", "TEXT"), ("target", "TEXT"), ("draft", "TEXT"),
        ("target_backend", "TEXT"), ("draft_backend", "TEXT"), ("compiled", "INTEGER"),
        ("device", "TEXT"), ("dtype", "TEXT"), ("threads", "INTEGER"),
        ("prompt_id", "TEXT"), ("prompt_type", "TEXT"), ("chat_template", "INTEGER"), ("prompt_tokens", "INTEGER"),
        ("method", "TEXT"), ("policy", "TEXT"), ("k", "INTEGER"), ("repeat", "INTEGER"), ("seed", "INTEGER"),
        ("temperature", "REAL"), ("top_k", "INTEGER"), ("top_p", "REAL"), ("max_new_tokens", "INTEGER"),
        ("new_tokens", "INTEGER"), ("finish_reason", "TEXT"), ("token_ids", "TEXT"), ("matches_baseline", "INTEGER"),
        ("num_rounds", "INTEGER"), ("num_drafted", "INTEGER"), ("num_accepted", "INTEGER"),
        ("num_rejections", "INTEGER"),
        ("prefill_s", "REAL"), ("ttft_s", "REAL"), ("decode_s", "REAL"), ("total_s", "REAL"), ("draft_s", "REAL"),
        ("verify_s", "REAL"), ("tokens_per_s", "REAL"),
        ("error", "TEXT"), ("created_at", "TEXT"),
        # the machine that timed the run (`specdec.bench.machines`; added by ALTER TABLE to older stores)
        ("machine_id", "TEXT"),
        # greedy runs that differ from the baseline: the first output position where they differ
        ("first_divergence", "INTEGER"),
        # the K policy's note on the run (`specdec.policies.cost.CostPolicy.note`), e.g. target-only from the start
        ("policy_note", "TEXT"),
        # the batch axis (`specdec.bench.grid`; NULL on a single-sequence run, B = 1): a batched run of B
        # prompts is B rows, row `row` of batch `batch_id` (`batch_id_for`), each with the batch's wall time and
        # aggregate tokens/s; matches_single: the row's greedy tokens equal single-sequence target-only
        # decoding of its prompt; predicted_speedup: the batch pricing's prediction at the batch's acceptance
        ("batch_size", "INTEGER"), ("batch_id", "TEXT"), ("row", "INTEGER"), ("batch_total_s", "REAL"),
        ("batch_tokens_per_s", "REAL"), ("matches_single", "INTEGER"), ("predicted_speedup", "REAL"),
    ),
    "rounds": (
        ("run_id", "INTEGER REFERENCES runs(run_id)"), ("round_idx", "INTEGER"),
        ("k", "INTEGER"), ("k_requested", "INTEGER"), ("num_accepted", "INTEGER"), ("accept_flags", "TEXT"),
        ("next_kind", "TEXT"), ("num_emitted", "INTEGER"), ("draft_s", "REAL"), ("verify_s", "REAL"),
        ("other_s", "REAL"), ("alpha_estimate", "REAL"),
        # the target forward alone, inside verify_s; its token count when padded to a cheaper shape; the part
        # of a combining drafter that drafted the round (added by ALTER TABLE to older stores)
        ("forward_s", "REAL"), ("n_forward", "INTEGER"), ("draft_source", "TEXT"),
    ),
    "costs": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("role", "TEXT"), ("n_tokens", "INTEGER"),
        ("seconds", "REAL"), ("repeats", "INTEGER"), ("spread_s", "REAL"),
    ),
    # Machines (`specdec.bench.machines`): each machine's fingerprint, its own cost curve, and which shard of
    # a sweep ran where (stores from before sharding get these tables when opened).
    "machines": (("machine_id", "TEXT PRIMARY KEY"), ("machine_json", "TEXT")),
    "machine_costs": (
        ("sweep_id", "TEXT"), ("machine_id", "TEXT"), ("config_label", "TEXT"), ("role", "TEXT"),
        ("n_tokens", "INTEGER"), ("seconds", "REAL"), ("repeats", "INTEGER"), ("spread_s", "REAL"),
    ),
    "shards": (("sweep_id", "TEXT"), ("shard", "TEXT"), ("machine_id", "TEXT"), ("started_at", "TEXT")),
    # Acceptance traces (`specdec.engine.traces`): per prompt, the target-only greedy output and, per output position,
    # the draft's teacher-forced greedy token and the target's own top-2 margin; every fixed K and policy of
    # both drafters is replayed from it (JSON lists; one row per sweep, config, prompt and machine). A sampled
    # sweep's trace (`specdec.engine.sampled_traces`; added by ALTER TABLE to older stores): its sampling
    # (``sampling_json``, NULL for a greedy trace), the draft model's overlap per position and each model-free
    # drafter's acceptance probabilities along its chain (``chains``: JSON {drafter: [[p, ...] per position]}).
    "traces": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("prompt_id", "TEXT"), ("machine_id", "TEXT"),
        ("run_id", "INTEGER"), ("max_new_tokens", "INTEGER"), ("draft_context", "INTEGER"),
        ("prompt_ids", "TEXT"), ("target_ids", "TEXT"), ("draft_ids", "TEXT"), ("draft_top_prob", "TEXT"),
        ("target_margin", "TEXT"), ("target_tf_ids", "TEXT"), ("created_at", "TEXT"), ("sampling_json", "TEXT"),
        ("overlap", "TEXT"), ("chains", "TEXT"),
    ),
    # Calibration blocks: target forwards of n = 1..17 tokens (and the draft step) timed at a prompt's own
    # context right after one of its target-only runs (`after_run_id`), median and IQR over `repeats`.
    "calibration": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("prompt_id", "TEXT"), ("machine_id", "TEXT"),
        ("after_run_id", "INTEGER"), ("role", "TEXT"), ("n_tokens", "INTEGER"), ("context_tokens", "INTEGER"),
        ("seconds", "REAL"), ("repeats", "INTEGER"), ("spread_s", "REAL"),
    ),
    # The roofline inputs per configuration and machine (`specdec.measure.roofline`): bytes of weights a target step
    # and a draft step read, and the machine's memory bandwidth by a streaming copy (GB/s = 1e9 bytes/s).
    # runtime_json: what the models ran on (`specdec.runtimes.llamacpp_record.pair_record`: per model the
    # runtime; on llama.cpp the GGUF's weight types, requantization type and weight repacking; the ggml
    # environment), added by ALTER TABLE to older stores.
    "roofline": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("machine_id", "TEXT"), ("target_weight_bytes", "INTEGER"),
        ("draft_weight_bytes", "INTEGER"), ("bandwidth_gbps", "REAL"), ("bandwidth_json", "TEXT"),
        ("runtime_json", "TEXT"),
    ),
    # Synthetic-acceptance measurements (`specdec.report.synthetic`): specdec's loop and llama.cpp's own at set
    # acceptance rates, one row per benchmark run attached to a sweep: ``doc_json`` holds its raw runs, the cost
    # curve it was priced on, its settings and machine (JSON; derived figures are computed by the report).
    "synthetic": (
        ("sweep_id", "TEXT"), ("machine_id", "TEXT"), ("created_at", "TEXT"), ("doc_json", "TEXT"),
    ),
}  # fmt: skip
#: The tables of the former batch harness (``specdec batch-sweep``), kept so that its published stores
#: (results/batch_*.db) stay readable, exportable and mergeable (`specdec.bench.store_batch`); nothing writes
#: new batch runs there: a sweep's batch axis is in ``runs`` (``batch_size`` > 1). Declared apart from
#: `TABLES` and created empty with the others (a read-only older store reads them as empty).
#: ``batch_sweeps``: one row per batch sweep; ``batch_runs``: one row per timed batched generation of B
#: prompts (``seq``: its place in its cell), unique by ``cell_key``; ``batch_calibration``: batched forwards
#: of B rows x m tokens.
BATCH_TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "batch_sweeps": (
        ("sweep_id", "TEXT PRIMARY KEY"), ("config_json", "TEXT NOT NULL"), ("created_at", "TEXT"),
        ("git_commit", "TEXT"), ("machine_json", "TEXT"), ("status", "TEXT"),
    ),
    "batch_runs": (
        ("run_id", "INTEGER PRIMARY KEY"), ("sweep_id", "TEXT"), ("cell_key", "TEXT NOT NULL UNIQUE"),
        ("config_label", "TEXT"), ("target", "TEXT"), ("draft", "TEXT"), ("dtype", "TEXT"), ("threads", "INTEGER"),
        ("machine_id", "TEXT"), ("group_name", "TEXT"), ("batch_size", "INTEGER"), ("batch_idx", "INTEGER"),
        ("seq", "INTEGER"), ("prompt_ids", "TEXT"), ("method", "TEXT"), ("policy", "TEXT"), ("k", "INTEGER"),
        ("k_best", "INTEGER"), ("alpha_pre", "REAL"), ("max_new_tokens", "INTEGER"), ("new_tokens", "INTEGER"),
        ("total_s", "REAL"), ("prefill_s", "REAL"), ("tokens_per_s", "REAL"), ("row_tps_p50", "REAL"),
        ("row_tps_p95", "REAL"), ("num_rounds", "INTEGER"), ("row_rounds", "INTEGER"), ("num_drafted", "INTEGER"),
        ("num_accepted", "INTEGER"), ("draft_s", "REAL"), ("forward_s", "REAL"), ("other_s", "REAL"),
        ("predicted_speedup", "REAL"), ("rows_mismatch_batched", "INTEGER"), ("rows_mismatch_single", "INTEGER"),
        ("token_ids", "TEXT"), ("error", "TEXT"), ("created_at", "TEXT"),
    ),
    "batch_calibration": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("machine_id", "TEXT"), ("role", "TEXT"),
        ("batch_size", "INTEGER"), ("n_tokens", "INTEGER"), ("context_tokens", "INTEGER"), ("seconds", "REAL"),
        ("repeats", "INTEGER"), ("spread_s", "REAL"),
    ),
}  # fmt: skip
#: Table-level constraints and indexes (not columns).
_CONSTRAINTS = {
    "rounds": "PRIMARY KEY (run_id, round_idx)",
    "costs": "PRIMARY KEY (sweep_id, config_label, role, n_tokens)",
    "machine_costs": "PRIMARY KEY (sweep_id, machine_id, config_label, role, n_tokens)",
    "shards": "PRIMARY KEY (sweep_id, shard, machine_id)",
    "traces": "PRIMARY KEY (sweep_id, config_label, prompt_id, machine_id)",
    "calibration": "PRIMARY KEY (sweep_id, config_label, prompt_id, machine_id, after_run_id, role, n_tokens)",
    "roofline": "PRIMARY KEY (sweep_id, config_label, machine_id)",
    "synthetic": "PRIMARY KEY (sweep_id, machine_id, created_at)",
    "batch_calibration": "PRIMARY KEY (sweep_id, config_label, machine_id, role, batch_size, n_tokens)",
}
#: Tables stored clustered on their primary key (no rowid, no second index: a store's largest table, ``rounds``,
#: takes about a fifth less space; nothing reads a rowid of it).
_WITHOUT_ROWID = frozenset({"rounds"})
_INDEXES = ("CREATE INDEX IF NOT EXISTS runs_by_sweep ON runs (sweep_id, config_label, prompt_id, method)",)


def columns(table: str) -> tuple[str, ...]:
    """Every column of `table` in the store, in table order (``run_id`` included for runs/rounds).

    Raises:
        KeyError: an unknown table (see `TABLES` and `BATCH_TABLES`).
    """
    return tuple(name for name, _ in (TABLES[table] if table in TABLES else BATCH_TABLES[table]))


def _create_statements() -> list[str]:
    out = []
    for table, cols in {**TABLES, **BATCH_TABLES}.items():
        parts = [f"{name} {decl}" for name, decl in cols]
        if table in _CONSTRAINTS:
            parts.append(_CONSTRAINTS[table])
        tail = " WITHOUT ROWID" if table in _WITHOUT_ROWID else ""
        out.append(f"CREATE TABLE IF NOT EXISTS {table} (\n    " + ",\n    ".join(parts) + "\n)" + tail)
    return out + list(_INDEXES)


_SCHEMA = ";\n".join(_create_statements()) + ";\n"

#: Columns of ``runs`` that a caller fills (``run_id`` is assigned by SQLite).
RUN_COLUMNS: tuple[str, ...] = columns("runs")[1:]
#: Columns of ``rounds`` that a caller fills (``run_id`` is the run's).
ROUND_COLUMNS: tuple[str, ...] = columns("rounds")[1:]


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """ALTER TABLE ... ADD COLUMN every column of `TABLES` that an older store's table lacks (NULL in its old
    rows; call inside a transaction, after the CREATE TABLE IF NOT EXISTS statements)."""
    for table, cols in TABLES.items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        for name, decl in cols:
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl.split()[0]}")

def canonical_json(obj: Any) -> str:
    """JSON with sorted keys, no whitespace, ASCII only: the same object always gives the same string."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


#: The identity keys sampling sets (`specdec.bench.plan.meaning`): a temperature axis
#: (`specdec.bench.config.axis_configs`) varies only these, so its sweeps' identities are equal but for them.
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "ignore_eos")


def same_axis(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two sweep identities are equal but for `SAMPLING_KEYS`: sweeps of one temperature axis."""
    return {k: v for k, v in a.items() if k not in SAMPLING_KEYS} == {k: v for k, v in b.items()
                                                                      if k not in SAMPLING_KEYS}


def sweep_id_for(config: Mapping[str, Any]) -> str:
    """``sha256(canonical_json(config))[:16]`` (hex): the id of the sweep whose rows `config` gives meaning to."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]


_SAMPLE_BYTES = 1 << 16  # bytes read at the start, middle and end of each model file
_GGUF_HEAD_BYTES = 1 << 20  # a GGUF's header and tensor index (its metadata) lie in its first MiB


def _sample(h: Any, path: Path, head: int = _SAMPLE_BYTES) -> None:
    """Feed `h` the size of `path` and its bytes at the start (`head` bytes), middle and end: two files
    with the same names, sizes and shapes but other weights differ there, and no GB file is read whole."""
    size = path.stat().st_size
    h.update(f"\0{path.name}\0{size}\0".encode())
    with open(path, "rb") as f:
        for offset, n in ((0, head), (size // 2, _SAMPLE_BYTES), (max(size - _SAMPLE_BYTES, 0), _SAMPLE_BYTES)):
            f.seek(offset)
            h.update(f.read(n))


def model_identity(spec: str | None) -> str | None:
    """How a sweep's identity names the model `spec`: by what it is, not by how its path was typed.

    - a local checkpoint directory: ``"dir sha256:<16 hex>"`` of its ``config.json`` and, for each of its
      top-level files (weights, tokenizer), its name, size and 64 KiB at its start, middle and end, so
      ``dir``, ``dir/``, ``./dir`` and the absolute path are one model, and other weights another;
    - an existing ``.gguf`` file: ``"gguf sha256:<16 hex>"`` of its size, its first MiB (header and tensor
      index) and 64 KiB at its middle and end;
    - anything else (a preset member such as ``"gpt2-medium"`` or ``"qwen2.5-coder:target"``, a hub id,
      a path that does not exist): `spec` unchanged, so the published stores' sweep ids do not move.
      A spec equal to a preset member is kept as is even when a directory of that name exists.

    A few hundred KiB are read per file, never a whole GB-sized checkpoint.
    """
    if spec is None:
        return None
    from specdec.models.presets import PRESETS, preset_member

    members = {m for p in PRESETS.values() for m in (p.target, p.draft)}
    if spec in members or preset_member(spec) is not None:
        return spec
    path = Path(spec).expanduser()
    h = hashlib.sha256()
    if path.is_dir():
        config = path / "config.json"
        h.update(config.read_bytes() if config.is_file() else b"(no config.json)")
        for f in sorted(path.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                _sample(h, f)
        return f"dir sha256:{h.hexdigest()[:16]}"
    if spec.lower().endswith(".gguf") and path.is_file():
        _sample(h, path, head=_GGUF_HEAD_BYTES)
        return f"gguf sha256:{h.hexdigest()[:16]}"
    return spec


def _key_part(value: Any) -> str:
    return "-" if value is None else str(value)


def cell_key(
    sweep_id: str, config_label: str, prompt_id: str, method: str, k: int | None, policy: str | None,
    repeat: int, batch_id: str | None = None, row: int | None = None,
) -> str:
    """The unique key of one timed run: ``sweep_id|config_label|prompt_id|method|k|policy|repeat`` (``-``
    stands for a NULL k or policy); a row of a batched run appends ``|batch_id|row``, since one prompt sits
    in several batches (and a batch of a group smaller than B holds it more than once)."""
    parts = (sweep_id, config_label, prompt_id, method, k, policy, repeat)
    key = "|".join(_key_part(p) for p in parts)
    return key if batch_id is None else f"{key}|{batch_id}|{row}"


def batch_id_for(group: str, batch_size: int, index: int) -> str:
    """The id of batch `index` of prompt group `group` at batch size B: ``group/B/index``."""
    return f"{group}/{int(batch_size)}/{int(index)}"


def batch_group(batch_id: str) -> str:
    """The prompt group a `batch_id_for` id names."""
    return str(batch_id).rsplit("/", 2)[0]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _clean(value: Any) -> Any:
    """SQLite-ready scalar: NaN/inf -> NULL, bools -> 0/1, lists/dicts -> JSON."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value

