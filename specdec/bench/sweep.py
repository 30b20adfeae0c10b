"""The benchmark sweep: plan the cells, run them against target-only decoding and the library peers, store.

A **cell** is (config_label, prompt, method, K, policy); a **run** is one timed generation of a cell
(cell x repeat). Methods:

- ours, through the same backends: ``baseline`` (target-only), ``draft`` (speculative decoding with the
  draft model), ``ngram`` (speculative decoding with prompt lookup); ``draft``/``ngram`` run at fixed K
  (policy ``fixed``) and, on primary prompts, with adaptive policies (``heuristic``, ``confidence``,
  ``cost``; K = the policy's starting/maximum K);
- peers, measured in the same process on the same prompt ids: ``hf_generate`` (transformers ``generate()``,
  target only), ``hf_assisted`` (assisted generation with the draft model, constant K, no confidence stop),
  ``hf_prompt_lookup`` (``prompt_lookup_num_tokens=K``) on transformers targets; ``llama_prompt_lookup``
  (llama-cpp-python's ``LlamaPromptLookupDecoding``) is planned on llama.cpp targets and recorded as skipped
  (see `LLAMA_PROMPT_LOOKUP_SKIP`).

Method (MEASUREMENT.md): each runtime configuration loads its models once (the previous one is freed first),
measures its costs (`specdec.bench.costs.measure_costs`, stored once per config_label), then runs one
untimed warm-up generation per (config_label, method, K, policy) on the first prompt before the first timed
run of that group. Our engine times prefill and decode apart; peers are timed by the wall clock around the
library call (prefill not separable: NULL). Tokens are counted by id. Under greedy decoding every run
records whether its token ids equal our baseline's for the same config_label and prompt.

Every run is committed with its rounds in one transaction (`specdec.bench.store.Store.record_run`), so a
killed sweep loses at most the run in flight; ``resume=True`` skips finished cells and retries failed ones.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import importlib
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from specdec.bench.costs import measure_costs
from specdec.bench.machines import host_id, record_shard  # [shards]
from specdec.bench.prompts import Prompt, load_builtin, load_prompt_file
from specdec.bench.shard import shard_plan  # [shards]
from specdec.bench.store import Store, cell_key, sweep_id_for
from specdec.decoding import GREEDY, autoregressive_generate, speculative_generate
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.sampling import SamplingParams
from specdec.theory import expected_tokens_per_round

__all__ = [
    "ADAPTIVE_POLICIES",
    "DEFAULT_DB",
    "LLAMA_PROMPT_LOOKUP_SKIP",
    "OUR_METHODS",
    "PEER_METHODS",
    "QUICK",
    "REFERENCE_COSTS",
    "RUNTIME_CONFIGS",
    "Cell",
    "RuntimeConfig",
    "SweepConfig",
    "SweepResult",
    "build_plan",
    "encode_prompt",
    "estimate_generation_s",
    "estimate_plan_s",
    "git_commit",
    "hf_peer_generate",
    "load_config_file",
    "machine_info",
    "make_config",
    "prepare",
    "run_sweep",
    "select_prompts",
]

OUR_METHODS = ("baseline", "draft", "ngram")
PEER_METHODS = ("hf_generate", "hf_assisted", "hf_prompt_lookup", "llama_prompt_lookup")
ADAPTIVE_POLICIES = ("heuristic", "confidence", "cost")
DEFAULT_DB = "results/sweep.db"

LLAMA_PROMPT_LOOKUP_SKIP = (
    "skipped: llama-cpp-python 0.3.36's Llama class, which LlamaPromptLookupDecoding needs, cannot set "
    "n_outputs_max_per_seq (so a batch returns logits for one position only) nor turn off the AMX weight "
    "repack that segfaults on some CPUs (see specdec/backends/llamacpp.py)"
)

_SUMMARY_ERR_LEN = 300  # characters kept of an error message


# ------------------------------------------------------------------------------------ runtime configs


@dataclass(frozen=True)
class RuntimeConfig:
    """One runtime configuration (``config_label``): which runtime runs the target and the draft.

    Attributes:
        label: the ``config_label`` stored with every run.
        target_backend, draft_backend: ``"transformers"`` or ``"llamacpp"``.
        compile: transformers only: the compiled static-cache backend (`specdec.backends.compiled`).
    """

    label: str
    target_backend: str
    draft_backend: str
    compile: bool = False

    def peers(self) -> tuple[str, ...]:
        """The peer methods that apply to this configuration."""
        out = []
        if self.target_backend == "transformers" and not self.compile:
            # the transformers peers run the model as users run it: eager (the compiled backend repacks
            # the model's linear layers in place, so its generate() would no longer be transformers' own)
            out.append("hf_generate")
            if self.draft_backend == "transformers":
                out.append("hf_assisted")
            out.append("hf_prompt_lookup")
        if self.target_backend == "llamacpp":
            out.append("llama_prompt_lookup")
        return tuple(out)


RUNTIME_CONFIGS: dict[str, RuntimeConfig] = {
    c.label: c
    for c in (
        RuntimeConfig("transformers-eager", "transformers", "transformers"),
        RuntimeConfig("transformers-compiled", "transformers", "transformers", compile=True),
        RuntimeConfig("llamacpp", "llamacpp", "llamacpp"),
        RuntimeConfig("mixed:llamacpp-draft", "transformers", "llamacpp"),
        RuntimeConfig("mixed:transformers-draft", "llamacpp", "transformers"),
    )
}
_CONFIG_ALIASES = {
    "eager": "transformers-eager",
    "transformers": "transformers-eager",
    "compiled": "transformers-compiled",
    "llama.cpp": "llamacpp",
    "mixed": "mixed:llamacpp-draft",
}


def _config_for_backends(target_backend: str, draft_backend: str) -> str:
    for c in RUNTIME_CONFIGS.values():
        if (c.target_backend, c.draft_backend, c.compile) == (target_backend, draft_backend, False):
            return c.label
    raise ValueError(
        f"unknown backend combination target={target_backend!r}, draft={draft_backend!r}; "
        f"backends: transformers, llamacpp"
    )


def _check_config_available(rc: RuntimeConfig) -> None:
    """Refuse, before any model loads, a configuration whose backend module or library is missing."""
    if rc.compile and importlib.util.find_spec("specdec.backends.compiled") is None:
        raise ValueError(
            f"config {rc.label} needs specdec.backends.compiled (CompiledHFBackend), missing from this install"
        )
    if "llamacpp" in (rc.target_backend, rc.draft_backend):
        if importlib.util.find_spec("specdec.backends.llamacpp") is None:
            raise ValueError(f"config {rc.label} needs specdec.backends.llamacpp, missing from this install")
        if importlib.util.find_spec("llama_cpp") is None:
            raise ValueError(
                f"config {rc.label} needs llama-cpp-python: pip install 'specdec[llamacpp]'"
            )


# ------------------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep needs; the defaults are the CPU default study (docs/STORE.md, "The default plan").

    Attributes:
        name: a label stored with the sweep (not part of its identity).
        pair, target, draft: the models (`specdec.models.resolve_pair`).
        prompt_types: ``"all"`` or type names; filters the built-in set or the prompt file.
        prompts: a prompt file (`specdec.bench.prompts.load_prompt_file`); None = the built-in set.
        prompts_per_type: built-in prompts per type (1 = the primary ``<type>-01`` only).
        ks: the fixed-K grid run on primary prompts (the first prompt of each type).
        secondary_ks: the fixed-K grid on the other prompts (no peers or policies there).
        max_new_tokens: new tokens per generation.
        repeats: timed runs per cell (seed = seed + repeat under sampling).
        baseline_repeats: timed target-only runs per prompt (at least `repeats`): the first precedes the
            prompt's other runs, the extra ones follow them, so the baseline, the denominator of every
            speedup, brackets the prompt's runs in time (drift shows as a spread between them).
        methods: among ``baseline``, ``draft``, ``ngram`` and the peer names (a peer named here is run even
            without `peers`).
        policies: adaptive policies run for ``draft`` and ``ngram`` on primary prompts, with K = `policy_k`.
        policy_k: the policies' starting (heuristic) or maximum (confidence, cost) K.
        peers: run every peer that applies to each configuration.
        peer_ks: K for ``hf_assisted`` / ``hf_prompt_lookup`` / ``llama_prompt_lookup``.
        configs: runtime configuration labels (`RUNTIME_CONFIGS`).
        temperature, top_k, top_p: sampling (temperature 0 = greedy); seed: base seed.
        device, dtype, threads: transformers device/dtype; intra-op threads (None = library default).
        chat_template: wrap each prompt in the tokenizer's chat template (user turn + generation prompt).
        backend, draft_backend: shorthand for one configuration (instead of `configs`).
        warmup_tokens: new tokens of each warm-up generation.
        cost_repeats, cost_context_tokens: `measure_costs` settings; the forward curve is measured for
            n = 1..17 (up to the largest K used + 1 when that is more).
        ngram_max, ngram_min: n-gram sizes of our prompt-lookup drafter.
    """

    name: str | None = None
    pair: str | None = None
    target: str | None = None
    draft: str | None = None
    prompt_types: tuple[str, ...] | str = "all"
    prompts: str | None = None
    prompts_per_type: int = 1
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    secondary_ks: tuple[int, ...] = (4,)
    max_new_tokens: int = 128
    repeats: int = 1
    baseline_repeats: int = 2
    methods: tuple[str, ...] = OUR_METHODS
    policies: tuple[str, ...] = ("cost",)
    policy_k: int = 16
    peers: bool = True
    peer_ks: tuple[int, ...] = (4,)
    configs: tuple[str, ...] = ("transformers-eager",)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    chat_template: bool = False
    backend: str | None = None
    draft_backend: str | None = None
    warmup_tokens: int = 16
    cost_repeats: int = 3
    cost_context_tokens: int = 64
    ngram_max: int = 3
    ngram_min: int = 1

    @property
    def sampling(self) -> SamplingParams:
        """The `SamplingParams` of every generation (raises ValueError when invalid)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def runtime_configs(self) -> list[RuntimeConfig]:
        return [RUNTIME_CONFIGS[c] for c in self.configs]


#: What ``--quick`` changes: primaries only, K = 4, 32 new tokens, no peers, no policies, 8-token warm-ups,
#: one timed pass of the cost curve.
QUICK: dict[str, Any] = {
    "prompts_per_type": 1,
    "ks": (4,),
    "secondary_ks": (),
    "max_new_tokens": 32,
    "baseline_repeats": 1,
    "peers": False,
    "policies": (),
    "warmup_tokens": 8,
    "cost_repeats": 1,
}

_FIELD_NAMES = tuple(f.name for f in fields(SweepConfig))
_INT_LISTS = ("ks", "secondary_ks", "peer_ks")
_NAME_LISTS = ("methods", "policies", "configs")
#: Keys a TOML file may hold besides the `SweepConfig` fields.
FILE_ONLY_KEYS = ("db",)


def _as_list(value: Any, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"{what} must be a comma-separated string or a list, got {value!r}")


def _int_list(value: Any, what: str, *, allow_empty: bool) -> tuple[int, ...]:
    items = _as_list(value, what)
    out = []
    for item in items:
        try:
            k = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"{what}: {item!r} is not an integer") from None
        if isinstance(item, float) and item != k:
            raise ValueError(f"{what}: {item!r} is not an integer")
        if k < 1:
            raise ValueError(f"{what}: K must be >= 1, got {k}")
        out.append(k)
    if not out and not allow_empty:
        raise ValueError(f"{what}: give at least one value")
    return tuple(dict.fromkeys(out))


def _normalize(values: dict[str, Any]) -> dict[str, Any]:
    """Coerce and validate raw values (from defaults, QUICK, a TOML file and flags)."""
    v = dict(values)
    v["ks"] = _int_list(v["ks"], "ks", allow_empty=False)
    v["secondary_ks"] = _int_list(v["secondary_ks"], "secondary_ks", allow_empty=True)
    v["peer_ks"] = _int_list(v["peer_ks"], "peer_ks", allow_empty=True)
    methods = [m.lower() for m in _as_list(v["methods"], "methods")]
    bad = [m for m in methods if m not in OUR_METHODS + PEER_METHODS]
    if bad:
        raise ValueError(
            f"unknown method(s) {', '.join(bad)}; choose from {', '.join(OUR_METHODS + PEER_METHODS)}"
        )
    if not methods:
        raise ValueError("methods: give at least one method")
    v["methods"] = tuple(dict.fromkeys(methods))
    policies = [p.lower() for p in _as_list(v["policies"], "policies")]
    if policies in (["none"], ["off"]):
        policies = []
    bad = [p for p in policies if p not in ADAPTIVE_POLICIES]
    if bad:
        hint = " (fixed K is the --ks grid)" if "fixed" in bad else ""
        raise ValueError(f"unknown policy {', '.join(bad)}; choose from {', '.join(ADAPTIVE_POLICIES)}{hint}")
    v["policies"] = tuple(dict.fromkeys(policies))
    configs = []
    for c in _as_list(v["configs"], "configs"):
        label = _CONFIG_ALIASES.get(c.lower(), c)
        if label not in RUNTIME_CONFIGS:
            raise ValueError(
                f"unknown config {c!r}; choose from {', '.join(RUNTIME_CONFIGS)} (or mixed = mixed:llamacpp-draft)"
            )
        configs.append(label)
    if not configs:
        raise ValueError("configs: give at least one runtime configuration")
    v["configs"] = tuple(dict.fromkeys(configs))
    pt = v["prompt_types"]
    if isinstance(pt, (list, tuple)):
        pt = ",".join(str(x) for x in pt)
    v["prompt_types"] = str(pt).strip() or "all"
    for name in ("prompts_per_type", "max_new_tokens", "repeats", "baseline_repeats", "policy_k", "warmup_tokens",
                 "cost_repeats", "cost_context_tokens", "ngram_max", "ngram_min", "top_k", "seed"):
        try:
            v[name] = int(v[name])
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an integer, got {v[name]!r}") from None
    for name, low in (("prompts_per_type", 1), ("max_new_tokens", 1), ("repeats", 1), ("baseline_repeats", 1),
                      ("policy_k", 1), ("warmup_tokens", 1), ("cost_repeats", 1), ("cost_context_tokens", 1),
                      ("ngram_min", 1), ("top_k", 0)):
        if v[name] < low:
            raise ValueError(f"{name} must be >= {low}, got {v[name]}")
    if v["ngram_max"] < v["ngram_min"]:
        raise ValueError(f"ngram_max ({v['ngram_max']}) must be >= ngram_min ({v['ngram_min']})")
    if v["threads"] is not None:
        v["threads"] = int(v["threads"])
        if v["threads"] < 1:
            raise ValueError(f"threads must be >= 1, got {v['threads']}")
    v["temperature"] = float(v["temperature"])
    v["top_p"] = float(v["top_p"])
    SamplingParams(v["temperature"], v["top_k"], v["top_p"])  # validates
    v["peers"] = bool(v["peers"])
    v["chat_template"] = bool(v["chat_template"])
    return v


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a sweep TOML file: top-level keys (or a ``[sweep]`` table) named as `SweepConfig` fields or the
    CLI flags (dashes allowed), plus ``db``.

    Raises:
        ValueError: missing/unreadable file, invalid TOML, or unknown keys (the message lists the valid ones).
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{p}: no such config file") from None
    except OSError as exc:
        raise ValueError(f"{p}: cannot read config file ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p}: invalid TOML ({exc})") from None
    if isinstance(data.get("sweep"), dict):
        data = data["sweep"]
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in _FIELD_NAMES and name not in FILE_ONLY_KEYS:
            raise ValueError(
                f"{p}: unknown key {key!r}; valid keys: {', '.join(_FIELD_NAMES + FILE_ONLY_KEYS)}"
            )
        out[name] = value
    return out


def make_config(
    flags: Mapping[str, Any] | None = None, *, file: Mapping[str, Any] | None = None, quick: bool = False
) -> SweepConfig:
    """Merge, in increasing priority: the defaults, `QUICK` (when `quick`), a config file's values, then
    `flags` (None values are ignored: "not given").

    ``backend``/``draft_backend`` select one configuration when ``configs`` is not given.

    Raises:
        ValueError: an invalid value, or ``configs`` together with a different backend pair.
    """
    values = {f.name: f.default for f in fields(SweepConfig)}
    explicit: set[str] = set()
    if quick:
        values.update(QUICK)
    for source in (file or {}, flags or {}):
        for key, value in source.items():
            if key in FILE_ONLY_KEYS or value is None:
                continue
            if key not in values:
                raise ValueError(f"unknown sweep setting {key!r}")
            values[key] = value
            explicit.add(key)
    if values.get("backend") or values.get("draft_backend"):
        tb = values.get("backend") or "transformers"
        label = _config_for_backends(tb, values.get("draft_backend") or tb)
        if "configs" in explicit and _as_list(values["configs"], "configs") != [label]:
            raise ValueError("give either --configs or --backend/--draft-backend, not both")
        values["configs"] = (label,)
    return SweepConfig(**_normalize(values))


# ---------------------------------------------------------------------------------------- prompts, plan


def select_prompts(cfg: SweepConfig) -> list[Prompt]:
    """The prompts of the sweep: the built-in set (`prompts_per_type` per type) or the prompt file, filtered
    by `prompt_types`. Reads files only; no model is touched.

    Raises:
        PromptFileError (ValueError): the file is unusable. ValueError: unknown types / nothing selected.
    """
    if cfg.prompts is None:
        prompts = load_builtin(cfg.prompt_types, per_type=cfg.prompts_per_type)
    else:
        prompts = load_prompt_file(cfg.prompts)
        if cfg.prompt_types.lower() != "all":
            wanted = [t.strip() for t in cfg.prompt_types.split(",") if t.strip()]
            prompts = [p for p in prompts if p.type in wanted]
            if not prompts:
                raise ValueError(f"{cfg.prompts}: no prompt of type(s) {', '.join(wanted)}")
    if not prompts:
        raise ValueError("no prompts selected")
    return prompts


def primary_ids(prompts: Sequence[Prompt]) -> set[str]:
    """Ids of the primary prompts: the first prompt of each type (``<type>-01`` in the built-in set)."""
    seen: dict[str, str] = {}
    for p in prompts:
        seen.setdefault(p.type, p.id)
    return set(seen.values())


@dataclass(frozen=True)
class Cell:
    """One run to do: a cell x repeat. ``k`` is None for ``baseline``/``hf_generate``; ``policy`` is
    ``"fixed"`` or an adaptive policy for ``draft``/``ngram`` and None for baseline and peers."""

    config_label: str
    prompt: Prompt
    method: str
    k: int | None
    policy: str | None
    repeat: int
    primary: bool = True

    def key(self, sweep_id: str) -> str:
        return cell_key(sweep_id, self.config_label, self.prompt.id, self.method, self.k, self.policy,
                        self.repeat)

    @property
    def group(self) -> tuple:
        """(config_label, method, k, policy): what one warm-up covers."""
        return (self.config_label, self.method, self.k, self.policy)

    @property
    def cell(self) -> tuple:
        """(config_label, prompt_id, method, k, policy): the cell, all repeats."""
        return (self.config_label, self.prompt.id, self.method, self.k, self.policy)

    def describe(self) -> str:
        what = self.method
        if self.k is not None:
            what += f" K={self.k}"
        if self.policy not in (None, "fixed"):
            what += f" {self.policy}"
        return f"[{self.config_label}] {self.prompt.id} {what}"


def build_plan(cfg: SweepConfig, prompts: Sequence[Prompt]) -> list[Cell]:
    """Every run of the sweep, in execution order: per config, per prompt: baseline first (so that the
    other runs can be compared with it), then draft and ngram over K, their policies, then the peers; with
    ``repeats`` > 1 that sequence runs once per repeat (repeat 0 of every run, then repeat 1 ...), so a
    machine that slows down inside a prompt's window hits every method in every pass rather than the ones
    that come last; then the baseline's extra runs (``baseline_repeats`` beyond ``repeats``), so that the
    baseline brackets the prompt's runs in time.

    Primary prompts (first of each type) get `ks`, the policies and the peers; the others get
    `secondary_ks` only.
    """
    prim = primary_ids(prompts)
    plan: list[Cell] = []
    for label in cfg.configs:
        rc = RUNTIME_CONFIGS[label]
        peers = [m for m in PEER_METHODS if (cfg.peers or m in cfg.methods) and m in rc.peers()]
        for prompt in prompts:
            is_primary = prompt.id in prim
            ks = cfg.ks if is_primary else cfg.secondary_ks
            groups: list[tuple[str, int | None, str | None]] = []
            if "baseline" in cfg.methods:
                groups.append(("baseline", None, None))
            for m in ("draft", "ngram"):
                if m in cfg.methods:
                    groups.extend((m, k, "fixed") for k in ks)
            if is_primary:
                for m in ("draft", "ngram"):
                    if m in cfg.methods:
                        groups.extend((m, cfg.policy_k, p) for p in cfg.policies)
                for m in peers:
                    if m == "hf_generate":
                        groups.append((m, None, None))
                    else:
                        groups.extend((m, k, None) for k in cfg.peer_ks)
            for r in range(cfg.repeats):  # repeats outermost: each pass runs every group once
                for method, k, policy in groups:
                    plan.append(Cell(label, prompt, method, k, policy, r, is_primary))
            if "baseline" in cfg.methods:
                for r in range(cfg.repeats, cfg.baseline_repeats):
                    plan.append(Cell(label, prompt, "baseline", None, None, r, is_primary))
    return plan


def meaning(cfg: SweepConfig, prompts: Sequence[Prompt], target: str, draft: str | None) -> dict[str, Any]:
    """The configuration that gives a run its meaning; `sweep_id_for` of this is the sweep's id.

    In: models, prompts (id, type, text digest), max_new_tokens, sampling and base seed, device, dtype,
    threads, chat template, n-gram sizes. Not in: the grid (Ks, methods, policies, peers, repeats,
    configs), so ``--resume`` with a larger grid adds cells to the same sweep.
    """
    return {
        "schema": 1,
        "target": target,
        "draft": draft,
        "prompts": sorted(
            [p.id, p.type, hashlib.sha256(p.text.encode()).hexdigest()[:16]] for p in prompts
        ),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_k": cfg.top_k,
        "top_p": cfg.top_p,
        "seed": cfg.seed,
        "device": cfg.device,
        "dtype": cfg.dtype,
        "threads": cfg.threads,
        "chat_template": cfg.chat_template,
        "ngram": [cfg.ngram_max, cfg.ngram_min],
    }


# ------------------------------------------------------------------------------------------ estimates


#: Target forward seconds for n = 1..17 tokens, measured by the default study's sweep on the development
#: machine (2-vCPU Xeon VM, 2 threads, fp32 Qwen2.5-Coder-1.5B, warm cache; results/study.db, costs table).
_REFERENCE_TARGET_S = (0.2748, 0.2882, 0.2858, 0.5378, 0.5576, 0.5634, 0.7652, 0.7621, 0.7643, 0.9167, 0.9138,
                       0.9075, 1.0635, 1.0771, 1.0724, 0.7681, 0.7822)


def _reference_costs() -> dict[str, Any]:
    """The reference CPU costs used to size the defaults and for `--dry-run` when a store has none: the
    default pair (Qwen2.5-Coder 0.5B -> 1.5B, fp32, 2 threads) as measured on the development machine:
    draft 0.0994 s/token, target 0.2748 s/token (c = 0.36), the forward curve `_REFERENCE_TARGET_S`
    (v(5) = 2.03, v(17) = 2.85; MKL's small-row kernels make it a staircase, not a line)."""
    step = _REFERENCE_TARGET_S[0]
    return {
        "target_step_s": step,
        "draft_step_s": 0.0994,
        "c": 0.0994 / step,
        "target_forward_s": {n: s for n, s in enumerate(_REFERENCE_TARGET_S, start=1)},
    }


REFERENCE_COSTS: dict[str, Any] = _reference_costs()


def _forward_s(costs: Mapping[str, Any], n: int) -> float:
    """Target forward seconds for n tokens: measured, interpolated, or extrapolated past the largest
    measured n with the least-squares slope of the whole curve (robust to a noisy last point)."""
    fwd = {int(k): float(v) for k, v in costs["target_forward_s"].items()}
    if n in fwd:
        return fwd[n]
    xs = sorted(fwd)
    if n > xs[-1]:
        if len(xs) >= 2:
            mx = statistics.fmean(xs)
            my = statistics.fmean(fwd[x] for x in xs)
            slope = sum((x - mx) * (fwd[x] - my) for x in xs) / sum((x - mx) ** 2 for x in xs)
            slope = max(0.0, slope)
        else:
            slope = fwd[xs[-1]] / xs[-1]
        return fwd[xs[-1]] + slope * (n - xs[-1])
    lo = max(x for x in xs if x < n)
    hi = min(x for x in xs if x > n)
    return fwd[lo] + (fwd[hi] - fwd[lo]) * (n - lo) / (hi - lo)


def estimate_generation_s(
    method: str,
    k: int | None,
    policy: str | None,
    costs: Mapping[str, Any],
    new_tokens: int,
    *,
    prompt_tokens: int = 100,
    alpha: float = 0.5,
) -> float:
    """A rough duration (seconds) of one generation, from the costs and a GUESSED acceptance `alpha`.

    Model (Leviathan et al. 2023 with the measured forward curve): prefill = one target forward over the
    prompt (plus c times that for a draft model); target-only = ``new_tokens`` steps; a fixed-K round costs
    ``K * draft_step_s + forward(K + 1)`` (draft cost 0 for prompt lookup) and yields
    ``(1 - alpha^(K+1)) / (1 - alpha)`` tokens. An adaptive policy is assumed to run at the best fixed
    K <= its K. Not a measurement: the sweep prints it labelled as a rough estimate.
    """
    step = float(costs["target_step_s"])
    draft_step = float(costs.get("draft_step_s") or 0.0)
    prefill = _forward_s(costs, max(1, prompt_tokens - 1))
    if method in ("baseline", "hf_generate"):
        return prefill + new_tokens * step
    uses_model = method in ("draft", "hf_assisted")
    if uses_model:
        prefill *= 1.0 + draft_step / step

    def fixed(kk: int) -> float:
        per_round = (kk * draft_step if uses_model else 0.0) + _forward_s(costs, kk + 1)
        return prefill + new_tokens / float(expected_tokens_per_round(alpha, kk)) * per_round

    kk = int(k or 1)
    if policy not in (None, "fixed"):
        return min(fixed(j) for j in range(1, kk + 1))
    return fixed(kk)


def estimate_plan_s(
    cells: Iterable[Cell],
    costs_by_config: Mapping[str, Mapping[str, Any]],
    *,
    max_new_tokens: int,
    warmup_tokens: int,
    prompt_tokens: Mapping[str, int] | None = None,
    alpha: float = 0.5,
    warmed: Iterable[tuple] = (),
) -> tuple[float, float]:
    """``(timed_s, warmup_s)``: the rough duration of `cells` and of their warm-ups (one per group not in
    `warmed`), by `estimate_generation_s`. Cells whose config has no costs are left out.

    `prompt_tokens` maps prompt ids to their token counts (default 100 each).
    """
    timed = warm = 0.0
    seen = set(warmed)
    pt = prompt_tokens or {}
    for c in cells:
        costs = costs_by_config.get(c.config_label)
        if costs is None:
            continue
        if c.method == "llama_prompt_lookup":
            continue  # recorded as skipped, costs nothing
        n_prompt = pt.get(c.prompt.id, 100)
        timed += estimate_generation_s(c.method, c.k, c.policy, costs, max_new_tokens,
                                       prompt_tokens=n_prompt, alpha=alpha)
        if c.group not in seen:
            seen.add(c.group)
            warm += estimate_generation_s(c.method, c.k, c.policy, costs, min(warmup_tokens, max_new_tokens),
                                          prompt_tokens=n_prompt, alpha=alpha)
    return timed, warm


def cost_measurement_s(costs: Mapping[str, Any], max_n: int, repeats: int) -> float:
    """Rough seconds `measure_costs` takes: (repeats + 1 warm-up) passes over forwards of 1..max_n tokens."""
    return (repeats + 1) * sum(_forward_s(costs, n) for n in range(1, max_n + 1))


def format_duration(seconds: float) -> str:
    """``"2h 05m"``, ``"14m 30s"`` or ``"42s"``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def cost_max_n(cfg: SweepConfig) -> int:
    """Largest forward the cost curve covers: n = 1..17 always (K up to 16), more when a cell uses K > 16
    (its verification forward scores K + 1 tokens)."""
    ks = list(cfg.ks) + list(cfg.secondary_ks) + list(cfg.peer_ks)
    if cfg.policies:
        ks.append(cfg.policy_k)
    return max([17] + [k + 1 for k in ks])


# --------------------------------------------------------------------------------------- environment


def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the specdec checkout (``+dirty`` when tracked files changed), or None."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return None


def _version(module: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(module)
    except (md.PackageNotFoundError, ValueError):
        return None


def machine_info(device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """The machine and libraries: CPU model, logical cores, CPUs this process may use, torch threads, memory
    (GiB), OS, Python / torch / transformers / llama-cpp-python / specdec versions, device name."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    info: dict[str, Any] = {
        "host": host_id(),  # [shards] hash of the host name: tells cluster nodes apart
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "torch_threads": threads or torch.get_num_threads(),
        "memory_gib": _memory_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "llama_cpp_python": _version("llama_cpp_python") or _version("llama-cpp-python"),
        "specdec": _version("specdec"),
        "device": device,
        "device_name": _cpu_model(),
        # Load before the sweep: timings are only honest on an otherwise idle machine.
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        idx = torch.device(device).index or 0
        info["device_name"] = torch.cuda.get_device_name(idx)
        info["cuda"] = torch.version.cuda
    return info


def encode_prompt(tokenizer, text: str, *, chat_template: bool = False) -> list[int]:
    """Token ids of a prompt: the tokenizer's default encoding (its special tokens, e.g. a BOS), or with
    `chat_template` the chat template around one user turn plus the generation prompt.

    Raises:
        ValueError: `chat_template` but the tokenizer has none; the prompt encodes to no tokens.
    """
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("--chat-template: this tokenizer has no chat template")
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(out, Mapping) or hasattr(out, "keys"):
            out = out["input_ids"]
        if out and isinstance(out[0], (list, tuple)):
            out = out[0]
        ids = [int(t) for t in out]
    else:
        ids = [int(t) for t in tokenizer(text)["input_ids"]]
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


# --------------------------------------------------------------------------------------------- peers


@dataclass
class PeerOutput:
    """A peer's generation: new token ids, wall seconds around the library call, finish reason."""

    token_ids: list[int]
    total_s: float
    finish_reason: str


def _neutral_generation_config(model, *, max_new_tokens: int, sampling: SamplingParams, eos_ids, pad_id):
    """A copy of the model's generation config with every logits processor our engine does not apply
    turned off, so that ``generate()`` decodes exactly what our engine decodes (greedy: argmax).

    transformers fills the None fields of a passed config from ``model.generation_config``, so the
    neutral values are set explicitly rather than cleared.
    """
    gc_ = copy.deepcopy(model.generation_config)
    eos = sorted(int(e) for e in eos_ids)
    neutral = {
        "max_new_tokens": int(max_new_tokens), "min_new_tokens": None, "min_length": 0,
        "do_sample": not sampling.greedy, "num_beams": 1, "use_cache": True,
        "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
        "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "forced_bos_token_id": None,
        "forced_eos_token_id": None, "suppress_tokens": None, "begin_suppress_tokens": None,
        "sequence_bias": None, "exponential_decay_length_penalty": None, "renormalize_logits": False,
        "remove_invalid_values": False, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
        "min_p": None, "top_h": None, "guidance_scale": None, "watermarking_config": None,
        "eos_token_id": eos if len(eos) != 1 else eos[0], "pad_token_id": pad_id,
        "return_dict_in_generate": False, "output_scores": False, "output_logits": False,
        "prompt_lookup_num_tokens": None, "assistant_early_exit": None,
    }  # fmt: skip
    if sampling.greedy:
        neutral.update(temperature=1.0, top_k=50, top_p=1.0)
    else:
        neutral.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    for key, value in neutral.items():
        setattr(gc_, key, value)
    return gc_


def hf_peer_generate(
    pair,
    method: str,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    k: int | None = None,
    sampling: SamplingParams = GREEDY,
    seed: int | None = None,
) -> PeerOutput:
    """Run one transformers peer on `pair` (a `specdec.loading.LoadedPair`) and time it by the wall clock.

    Methods: ``hf_generate`` (``generate()``, target only); ``hf_assisted`` (``assistant_model=`` the draft
    model, whose generation config is swapped for a copy with ``num_assistant_tokens=K``,
    ``num_assistant_tokens_schedule="constant"`` and ``assistant_confidence_threshold=0`` (off), restored
    afterwards — transformers reads these from the *assistant's* config); ``hf_prompt_lookup``
    (``prompt_lookup_num_tokens=K``, transformers' default n-gram size). Every call uses our EOS ids, an
    attention mask, ``do_sample=False`` under greedy, and no logits processor our engine lacks.

    Returns:
        `PeerOutput` with the new token ids (EOS kept), seconds from just before the call to just after it
        (device synchronized; prefill included and not separable), and ``"eos"``/``"length"``.

    Raises:
        ValueError: unknown method, a peer that needs a transformers target/draft, or K missing.
    """
    if method not in ("hf_generate", "hf_assisted", "hf_prompt_lookup"):
        raise ValueError(f"not a transformers peer: {method!r}")
    model = pair.target.hf_model
    if model is None:
        raise ValueError(f"{method} needs the target on transformers")
    if method != "hf_generate" and not k:
        raise ValueError(f"{method} needs K")
    eos = frozenset(pair.eos_ids)
    tok = pair.tokenizer
    pad_id = getattr(tok, "pad_token_id", None)
    if pad_id is None:
        pad_id = min(eos) if eos else 0
    gen_cfg = _neutral_generation_config(model, max_new_tokens=max_new_tokens, sampling=sampling,
                                         eos_ids=eos, pad_id=pad_id)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "generation_config": gen_cfg}
    assistant = None
    saved_cfg = None
    if method == "hf_assisted":
        if pair.draft is None or pair.draft.hf_model is None:
            raise ValueError("hf_assisted needs the draft model on transformers")
        assistant = pair.draft.hf_model
        saved_cfg = assistant.generation_config
        a_cfg = copy.deepcopy(saved_cfg)
        a_cfg.num_assistant_tokens = int(k)
        a_cfg.num_assistant_tokens_schedule = "constant"
        a_cfg.assistant_confidence_threshold = 0.0
        assistant.generation_config = a_cfg
        kwargs["assistant_model"] = assistant
    elif method == "hf_prompt_lookup":
        gen_cfg.prompt_lookup_num_tokens = int(k)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        if not sampling.greedy:
            torch.manual_seed(0 if seed is None else int(seed))
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)
        sync()
        total = time.perf_counter() - t0
    finally:
        if assistant is not None:
            assistant.generation_config = saved_cfg
    new = [int(t) for t in out[0, ids.shape[1]:].tolist()]
    # Batch of one: nothing is padded after an EOS, but cut defensively at the first one.
    for i, t in enumerate(new):
        if t in eos:
            return PeerOutput(new[: i + 1], total, "eos")
    return PeerOutput(new, total, "length")


