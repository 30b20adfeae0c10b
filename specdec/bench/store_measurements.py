"""The measurement tables of a results store (traces, calibration blocks, roofline inputs, synthetic-acceptance
measurements, cost curves), as a mixin of `specdec.bench.store.Store` (which provides ``conn``, ``machine_id``
and ``transaction``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from specdec.bench import machines as _machines  # per-machine cost curves (specdec/bench/machines.py)
from specdec.bench.store_schema import _clean, _now

__all__ = ["MeasurementTables"]


class MeasurementTables:
    """Reads and writes of the ``traces``, ``calibration``, ``roofline``, ``costs`` and ``machine_costs``
    tables, and writes of ``synthetic`` (the report reads it: `specdec.report.load`); each write one transaction."""

    # ------------------------------------------------------------------------- traces and calibration

    def save_trace(self, sweep_id: str, config_label: str, prompt_id: str, run_id: int | None,
                   trace: Any, *, target_margin: Sequence[float] | None = None,
                   target_tf_ids: Sequence[int] | None = None, draft_context: int | None = None) -> None:
        """Store (replace) the acceptance trace of one prompt on this machine: a greedy one
        (`specdec.engine.traces.AcceptanceTrace`) or a sampled one (`specdec.engine.sampled_traces.SampledTrace`:
        its sampling, overlap and chains).

        Args:
            run_id: the target-only run the trace was taken from. target_margin: ``[T]`` the target's
                top-1 minus top-2 probability at each output position (teacher forced); target_tf_ids: ``[T]``
                the target's teacher-forced argmax (it can differ from the incremental run's token at a
                near-tie). draft_context: the draft model's context length (it clamps K in a replay).
        """
        def js(x):
            return None if x is None else json.dumps(x if isinstance(x, dict) else list(x))

        sampling = getattr(trace, "sampling", None)
        sampled = None if sampling is None else json.dumps(
            {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p})
        chains = getattr(trace, "chains", None)
        with self.transaction():
            self.conn.execute(
                "INSERT OR REPLACE INTO traces VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sweep_id, config_label, prompt_id, self.machine_id or "", run_id, trace.max_new_tokens,
                 draft_context, js(trace.prompt_ids), js(trace.target_ids), js(getattr(trace, "draft_ids", None)),
                 js(getattr(trace, "draft_top_prob", None)), js(target_margin), js(target_tf_ids), _now(), sampled,
                 js(getattr(trace, "overlap", None)),
                 None if chains is None else json.dumps({k: [list(c) for c in v] for k, v in chains.items()})))

    def traces(self, sweep_id: str | None = None) -> list[dict]:
        """Rows of ``traces`` (JSON columns decoded), optionally of one sweep."""
        sql = "SELECT * FROM traces" + (" WHERE sweep_id = ?" if sweep_id else "") + " ORDER BY rowid"
        out = []
        for r in self.conn.execute(sql, (sweep_id,) if sweep_id else ()).fetchall():
            d = dict(r)
            for c in ("prompt_ids", "target_ids", "draft_ids", "draft_top_prob", "target_margin", "target_tf_ids",
                      "sampling_json", "overlap", "chains"):
                d[c] = None if d.get(c) is None else json.loads(d[c])
            out.append(d)
        return out

    def has_trace(self, sweep_id: str, config_label: str, prompt_id: str) -> bool:
        """Whether this machine already stored the trace of this prompt."""
        return self.conn.execute(
            "SELECT 1 FROM traces WHERE sweep_id = ? AND config_label = ? AND prompt_id = ? AND machine_id = ?",
            (sweep_id, config_label, prompt_id, self.machine_id or "")).fetchone() is not None

    def save_calibration(self, sweep_id: str, config_label: str, prompt_id: str, after_run_id: int | None,
                         block: Mapping[str, Any]) -> None:
        """Store one calibration block (`specdec.measure.timing.calibration_block`'s dict: ``context_tokens``,
        ``repeats``, ``target_forward_s`` / ``target_forward_spread_s`` ``{n: s}``, optional ``draft_step_s`` /
        ``draft_step_spread_s`` and ``draft_forward_s`` / ``draft_forward_spread_s`` ``{n: s}``) timed right
        after run `after_run_id`. Rows: role ``target`` per n; role ``draft`` per n of ``draft_forward_s``,
        or n = 1 alone (the step) for a block without it."""
        ctx, reps = block.get("context_tokens"), block.get("repeats")
        rows = [(sweep_id, config_label, prompt_id, self.machine_id or "", after_run_id, "target", int(n), ctx,
                 _clean(float(s)), reps, _clean(block.get("target_forward_spread_s", {}).get(n)))
                for n, s in block["target_forward_s"].items()]
        if block.get("draft_forward_s"):
            spread = block.get("draft_forward_spread_s") or {}
            rows += [(sweep_id, config_label, prompt_id, self.machine_id or "", after_run_id, "draft", int(n), ctx,
                      _clean(float(s)), block.get("draft_repeats", reps), _clean(spread.get(n)))
                     for n, s in block["draft_forward_s"].items()]
        elif block.get("draft_step_s") is not None:
            rows.append((sweep_id, config_label, prompt_id, self.machine_id or "", after_run_id, "draft", 1, ctx,
                         _clean(float(block["draft_step_s"])), block.get("draft_repeats", reps),
                         _clean(block.get("draft_step_spread_s"))))
        with self.transaction():
            self.conn.executemany("INSERT OR REPLACE INTO calibration VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                  rows)

    def calibration(self, sweep_id: str | None = None) -> list[dict]:
        """Rows of ``calibration`` (one per block, role and n), optionally of one sweep."""
        sql = "SELECT * FROM calibration" + (" WHERE sweep_id = ?" if sweep_id else "") + " ORDER BY rowid"
        return [dict(r) for r in self.conn.execute(sql, (sweep_id,) if sweep_id else ()).fetchall()]

    def save_roofline(self, sweep_id: str, config_label: str, target_weight_bytes: int | None,
                      draft_weight_bytes: int | None, bandwidth: Mapping[str, Any] | None,
                      runtime: Mapping[str, Any] | None = None) -> None:
        """Store (replace) the roofline inputs of one configuration on this machine (`specdec.measure.roofline`) and
        `runtime`, what its models ran on (`specdec.runtimes.llamacpp_record.pair_record`; JSON)."""
        with self.transaction():
            self.conn.execute(
                "INSERT OR REPLACE INTO roofline (sweep_id, config_label, machine_id, target_weight_bytes, "
                "draft_weight_bytes, bandwidth_gbps, bandwidth_json, runtime_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (sweep_id, config_label, self.machine_id or "", target_weight_bytes, draft_weight_bytes,
                 _clean(bandwidth.get("gbps")) if bandwidth else None,
                 json.dumps(dict(bandwidth), sort_keys=True) if bandwidth else None,
                 json.dumps(dict(runtime), sort_keys=True, default=str) if runtime else None))

    def runtime_records(self, sweep_id: str) -> dict[str, dict]:
        """What each configuration of `sweep_id` ran on (``roofline.runtime_json``), by config label (the
        first machine's where several ran it; configurations without a record are left out)."""
        out: dict[str, dict] = {}
        for label, text in self.conn.execute("SELECT config_label, runtime_json FROM roofline WHERE sweep_id = ? "
                                             "AND runtime_json IS NOT NULL ORDER BY rowid", (sweep_id,)):
            out.setdefault(label, json.loads(text))
        return out

    def bandwidth_gbps(self) -> float | None:
        """This machine's bandwidth as any sweep of this store measured it (None if never)."""
        row = self.conn.execute("SELECT bandwidth_gbps FROM roofline WHERE machine_id = ? AND bandwidth_gbps IS "
                                "NOT NULL LIMIT 1", (self.machine_id or "",)).fetchone()
        return None if row is None else float(row[0])

    def save_synthetic(self, sweep_id: str, doc: Mapping[str, Any]) -> str:
        """Attach one synthetic-acceptance measurement to `sweep_id` (`specdec.report.synthetic`: its raw
        ``runs``, ``costs``, settings and ``machine``, the machine registered in ``machines``); returns its
        ``created_at`` (the measurement's own, if it has one)."""
        created = str(doc.get("created_at") or _now())
        with self.transaction() as conn:
            mid = _machines.register_machine(conn, doc.get("machine"))
            conn.execute("INSERT OR REPLACE INTO synthetic VALUES (?, ?, ?, ?)",
                         (sweep_id, mid or "", created, json.dumps({**doc, "created_at": created}, default=str)))
        return created

    # ------------------------------------------------------------------------------------------ costs

    def save_costs(self, sweep_id: str, config_label: str, costs: Mapping[str, Any], *, batch: bool = False) -> None:
        """Store a `specdec.measure.timing.measure_forwards` result (replacing any earlier one of its roles) in
        one transaction.

        Rows: role ``'target'``, one per n of ``target_forward_s``; role ``'draft'`` from ``draft_forward_s``
        (at least n_tokens 1 = the draft step) when a draft was measured; with `batch`, roles
        ``'batch_target'`` and ``'batch_draft'``: the forwards that price a batch's K (`batch_ns`), kept apart
        from the single-sequence curve. ``c`` is derived. ``repeats`` per row: ``draft_repeats`` for the
        draft's rows when given, else ``repeats``.
        """
        roles = _roles(batch)
        rows = []
        for base, role in zip(("target", "draft"), roles, strict=True):
            repeats = costs.get(f"{base}_repeats") or costs.get("repeats")  # draft_repeats: 3x the target's
            fwd = costs.get(f"{base}_forward_s") or {}
            spread = costs.get(f"{base}_forward_spread_s") or {}
            for n, s in fwd.items():
                sp = spread.get(n, spread.get(str(n)))
                rows.append((sweep_id, config_label, role, int(n), _clean(float(s)), repeats, _clean(sp)))
        with self.transaction():
            self.conn.execute("DELETE FROM costs WHERE sweep_id = ? AND config_label = ? AND role IN (?, ?)",
                              (sweep_id, config_label, *roles))
            self.conn.executemany("INSERT INTO costs VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            if self.machine_id is not None:  # each machine's own curve
                self.conn.execute("DELETE FROM machine_costs WHERE sweep_id = ? AND config_label = ? AND "
                                  "machine_id = ? AND role IN (?, ?)", (sweep_id, config_label, self.machine_id, *roles))
                self.conn.executemany("INSERT INTO machine_costs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                      [(r[0], self.machine_id, *r[1:]) for r in rows])

    def load_costs(self, sweep_id: str, config_label: str, *, batch: bool = False) -> dict | None:
        """The costs stored for this sweep and config_label (with `batch`: its batch pricing's forwards), in
        `measure_costs`'s shape, or None when absent.

        Keys: ``target_step_s``, ``draft_step_s`` (None without a draft), ``c`` (draft/target step; None
        without a draft), ``target_forward_s`` / ``draft_forward_s`` (``{n: seconds}``), the matching
        ``*_spread_s`` (IQR seconds), ``repeats`` (the target's) and ``draft_repeats``.
        Once `begin_sweep` has set this process's machine, the costs are that machine's own (None when only
        other machines measured them, so the sweep measures its own); stores without per-machine costs
        give the ``costs`` table's.
        """
        roles = _roles(batch)
        rows = _machines.machine_cost_rows(self.conn, sweep_id, config_label, self.machine_id, roles)
        if rows is None:
            rows = self.conn.execute(
                "SELECT role, n_tokens, seconds, repeats, spread_s FROM costs WHERE sweep_id = ? AND "
                "config_label = ? AND role IN (?, ?) ORDER BY role, n_tokens",
                (sweep_id, config_label, *roles),
            ).fetchall()
        if not rows:
            return None
        out: dict[str, Any] = {
            "target_forward_s": {}, "target_forward_spread_s": {},
            "draft_forward_s": {}, "draft_forward_spread_s": {}, "repeats": None, "draft_repeats": None,
        }  # fmt: skip
        for role, n, s, reps, spread in rows:
            base = "target" if role == roles[0] else "draft"
            out[f"{base}_forward_s"][int(n)] = s
            out[f"{base}_forward_spread_s"][int(n)] = spread
            out["repeats" if base == "target" else "draft_repeats"] = reps
        t1 = out["target_forward_s"].get(1)
        d1 = out["draft_forward_s"].get(1)
        out["target_step_s"] = t1
        out["draft_step_s"] = d1
        out["c"] = d1 / t1 if (d1 is not None and t1) else None
        if not out["draft_forward_s"]:
            out["draft_forward_s"] = out["draft_forward_spread_s"] = None
        return out


def _roles(batch: bool) -> tuple[str, str]:
    """The ``costs`` roles of the target's and the draft's forwards: the single-sequence curve, or (`batch`)
    the forwards that price a batch's K."""
    return ("batch_target", "batch_draft") if batch else ("target", "draft")
