"""Sweep settings: the runtime configurations, `SweepConfig` and its sources (defaults, ``--quick``, a TOML
file, command-line flags), validated once by `make_config`."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specdec.bench.methods import METHODS, our_methods, peer_methods, peers_for
from specdec.sampling import SamplingParams

__all__ = [
    "ADAPTIVE_POLICIES",
    "DEFAULT_DB",
    "FILE_ONLY_KEYS",
    "OUR_METHODS",
    "PEER_METHODS",
    "QUICK",
    "RUNTIME_CONFIGS",
    "RuntimeConfig",
    "SweepConfig",
    "check_available",
    "load_config_file",
    "make_config",
    "parse_type_ks",
    "to_json",
    "type_ks_entries",
    "type_ks_for",
]

OUR_METHODS = tuple(m.name for m in our_methods() if m.default)
PEER_METHODS = tuple(m.name for m in peer_methods())
ADAPTIVE_POLICIES = ("heuristic", "confidence", "cost")
DEFAULT_DB = "results/sweep.db"

# ------------------------------------------------------------------------------------ runtime configs


@dataclass(frozen=True)
class RuntimeConfig:
    """One runtime configuration (``config_label``): which runtime runs the target and the draft.

    Attributes:
        label: the ``config_label`` stored with every run.
        target_backend, draft_backend: ``"transformers"`` or ``"llamacpp"``.
        compile: transformers only: the compiled static-cache backend (`specdec.backends.compiled`).
        dtype: transformers dtype of both models (None: the sweep's ``dtype``).
        quant: transformers weight quantization of both models (`specdec.precision`; None: full weights).
        self_draft_quant: draft with a copy of the TARGET quantized this way (e.g. ``"int8"``) instead of
            the sweep's draft model: same tokenizer, cost set by bytes read.
        pad_verify: our speculative methods pad each verification forward to the cheapest shape on the
            configuration's measured cost curve (`specdec.costs.CostCurve.padded_n`; output unchanged),
            and the cost policy prices K with the padded cost. Loading is unchanged.
    """

    label: str
    target_backend: str
    draft_backend: str
    compile: bool = False
    dtype: str | None = None
    quant: str | None = None
    self_draft_quant: str | None = None
    pad_verify: bool = False

    def load_kwargs(self, sweep_dtype: str) -> dict:
        """The `specdec.loading.load_pair` arguments this configuration sets beyond the runtimes (only those
        it changes, so that loaders that know none of them keep working)."""
        kw: dict = {"dtype": self.dtype or sweep_dtype}
        if self.quant is not None:
            kw["quant"] = self.quant
        if self.self_draft_quant is not None:
            kw["draft_quant"] = self.self_draft_quant
        return kw

    def target_precision(self, sweep_dtype: str) -> str:
        """What the target's weights run in, as stored in ``runs.dtype``: the transformers dtype
        (``"bfloat16"``; ``"float32+int8"`` with int8 weight-only quantization) or ``"gguf"`` on llama.cpp
        (the GGUF's own quantization, e.g. Q4_K_M). `sweep_dtype` is the sweep's ``--dtype``."""
        if self.target_backend == "llamacpp":
            return "gguf"
        dtype = self.dtype or sweep_dtype
        return f"{dtype}+{self.quant}" if self.quant else dtype

    def peers(self) -> tuple[str, ...]:
        """The peer methods that apply to this configuration (`Method.applies`)."""
        return peers_for(self)


RUNTIME_CONFIGS: dict[str, RuntimeConfig] = {
    c.label: c
    for c in (
        RuntimeConfig("transformers-eager", "transformers", "transformers"),
        RuntimeConfig("transformers-compiled", "transformers", "transformers", compile=True),
        RuntimeConfig("llamacpp", "llamacpp", "llamacpp"),
        RuntimeConfig("mixed:llamacpp-draft", "transformers", "llamacpp"),
        RuntimeConfig("mixed:transformers-draft", "llamacpp", "transformers"),
        # a bf16 transformers target drafted by the Q4_K_M GGUF draft on llama.cpp: the target's output
        # is bf16 target-only decoding's; the draft costs llama.cpp's step (c ~ 0.1 here instead of 0.35)
        RuntimeConfig("mixed:llamacpp-draft-bf16", "transformers", "llamacpp", dtype="bfloat16"),
        # The fast CPU configurations (issue 19); bf16 needs native bf16 kernels (refused in one line otherwise).
        RuntimeConfig("transformers-bf16", "transformers", "transformers", dtype="bfloat16"),
        RuntimeConfig("transformers-bf16-compiled", "transformers", "transformers", compile=True,
                      dtype="bfloat16"),
        RuntimeConfig("transformers-int8", "transformers", "transformers", quant="int8"),
        RuntimeConfig("transformers-bf16-int8", "transformers", "transformers", dtype="bfloat16", quant="int8"),
        RuntimeConfig("self-draft:bf16-int8", "transformers", "transformers", dtype="bfloat16",
                      self_draft_quant="int8"),
        # fp32 eager with verification padded to the cheapest measured shape (issue 19)
        RuntimeConfig("transformers-padded", "transformers", "transformers", pad_verify=True),
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


def check_available(rc: RuntimeConfig) -> None:
    """Refuse, before any model loads, a configuration whose optional library (llama-cpp-python) is
    missing."""
    if "llamacpp" in (rc.target_backend, rc.draft_backend) and importlib.util.find_spec("llama_cpp") is None:
        raise ValueError(f"config {rc.label} needs llama-cpp-python: pip install 'specdec[llamacpp]'")


# ------------------------------------------------------------------------------------- configuration


#: How target-only runs are placed around the other runs (`SweepConfig.pairing`).
PAIRINGS = ("bracket", "none")


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
        type_ks: extra fixed K timed on EVERY prompt of a type, per drafter: entries ``"method:type=K"``
            (e.g. the best fixed K per type from an earlier store's acceptance traces, which `specdec report`
            prints in this form); a K already in the prompt's grid is not timed twice.
        max_new_tokens: new tokens per generation.
        repeats: timed runs per cell (seed = seed + repeat under sampling).
        baseline_repeats: with ``pairing="none"`` only: timed target-only runs per prompt (at least
            `repeats`): the first precedes the prompt's other runs, the extra ones follow them.
        pairing: ``"bracket"`` (default): every timed run other than the baseline sits between two target-only
            runs of the same prompt (B X1 B X2 B ... B), and its speedup is its ratio to the geometric mean of
            those two neighbours (`specdec.report.speedup.paired_ratios`); ``"none"``: the older order
            (baseline first, the other runs, `baseline_repeats` - 1 baselines after).
        traces: record each prompt's acceptance trace after its first target-only run (greedy sweeps only;
            `specdec.traces`): one teacher-forced draft and one target forward.
        calibration_repeats: timed passes of the calibration block (target forwards of n = 1..17 tokens and
            the draft step, at the prompt's own context) after each prompt's first target-only run; 0 = off.
        methods: among ``baseline``, ``draft``, ``ngram`` and the peer names (a peer named here is run even
            without `peers`).
        policies: adaptive policies run for ``draft`` and ``ngram`` on primary prompts, with K = `policy_k`.
        secondary_policies: adaptive policies run on the other prompts too (default none), so a policy can be
            timed paired over every prompt of a type.
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
        skip_long_prompts: leave out the prompts whose tokens + max_new_tokens exceed the target's or the
            draft's context (named in one line); without it such a plan is refused before any run.
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
    type_ks: tuple[str, ...] = ()
    max_new_tokens: int = 128
    repeats: int = 1
    baseline_repeats: int = 2
    pairing: str = "bracket"
    traces: bool = True
    calibration_repeats: int = 2
    methods: tuple[str, ...] = OUR_METHODS
    policies: tuple[str, ...] = ("cost",)
    secondary_policies: tuple[str, ...] = ()
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
    skip_long_prompts: bool = False

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
    "calibration_repeats": 1,
}

_FIELD_NAMES = tuple(f.name for f in fields(SweepConfig))
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


def parse_type_ks(value: Any, methods: tuple[str, ...]) -> tuple[str, ...]:
    """Validate ``type_ks`` entries ``"method:type=K"`` (a comma-separated string or a list; ``type=K`` alone
    means every drafting method of the sweep) and return them normalized, one (method, type, K) per entry,
    in the order given without repeats.

    Raises:
        ValueError: an entry not of that form, a method that takes no K or is not in the sweep's methods,
            or K < 1 (one line naming the entry).
    """
    drafting = [m.name for m in our_methods() if m.takes_k and m.name in methods]
    out: list[str] = []
    for item in _as_list(value, "type_ks"):
        entry = str(item).strip()
        head, eq, k_txt = entry.partition("=")
        method, colon, ptype = head.partition(":")
        if not colon:
            method, ptype = "", head
        method, ptype = method.strip().lower(), ptype.strip()
        try:
            k = int(k_txt)
        except ValueError:
            k = 0
        if not eq or not ptype or k < 1:
            raise ValueError(f"type_ks: {entry!r} is not method:type=K with K >= 1 (e.g. draft:code=3)")
        if method and method not in drafting:
            raise ValueError(f"type_ks: {entry!r}: {method!r} is not a drafting method of this sweep "
                             f"({', '.join(drafting) or 'none'})")
        for m in [method] if method else drafting:
            out.append(f"{m}:{ptype}={k}")
    return tuple(dict.fromkeys(out))


def type_ks_entries(cfg: SweepConfig) -> list[tuple[str, str, int]]:
    """`cfg.type_ks` (normalized by `parse_type_ks`) as ``(method, prompt_type, K)`` triples, in order."""
    out = []
    for e in cfg.type_ks:
        head, _, k = e.rpartition("=")
        method, _, ptype = head.partition(":")
        out.append((method, ptype, int(k)))
    return out


def type_ks_for(cfg: SweepConfig, method: str, prompt_type: str) -> tuple[int, ...]:
    """The extra fixed K of `cfg.type_ks` for one drafting method and prompt type (tokens, in order)."""
    return tuple(k for m, t, k in type_ks_entries(cfg) if (m, t) == (method, prompt_type))


def _normalize_names(v: dict[str, Any]) -> None:
    """Validate the name lists in place: methods (`METHODS`), policies, configs (aliases resolved)."""
    methods = [m.lower() for m in _as_list(v["methods"], "methods")]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    if not methods:
        raise ValueError("methods: give at least one method")
    v["methods"] = tuple(dict.fromkeys(methods))
    for field in ("policies", "secondary_policies"):
        policies = [p.lower() for p in _as_list(v[field], field)]
        if policies in (["none"], ["off"]):
            policies = []
        bad = [p for p in policies if p not in ADAPTIVE_POLICIES]
        if bad:
            hint = " (fixed K is the --ks grid)" if "fixed" in bad else ""
            raise ValueError(f"unknown policy {', '.join(bad)}; choose from {', '.join(ADAPTIVE_POLICIES)}{hint}")
        v[field] = tuple(dict.fromkeys(policies))
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


def _normalize(values: dict[str, Any]) -> dict[str, Any]:
    """Coerce and validate raw values (from defaults, QUICK, a TOML file and flags)."""
    v = dict(values)
    v["ks"] = _int_list(v["ks"], "ks", allow_empty=False)
    v["secondary_ks"] = _int_list(v["secondary_ks"], "secondary_ks", allow_empty=True)
    v["peer_ks"] = _int_list(v["peer_ks"], "peer_ks", allow_empty=True)
    _normalize_names(v)
    v["type_ks"] = parse_type_ks(v["type_ks"], v["methods"])
    pt = v["prompt_types"]
    if isinstance(pt, (list, tuple)):
        pt = ",".join(str(x) for x in pt)
    v["prompt_types"] = str(pt).strip() or "all"
    for name in ("prompts_per_type", "max_new_tokens", "repeats", "baseline_repeats", "policy_k", "warmup_tokens",
                 "cost_repeats", "cost_context_tokens", "ngram_max", "ngram_min", "top_k", "seed",
                 "calibration_repeats"):
        try:
            v[name] = int(v[name])
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an integer, got {v[name]!r}") from None
    for name, low in (("prompts_per_type", 1), ("max_new_tokens", 1), ("repeats", 1), ("baseline_repeats", 1),
                      ("policy_k", 1), ("warmup_tokens", 1), ("cost_repeats", 1), ("cost_context_tokens", 1),
                      ("ngram_min", 1), ("top_k", 0), ("calibration_repeats", 0)):
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
    v["pairing"] = str(v["pairing"]).strip().lower()
    if v["pairing"] not in PAIRINGS:
        raise ValueError(f"pairing must be one of {', '.join(PAIRINGS)}, got {v['pairing']!r}")
    v["traces"] = bool(v["traces"])
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


def to_json(cfg: SweepConfig) -> str:
    """The full configuration as JSON (for logs and ``--dry-run``)."""
    return json.dumps(asdict(cfg), sort_keys=True)