# -------------------------------------------------------------------------------------------- runner


@dataclass
class SweepResult:
    """What `run_sweep` did.

    Attributes:
        sweep_id, db: the sweep and its database.
        planned: runs in the plan; already_done: of those, finished before this call (resume).
        ran: runs executed now (successful + failed); failed: of those, recorded with an error;
        skipped: recorded as skipped (error starting with ``skipped:``).
        status: ``done`` (every planned run attempted) or ``interrupted``.
        failed_configs: config_label -> one-line load error, for configurations that could not be loaded.
    """

    sweep_id: str
    db: str
    planned: int
    already_done: int
    ran: int = 0
    failed: int = 0
    skipped: int = 0
    status: str = "running"
    failed_configs: dict[str, str] = field(default_factory=dict)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")
    return msg[:_SUMMARY_ERR_LEN]


def _make_policy(name: str, k: int, costs: Mapping[str, Any] | None, method: str):
    try:
        policies = importlib.import_module("specdec.policies")
    except ImportError:  # pragma: no cover - the module ships with specdec
        policies = None
    make = getattr(policies, "make_policy", None)
    if make is None:
        raise ValueError(
            f"adaptive policy {name!r} needs specdec.policies.make_policy, which this build lacks; "
            f"run without --policies"
        )
    if name == "cost":
        if costs is None:
            raise ValueError("the cost policy needs measured costs for this configuration")
        c = dict(costs)
        if method == "ngram":
            c["draft_step_s"] = 0.0  # prompt lookup drafts at (almost) no cost
        return make(name, k, costs=c)
    return make(name, k)


def _check_policies_available(cfg: SweepConfig) -> None:
    if not cfg.policies:
        return
    policies = importlib.import_module("specdec.policies")
    if getattr(policies, "make_policy", None) is None:
        raise ValueError(
            "--policies needs specdec.policies.make_policy, which this build lacks; run without --policies"
        )


@dataclass
class _Context:
    """State of one loaded configuration during the sweep."""

    cfg: SweepConfig
    rc: RuntimeConfig
    pair: Any
    costs: dict | None
    prompt_ids: dict[str, list[int]]
    threads: int


def _drafter(method: str, ctx: _Context):
    if method == "draft":
        if ctx.pair.draft is None:
            raise ValueError("the draft method needs a draft model")
        return ModelDrafter(ctx.pair.draft.backend, ctx.pair.vocab_size)
    return PromptLookupDrafter(ctx.cfg.ngram_max, ctx.cfg.ngram_min)


def _generate(ctx: _Context, cell: Cell, ids: list[int], n: int) -> tuple[Any, PeerOutput | None]:
    """Run one generation of `cell`: ``(GenerationResult, None)`` for ours, ``(None, PeerOutput)`` for peers."""
    cfg, pair = ctx.cfg, ctx.pair
    seed = cfg.seed + cell.repeat
    sampling = cfg.sampling
    if cell.method in ("hf_generate", "hf_assisted", "hf_prompt_lookup"):
        return None, hf_peer_generate(pair, cell.method, ids, n, k=cell.k, sampling=sampling, seed=seed)
    if cell.method == "llama_prompt_lookup":
        raise _Skip(LLAMA_PROMPT_LOOKUP_SKIP)
    common = {"sampling": sampling, "eos_ids": pair.eos_ids, "vocab_size": pair.vocab_size, "seed": seed}
    target = pair.target.backend
    if cell.method == "baseline":
        return autoregressive_generate(target, ids, n, **common), None
    drafter = _drafter(cell.method, ctx)
    if cell.policy in (None, "fixed"):
        return speculative_generate(target, drafter, ids, n, k=cell.k, **common), None
    policy = _make_policy(cell.policy, int(cell.k), ctx.costs, cell.method)
    policies = importlib.import_module("specdec.policies")
    configure = getattr(policies, "configure_drafter", None)
    if configure is not None:
        configure(policy, drafter)
    return speculative_generate(target, drafter, ids, n, policy=policy, **common), None


class _Skip(Exception):
    """A run that cannot be done here; recorded with its reason as the error."""


def _row(ctx: _Context, cell: Cell, sweep_id: str, target_spec: str, draft_spec: str | None, pair_name,
         ids: list[int] | None) -> dict[str, Any]:
    cfg = ctx.cfg
    return {
        "sweep_id": sweep_id,
        "cell_key": cell.key(sweep_id),
        "config_label": cell.config_label,
        "pair": pair_name,
        "target": target_spec,
        "draft": draft_spec,
        "target_backend": RUNTIME_CONFIGS[cell.config_label].target_backend,
        "draft_backend": RUNTIME_CONFIGS[cell.config_label].draft_backend,
        "compiled": int(RUNTIME_CONFIGS[cell.config_label].compile),
        "device": cfg.device,
        "dtype": cfg.dtype,
        "threads": ctx.threads,
        "prompt_id": cell.prompt.id,
        "prompt_type": cell.prompt.type,
        "chat_template": int(cfg.chat_template),
        "prompt_tokens": len(ids) if ids is not None else None,
        "method": cell.method,
        "policy": cell.policy,
        "k": cell.k,
        "repeat": cell.repeat,
        "seed": cfg.seed + cell.repeat,
        "temperature": cfg.temperature,
        "top_k": cfg.top_k,
        "top_p": cfg.top_p,
        "max_new_tokens": cfg.max_new_tokens,
    }


def _free(pair) -> None:
    """Drop a loaded pair's models (and llama.cpp contexts) so the next configuration fits in memory."""
    if pair is None:
        return
    for m in (pair.target, pair.draft):
        if m is None:
            continue
        close = getattr(m.backend, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prepare(cfg: SweepConfig) -> tuple[list[Prompt], str, str | None, str | None, dict, str, list[Cell]]:
    """Everything that can be checked without loading a model: prompts, models, configurations, policies.

    Returns:
        ``(prompts, target_spec, draft_spec, pair_name, meaning, sweep_id, plan)``.

    Raises:
        ValueError (incl. PromptFileError): bad prompts, unknown preset, unavailable configuration/policy.
    """
    from specdec import models

    prompts = select_prompts(cfg)
    target, draft = models.resolve_pair(cfg.pair, cfg.target, cfg.draft)
    pair_name = cfg.pair or (models.DEFAULT_PAIR if cfg.target is None and cfg.draft is None else None)
    for rc in cfg.runtime_configs():
        _check_config_available(rc)
    _check_policies_available(cfg)
    m = meaning(cfg, prompts, target, draft)
    sid = sweep_id_for(m)
    return prompts, target, draft, pair_name, m, sid, build_plan(cfg, prompts)


def run_sweep(
    cfg: SweepConfig,
    *,
    db: str | Path = DEFAULT_DB,
    resume: bool = False,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    max_runs: int | None = None,
    on_run: Callable[[dict], None] | None = None,
    loader: Callable[..., Any] | None = None,
    shard: str | None = None,
) -> SweepResult:
    """Run (or resume) a sweep and store every run in `db`.

    Args:
        cfg: the sweep (`make_config`).
        db: the SQLite results file (created if missing).
        resume: continue the sweep with this configuration: finished runs are skipped, failed ones retried.
        progress: show a progress bar with ETA (tqdm, on stderr).
        echo: where plan/summary lines go (default: print to stdout, or above the progress bar).
        max_runs: stop after this many runs (for tests and partial runs); the sweep is left ``interrupted``.
        on_run: called with each stored run row (after its commit).
        loader: `specdec.loading.load_pair`-compatible (injectable for tests).
        shard: ``"I/N"`` (or a `specdec.bench.shard.Shard`): run only this shard's prompts
            (`specdec.bench.shard.shard_plan`); the sweep id is unchanged, the shard is recorded in ``shards``.

    Returns:
        A `SweepResult`.

    Raises:
        ValueError (PromptFileError, StoreError ...): bad settings or prompts (before any model loads),
            ``SweepExistsError`` / ``SweepNotFoundError`` (see `Store.begin_sweep`), or every configuration
            failed to load (the first load error).
        KeyboardInterrupt: re-raised after marking the sweep ``interrupted`` (finished runs are kept).
    """
    from tqdm.auto import tqdm

    if loader is None:
        from specdec.loading import load_pair as loader
    prompts, target_spec, draft_spec, pair_name, cfg_meaning, sid, plan = prepare(cfg)
    plan = shard_plan(plan, prompts, shard)  # [shards] only this shard's prompts (all of it when None)
    store = Store(db)
    bar = None
    say = echo or print

    def log(msg: str) -> None:
        if bar is not None and echo is None:
            bar.write(msg)
        else:
            say(msg)

    try:
        machine = machine_info(cfg.device, cfg.threads)
        row = store.begin_sweep(sid, cfg_meaning, resume=resume, name=cfg.name, machine=machine,
                                git_commit=git_commit())
        record_shard(store, sid, shard)  # [shards] which shard this store holds, on which machine
        load = machine.get("loadavg_1m")
        if load is not None and load > 0.5:
            log(f"warning: the 1-minute load average is {load:.2f} before any model runs; other work on this "
                f"machine distorts every timing (each thread needs an idle core)")
        changed = _machine_changes(row.get("machine_json"), machine)
        if changed:
            log(f"warning: this sweep was started with another {', '.join(changed)}; the runs added now are "
                f"timed on this machine, so compare them with care")
        done = store.done_cells(sid)
        todo = [c for c in plan if c.key(sid) not in done]
        result = SweepResult(sid, str(db), len(plan), len(plan) - len(todo))
        n_cfg = len(cfg.configs)
        log(
            f"sweep {sid}: {len(plan)} timed generations ({len(prompts)} prompts x {n_cfg} config(s), "
            f"{cfg.max_new_tokens} new tokens, {cfg.repeats} repeat(s)); {result.already_done} already done, "
            f"{len(todo)} to run; results in {db}"
        )
        baseline_tps = _baseline_tps(store, sid)
        bar = tqdm(total=len(todo), unit="run", disable=not progress, file=sys.stderr, dynamic_ncols=True,
                   desc="sweep")
        stopped = False
        for rc in cfg.runtime_configs():
            cells = [c for c in todo if c.config_label == rc.label]
            if not cells or stopped:
                continue
            ctx = None
            try:
                ctx = _load_config(cfg, rc, loader, target_spec, draft_spec, store, sid, log)
            except Exception as exc:  # noqa: BLE001 - a config that cannot load is reported, the rest run
                result.failed_configs[rc.label] = _one_line(exc)
                log(f"[{rc.label}] could not be loaded, its {len(cells)} runs are left for --resume: "
                    f"{_one_line(exc)}")
                bar.update(len(cells))
                continue
            try:
                stopped = _run_config(ctx, cells, plan, sid, store, result, baseline_tps, target_spec,
                                      draft_spec, pair_name, log, bar, max_runs, on_run)
            finally:
                pair = ctx.pair
                ctx = None
                _free(pair)
                del pair
        if result.failed_configs and result.ran == 0 and set(result.failed_configs) == {
            c.config_label for c in todo
        }:
            store.set_status(sid, "interrupted")
            result.status = "interrupted"
            first = next(iter(result.failed_configs.values()))
            raise ValueError(f"no configuration could be loaded: {first}")
        result.status = "interrupted" if (stopped or result.failed_configs) else "done"
        store.set_status(sid, result.status)
        log(
            f"sweep {sid} {result.status}: {result.ran} runs now ({result.failed} failed, {result.skipped} "
            f"skipped), {store.count_runs(sid, errors=False)}/{len(plan)} planned runs stored successfully"
        )
        return result
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            store.set_status(sid, "interrupted")
        raise
    finally:
        if bar is not None:
            bar.close()
        store.close()


_MACHINE_KEYS = ("cpu_model", "cpu_count", "device_name", "torch", "transformers", "llama_cpp_python")


def _machine_changes(stored_json: str | None, now: Mapping[str, Any]) -> list[str]:
    """Keys of `_MACHINE_KEYS` whose value differs between the sweep's recorded machine and this one."""
    try:
        stored = json.loads(stored_json) if stored_json else {}
    except ValueError:
        return []
    return [k for k in _MACHINE_KEYS if k in stored and stored.get(k) != now.get(k)]


def _baseline_tps(store: Store, sid: str) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for r in store.runs(sid, method="baseline"):
        if r["error"] is None and r["tokens_per_s"]:
            out.setdefault((r["config_label"], r["prompt_id"]), []).append(r["tokens_per_s"])
    return out


def _load_config(cfg, rc, loader, target_spec, draft_spec, store, sid, log) -> _Context:
    """Load a configuration's models once, tokenize the prompts, and measure (or reuse) its costs."""
    log(f"[{rc.label}] loading target {target_spec} ({rc.target_backend}) and draft {draft_spec} "
        f"({rc.draft_backend}){' compiled' if rc.compile else ''} ...")
    t0 = time.perf_counter()
    pair = loader(
        target_spec, draft_spec, backend=rc.target_backend, draft_backend=rc.draft_backend, device=cfg.device,
        dtype=cfg.dtype, threads=cfg.threads, compile=rc.compile,
    )
    threads = int(cfg.threads or torch.get_num_threads())
    ctx = _Context(cfg, rc, pair, None, {}, threads)
    compile_s = sum(m.compile_s for m in (pair.target, pair.draft) if m is not None)
    log(f"[{rc.label}] loaded in {time.perf_counter() - t0:.1f} s"
        + (f" (of which {compile_s:.1f} s compiling, before any timing)" if rc.compile else ""))
    costs = store.load_costs(sid, rc.label)
    max_n = cost_max_n(cfg)
    if costs is None or max(costs["target_forward_s"]) < max_n:
        t0 = time.perf_counter()
        costs = measure_costs(pair, max_n=max_n, repeats=cfg.cost_repeats,
                              context_tokens=cfg.cost_context_tokens)
        store.save_costs(sid, rc.label, costs)
        costs = store.load_costs(sid, rc.label)
        log(f"[{rc.label}] costs measured in {time.perf_counter() - t0:.1f} s")
    ctx.costs = costs
    v_max = costs["target_forward_s"][max_n] / costs["target_step_s"]
    c_txt = f"{costs['c']:.3f}" if costs.get("c") is not None else "n/a"
    d_txt = f"{costs['draft_step_s'] * 1e3:.1f} ms" if costs.get("draft_step_s") is not None else "n/a"
    log(f"[{rc.label}] target step {costs['target_step_s'] * 1e3:.1f} ms, draft step {d_txt}, c = {c_txt}, "
        f"v({max_n}) = {v_max:.2f} target steps")
    return ctx


def _prompt_ids(ctx: _Context, prompt: Prompt) -> list[int]:
    ids = ctx.prompt_ids.get(prompt.id)
    if ids is None:
        ids = encode_prompt(ctx.pair.tokenizer, prompt.text, chat_template=ctx.cfg.chat_template)
        ctx.prompt_ids[prompt.id] = ids
    return ids


def _run_config(ctx, cells, plan, sid, store, result, baseline_tps, target_spec, draft_spec, pair_name,
                log, bar, max_runs, on_run) -> bool:
    """Warm up and run one configuration's remaining cells; True when `max_runs` stopped the sweep."""
    cfg = ctx.cfg
    label = ctx.rc.label
    token_counts = {}
    for c in cells:
        with contextlib.suppress(Exception):
            token_counts[c.prompt.id] = len(_prompt_ids(ctx, c.prompt))
    timed, warm = estimate_plan_s(cells, {label: ctx.costs}, max_new_tokens=cfg.max_new_tokens,
                                  warmup_tokens=cfg.warmup_tokens, prompt_tokens=token_counts)
    log(f"[{label}] {len(cells)} generations + {len({c.group for c in cells})} warm-ups: rough estimate "
        f"{format_duration(timed + warm)} (from the measured step times and an ASSUMED acceptance "
        f"alpha = 0.5; not a measurement)")
    warm_prompt = cells[0].prompt
    warmed: set[tuple] = set()
    # Remaining runs per cell, to print one summary line when a cell's last repeat is done.
    remaining: dict[tuple, int] = {}
    for c in cells:
        remaining[c.cell] = remaining.get(c.cell, 0) + 1
    finished: dict[tuple, list[dict]] = {}
    baseline_ids: dict[str, list[int] | None] = {}
    for cell in cells:
        if max_runs is not None and result.ran >= max_runs:
            return True
        if cell.group not in warmed:
            warmed.add(cell.group)
            _warm_up(ctx, cell, warm_prompt, log)
        row, rounds = _execute(ctx, cell, sid, target_spec, draft_spec, pair_name)
        if cfg.greedy and row.get("token_ids") is not None:
            if cell.prompt.id not in baseline_ids or baseline_ids[cell.prompt.id] is None:
                baseline_ids[cell.prompt.id] = store.baseline_tokens(sid, label, cell.prompt.id)
            ref = baseline_ids[cell.prompt.id]
            if cell.method == "baseline" and ref is None:
                ref = row["token_ids"]
            row["matches_baseline"] = None if ref is None else int(row["token_ids"] == ref)
        store.record_run(row, rounds)
        result.ran += 1
        if row.get("error"):
            if str(row["error"]).startswith("skipped:"):
                result.skipped += 1
            else:
                result.failed += 1
        if cell.method == "baseline" and not row.get("error") and row.get("tokens_per_s"):
            baseline_tps.setdefault((label, cell.prompt.id), []).append(row["tokens_per_s"])
        if on_run is not None:
            on_run(row)
        bar.update(1)
        finished.setdefault(cell.cell, []).append(row)
        remaining[cell.cell] -= 1
        if remaining[cell.cell] == 0:
            log(_summary_line(cell, finished.pop(cell.cell), baseline_tps.get((label, cell.prompt.id))))
    return False


def _warm_up(ctx: _Context, cell: Cell, prompt: Prompt, log) -> None:
    """One untimed, unstored generation of `cell`'s group on `prompt` (`warmup_tokens` new tokens)."""
    if cell.method == "llama_prompt_lookup":
        return
    try:
        ids = _prompt_ids(ctx, prompt)
        _generate(ctx, replace(cell, prompt=prompt), ids, min(ctx.cfg.warmup_tokens, ctx.cfg.max_new_tokens))
    except Exception as exc:  # noqa: BLE001 - the timed run will fail the same way and be recorded
        log(f"{cell.describe()}: warm-up failed: {_one_line(exc)}")


def _execute(ctx: _Context, cell: Cell, sid, target_spec, draft_spec, pair_name) -> tuple[dict, list[dict]]:
    """Run one timed generation; return its ``runs`` row and ``rounds`` rows (an error is recorded, never
    raised, except KeyboardInterrupt)."""
    ids = None
    row = _row(ctx, cell, sid, target_spec, draft_spec, pair_name, None)
    try:
        ids = _prompt_ids(ctx, cell.prompt)
        row["prompt_tokens"] = len(ids)
        res, peer = _generate(ctx, cell, ids, ctx.cfg.max_new_tokens)
    except _Skip as exc:
        row["error"] = str(exc)[:_SUMMARY_ERR_LEN]
        return row, []
    except Exception as exc:  # noqa: BLE001 - a failed run is recorded (error set) and the sweep goes on
        row["error"] = _one_line(exc)
        return row, []
    if peer is not None:
        n = len(peer.token_ids)
        row.update(
            new_tokens=n, finish_reason=peer.finish_reason, token_ids=peer.token_ids, total_s=peer.total_s,
            tokens_per_s=n / peer.total_s if peer.total_s > 0 else None,
        )
        return row, []
    s = res.summary()
    row.update(
        new_tokens=res.num_tokens, finish_reason=res.finish_reason, token_ids=list(res.token_ids),
        num_rounds=res.num_rounds, num_drafted=res.num_drafted, num_accepted=res.num_accepted,
        num_rejections=res.num_rejections, prefill_s=res.prefill_s, ttft_s=res.ttft_s,
        decode_s=res.decode_s, total_s=res.total_s, draft_s=res.draft_s, verify_s=res.verify_s,
        tokens_per_s=s["tokens_per_s"],
    )
    return row, res.rounds_as_dicts()


def _summary_line(cell: Cell, rows: list[dict], baseline: list[float] | None) -> str:
    head = cell.describe()
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        return f"{head}: {'SKIPPED' if str(rows[-1]['error']).startswith('skipped:') else 'FAILED'} " \
               f"({rows[-1]['error']})"
    tps = statistics.median(r["tokens_per_s"] for r in ok if r["tokens_per_s"] is not None) \
        if any(r["tokens_per_s"] for r in ok) else math.nan
    parts = [f"{tps:.2f} tok/s"]
    if cell.method != "baseline" and baseline:
        parts.append(f"x{tps / statistics.median(baseline):.2f} vs baseline")
    drafted = sum(r.get("num_drafted") or 0 for r in ok)
    if drafted:
        acc = sum(r.get("num_accepted") or 0 for r in ok)
        rej = sum(r.get("num_rejections") or 0 for r in ok)
        parts.append(f"acceptance {acc / drafted:.2f}")
        if acc + rej:
            parts.append(f"alpha-hat {acc / (acc + rej):.2f}")
    matches = [r.get("matches_baseline") for r in ok if r.get("matches_baseline") is not None]
    if matches:
        parts.append("= baseline" if all(matches) else "DIFFERS from baseline")
    if len(ok) < len(rows):
        parts.append(f"{len(rows) - len(ok)} failed")
    return f"{head}: " + ", ".join(parts)


def plan_summary(plan: Sequence[Cell]) -> dict[str, int]:
    """Runs per method label (``draft K=4``, ``ngram cost``, ``hf_generate`` ...), for ``--dry-run``."""
    out: dict[str, int] = {}
    for c in plan:
        key = c.method
        if c.policy not in (None, "fixed"):
            key += f" {c.policy} (K<={c.k})"
        elif c.k is not None:
            key += f" K={c.k}"
        out[key] = out.get(key, 0) + 1
    return out


def to_json(cfg: SweepConfig) -> str:
    """The full configuration as JSON (for logs and ``--dry-run``)."""
    return json.dumps(asdict(cfg), sort_keys=True)
