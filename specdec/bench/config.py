"""Sweep settings: `SweepConfig` (each field declared once, with its default, help text and help panel:
`specdec.bench.settings.setting`) and its sources (defaults, ``--quick``, a TOML file, command-line flags),
validated once by `make_config`. The runtime configurations are `specdec.catalogue.runtimes`'."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from specdec.bench.methods import METHODS, our_methods, peer_methods
from specdec.bench.settings import (
    PANEL_MODELS,
    PANEL_RUNTIME,
    PANEL_SAMPLING,
    PANEL_STORE,
    Setting,
    setting,
)
from specdec.bench.values import (
    BEST_K,
    as_list,
    float_list,
    int_list,
    parse_batch_sizes,
    parse_type_ks,
    policy_name,
)
from specdec.catalogue.drafters import DEFAULT_DRAFTER, DRAFT_MODEL
from specdec.catalogue.policies import ADAPTIVE_POLICIES
from specdec.catalogue.runtimes import (
    CONFIG_ALIASES,
    RUNTIME_CONFIGS,
    RuntimeConfig,
    check_available,
    config_for_backends,
)
from specdec.core.sampling import SamplingParams

__all__ = [
    "ADAPTIVE_POLICIES", "AUTO_CONFIG", "BEST_K", "DEFAULT_DB", "FILE_ONLY_KEYS", "FILE_SETTINGS", "OUR_METHODS",
    "PEER_METHODS", "QUICK", "RUNTIME_CONFIGS", "RuntimeConfig", "SweepConfig", "axis_configs", "check_available",
    "default_config", "load_config_file", "make_config",
]  # fmt: skip

OUR_METHODS = tuple(m.name for m in our_methods() if m.default)
PEER_METHODS = tuple(m.name for m in peer_methods())
POLICIES = (BEST_K, *ADAPTIVE_POLICIES)
#: The default runtime configuration: the fastest exact-by-design transformers path this machine supports
#: (`default_config`).
AUTO_CONFIG = "auto"
DEFAULT_DB = "results/sweep.db"

# ------------------------------------------------------------------------------------- configuration

#: The policies the main job times: each prompt's best fixed K, and the cost policy of the default drafter
#: (the default policy, `specdec.catalogue.drafters.default_policy`) and of the draft model.
DEFAULT_POLICIES = (BEST_K, *dict.fromkeys((f"{DEFAULT_DRAFTER}:cost", f"{DRAFT_MODEL}:cost")))


#: How target-only runs are placed around the other runs (`SweepConfig.pairing`).
PAIRINGS = ("bracket", "none")


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep needs; the defaults are the CPU default study (docs/STORE.md, "The default plan").

    Each field is declared once with `setting`: its default, its help text (what ``specdec sweep --help``
    prints, and the field's documentation) and its help panel. Beyond the help texts:

    - ``pairing="bracket"``: every timed run other than the baseline sits between two target-only runs of
      the same prompt (B X1 B X2 B ... B), and its speedup is its ratio to the geometric mean of those two
      neighbours (`specdec.report.speedup.paired_reference`); ``"none"``: baseline first, the other runs, then
      `baseline_repeats` - 1 baselines (`baseline_repeats` applies to this order only).
    - `traces` records one teacher-forced draft forward and one target forward per prompt (`specdec.engine.traces`);
      `calibration_repeats` times target forwards of n = 1 .. `specdec.bench.plan.cost_max_n` tokens and
      the draft step at the prompt's own context.
    - a peer named in `methods` is run even without `peers`; `backend` / `draft_backend` select one runtime
      configuration instead of `configs` (`make_config`).
    """

    name: str | None = setting(None, "A label stored with the sweep (not part of its identity).", PANEL_STORE)
    pair: str | None = setting(None, panel=PANEL_MODELS)  # help: specdec.options.SHARED_OPTIONS
    target: str | None = setting(None, panel=PANEL_MODELS)
    draft: str | None = setting(None, panel=PANEL_MODELS)
    prompt_types: tuple[str, ...] | str = setting("all", "'all' or comma-separated prompt types (of the built-in "
                                                  "set or the prompt file).")
    prompts: str | None = setting(None, "Prompt file (JSONL, Spec-Bench, plain text) instead of the built-in "
                                  "set.", type=Path)
    prompts_per_type: int = setting(5, "Built-in prompts per type; the first (<type>-01) is the primary. Every "
                                    "prompt is priced from its trace and calibration block (one target-only "
                                    "run); the primaries also carry the timed cells.")
    ks: tuple[int, ...] = setting((), "Fixed-K grid timed on primary prompts (the first of each type), e.g. "
                                  "the original study's 1,2,4,8,16 ('' for none: the traces predict every K).")
    secondary_ks: tuple[int, ...] = setting((), "Fixed-K grid on non-primary prompts ('' for none).")
    type_ks: tuple[str, ...] = setting((), "Extra fixed K timed on every prompt of a type, per drafter: "
                                       "method:type=K,... (e.g. draft:code=3,ngram:repetitive=16; the report "
                                       "prints the traces' best K per type in this form); a K already in the "
                                       "prompt's grid is not timed twice.")
    max_new_tokens: int = setting(128, "New tokens per generation.")
    repeats: int = setting(1, "Timed runs per cell (repeat r samples with seed + r).")
    batch_sizes: tuple[int, ...] = setting((1,), "Batch sizes B (1..16): 1 is the single-sequence sweep; each B > "
                                           "1 adds batches of B prompts of one group (code, prose, repetitive), "
                                           "decoded together and timed between batched target-only runs at that "
                                           "B.")
    baseline_repeats: int = setting(2, "Target-only runs per prompt when not bracketed (--pairing none): one "
                                    "before and the rest after its other runs (at least --repeats).")
    pairing: str = setting("bracket", "bracket: a target-only run between every two other runs, each speedup "
                           "paired with its two neighbours; none: baseline first and last only.")
    traces: bool = setting(True, "Record each prompt's acceptance trace after its first target-only run "
                           "(greedy): every K and policy replayed from one run.")
    calibration_repeats: int = setting(2, "Passes of the calibration block (target forwards of 1..17 tokens at "
                                       "each prompt's context, after its first baseline); 0 = off.")
    methods: tuple[str, ...] = setting(OUR_METHODS, "Our methods (baseline, aa and the drafters) and/or peer names "
                                       "(default: ours; under sampling those a sampled trace replays).")
    policies: tuple[str, ...] = setting(DEFAULT_POLICIES, "Policies timed on primaries, for every drafting "
                                        "method or one (METHOD:POLICY): best (the fixed K the prompt's trace "
                                        "predicts fastest), heuristic, confidence, cost, or 'none'; K <= "
                                        "--policy-k.")
    secondary_policies: tuple[str, ...] = setting((), "Policies also timed on the non-primary prompts ('none' "
                                                  "for none), e.g. best,cost to time the main job's cells on "
                                                  "every prompt of --prompts-per-type.")
    checks_per_prompt: int = setting(2, "The A/A run and the --policies cells dealt out over the primaries in "
                                     "turn, this many per primary (a timed sample that checks the traces' "
                                     "predictions); 0 = every one on every primary. K grids and peers run in "
                                     "full.")
    policy_k: int | None = setting(None, "Policies' starting (heuristic) or largest (best, confidence, cost) K; "
                                   "default: each policy's own, as generate gives it (heuristic 4, best and "
                                   "confidence 16, cost 64).")
    peers: bool = setting(False, "Also time the library peers that apply to each configuration (transformers "
                          "generate/assisted/prompt lookup).")
    peer_ks: tuple[int, ...] = setting((4,), "K of the speculative peers.")
    secondary_peers: bool = setting(False, "Also time the peers on the non-primary prompts (every prompt of "
                                    "--prompts-per-type), for per-type intervals of a peer.")
    configs: tuple[str, ...] = setting((AUTO_CONFIG,), "Runtime configurations: auto (transformers-bf16 where "
                                       "the CPU has native bf16 kernels, else transformers-eager, fp32), "
                                       "transformers-eager, transformers-compiled, llamacpp, mixed, ... (or one "
                                       "by --backend and --draft-backend).", PANEL_RUNTIME)
    temperature: float = setting(0.0, "0 = greedy.", PANEL_SAMPLING)
    temperatures: tuple[float, ...] = setting((), "A temperature axis, e.g. 0,0.7,1.0: one sweep per temperature "
                                              "into the one store, in order (top-k/top-p where T > 0).", PANEL_SAMPLING)
    top_k: int = setting(0, "0 = off.", PANEL_SAMPLING)
    top_p: float = setting(1.0, "1 = off.", PANEL_SAMPLING)
    seed: int = setting(0, "Base seed; repeat r uses seed + r.", PANEL_SAMPLING)
    device: str = setting("cpu", panel=PANEL_RUNTIME)
    dtype: str = setting("float32", panel=PANEL_RUNTIME)
    threads: int | None = setting(None, panel=PANEL_RUNTIME)  # None: the library's default
    chat_template: bool = setting(False, "Wrap each prompt in the tokenizer's chat template (user turn + "
                                  "generation prompt).", PANEL_RUNTIME)
    backend: str | None = setting(None, panel=PANEL_RUNTIME)
    draft_backend: str | None = setting(None, panel=PANEL_RUNTIME)
    warmup_tokens: int = setting(16, "New tokens of each warm-up generation.", cli=False)
    cost_repeats: int = setting(3, "Timed passes of the configuration's cost curve (`measure_costs`).", cli=False)
    cost_context_tokens: int = setting(64, "Tokens in the warm cache the cost curve is timed on.", cli=False)
    ngram_max: int = setting(3, "Largest n-gram our prompt-lookup drafter matches.", cli=False)
    ngram_min: int = setting(1, "Smallest n-gram our prompt-lookup drafter matches.", cli=False)
    xtok_draft: str | None = setting(None, "Draft model with ANOTHER tokenizer for method xtok (smollm2, a .gguf or "
                                     "a checkpoint directory), loaded beside the pair on the draft's backend; "
                                     "it drafts text the target's tokenizer re-tokenizes (exact).", PANEL_MODELS)
    xtok_ks: tuple[int, ...] = setting((4,), "Fixed K of method xtok on every prompt: no acceptance trace of a "
                                       "cross-tokenizer draft is recorded, so policy best cannot choose its K.")
    skip_long_prompts: bool = setting(False, "Leave out prompts whose tokens + max new tokens exceed a model's "
                                      "context (named in one line); otherwise such a plan is refused before "
                                      "any run.", flags=("--skip-long-prompts",))

    @property
    def sampling(self) -> SamplingParams:
        """The `SamplingParams` of every generation (raises ValueError when invalid)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def runtime_configs(self) -> list[RuntimeConfig]:
        return [RUNTIME_CONFIGS[c] for c in self.configs]


#: What ``--quick`` changes: primaries only, the draft model and prompt lookup at K = 4, 32 new tokens, no
#: peers, no policies, 8-token warm-ups, one timed pass of the cost curve.
QUICK: dict[str, Any] = {
    "prompts_per_type": 1,
    "methods": ("baseline", "aa", "draft", "ngram"),
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
#: Settings a TOML file may hold besides the `SweepConfig` fields.
FILE_SETTINGS = (Setting("db", DEFAULT_DB, "SQLite results file.", PANEL_STORE, type=Path, in_file=True),)
FILE_ONLY_KEYS = tuple(s.name for s in FILE_SETTINGS)


def default_config(device: str = "cpu") -> str:
    """The runtime configuration ``auto`` stands for: ``transformers-bf16`` on a CPU with native bf16 kernels
    (`specdec.runtimes.precision.default_dtype`), else ``transformers-eager`` (fp32); both are exact by design against
    their own target-only decoding (bf16 up to near-ties, which every run records)."""
    from specdec.runtimes.precision import default_dtype

    return "transformers-bf16" if default_dtype(device) == "bfloat16" else "transformers-eager"


def _normalize_names(v: dict[str, Any]) -> None:
    """Validate the name lists in place: methods (`METHODS`), policies, configs (aliases resolved)."""
    methods = [m.lower() for m in as_list(v["methods"], "methods")]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    if not methods:
        raise ValueError("methods: give at least one method")
    v["methods"] = tuple(dict.fromkeys(methods))
    for field in ("policies", "secondary_policies"):
        policies = [p.lower() for p in as_list(v[field], field)]
        if policies in (["none"], ["off"]):
            policies = []
        bad = [p for p in policies if policy_name(p) not in POLICIES]
        if bad:
            hint = " (fixed K is the --ks grid)" if "fixed" in bad else ""
            raise ValueError(f"unknown policy {', '.join(bad)}; choose from {', '.join(POLICIES)}, each optionally "
                             f"for one drafting method (draft:cost){hint}")
        for p in policies:
            m = p.split(":", 1)[0] if ":" in p else None
            if m is not None and (m not in METHODS or not METHODS[m].takes_k):
                raise ValueError(f"policy {p!r} names {m!r}, which is not a drafting method")
        v[field] = tuple(dict.fromkeys(policies))
    configs = []
    for c in as_list(v["configs"], "configs"):
        label = default_config(v.get("device", "cpu")) if c.lower() == AUTO_CONFIG else CONFIG_ALIASES.get(c.lower(), c)
        if label not in RUNTIME_CONFIGS:
            raise ValueError(
                f"unknown config {c!r}; choose from {', '.join(RUNTIME_CONFIGS)} (or mixed = mixed:llamacpp-draft)"
            )
        configs.append(label)
    if not configs:
        raise ValueError("configs: give at least one runtime configuration")
    v["configs"] = tuple(dict.fromkeys(configs))


def _check_xtok(v: dict[str, Any]) -> None:
    """A cross-tokenizer method needs ``xtok_draft``; the sweep's own pair must share the target's tokenizer
    (its draft method, traces and calibration feed the draft target ids).

    Raises:
        ValueError: one line saying what to give instead.
    """
    from specdec.models.presets import other_tokenizer_pair, resolve_pair

    xtok = v.get("xtok_draft")
    v["xtok_draft"] = (str(xtok).strip() or None) if xtok is not None else None
    cross = [m for m in v["methods"] if METHODS[m].cross_tokenizer]
    if cross and v["xtok_draft"] is None:
        raise ValueError(f"method {cross[0]} needs --xtok-draft: a draft model with another tokenizer (smollm2, a "
                         f".gguf file or a checkpoint directory)")
    try:
        target, draft = resolve_pair(v.get("pair"), v.get("target"), v.get("draft"))
    except ValueError:
        return  # `prepare` reports it
    if other_tokenizer_pair(target, draft):
        raise ValueError(f"draft {draft} has another tokenizer than the target; a sweep's pair shares the target's "
                         f"(its draft method and traces feed the draft target ids): give --target {target} "
                         f"--xtok-draft {draft} --methods ...,xtok")


def _normalize(values: dict[str, Any]) -> dict[str, Any]:
    """Coerce and validate raw values (from defaults, QUICK, a TOML file and flags)."""
    v = dict(values)
    v["ks"] = int_list(v["ks"], "ks", allow_empty=True)
    v["secondary_ks"] = int_list(v["secondary_ks"], "secondary_ks", allow_empty=True)
    v["peer_ks"] = int_list(v["peer_ks"], "peer_ks", allow_empty=True)
    v["xtok_ks"] = int_list(v["xtok_ks"], "xtok_ks", allow_empty=False)
    _normalize_names(v)
    _check_xtok(v)
    v["batch_sizes"] = parse_batch_sizes(v["batch_sizes"])
    if max(v["batch_sizes"]) > 1:
        for label in v["configs"]:
            rc = RUNTIME_CONFIGS[label]
            if rc.compile or rc.pad_verify:
                why = "is compiled (static cache)" if rc.compile else "pads verification"
                raise ValueError(f"batch_sizes: {label} {why}, and batched decoding runs the eager backend unpadded; "
                                 "give B = 1 alone for it, or an uncompiled, unpadded configuration")
    v["type_ks"] = parse_type_ks(v["type_ks"], v["methods"])
    pt = v["prompt_types"]
    if isinstance(pt, (list, tuple)):
        pt = ",".join(str(x) for x in pt)
    v["prompt_types"] = str(pt).strip() or "all"
    if v["prompts"] is not None:  # a path from the command line, a string from a file
        v["prompts"] = str(v["prompts"])
    for name in ("prompts_per_type", "max_new_tokens", "repeats", "baseline_repeats", "warmup_tokens",
                 "cost_repeats", "cost_context_tokens", "ngram_max", "ngram_min", "top_k", "seed",
                 "calibration_repeats", "checks_per_prompt"):
        try:
            v[name] = int(v[name])
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an integer, got {v[name]!r}") from None
    for name, low in (("prompts_per_type", 1), ("max_new_tokens", 1), ("repeats", 1), ("baseline_repeats", 1),
                      ("warmup_tokens", 1), ("cost_repeats", 1), ("cost_context_tokens", 1),
                      ("ngram_min", 1), ("top_k", 0), ("calibration_repeats", 0),
                      ("checks_per_prompt", 0)):
        if v[name] < low:
            raise ValueError(f"{name} must be >= {low}, got {v[name]}")
    if v["ngram_max"] < v["ngram_min"]:
        raise ValueError(f"ngram_max ({v['ngram_max']}) must be >= ngram_min ({v['ngram_min']})")
    if v["policy_k"] is not None:
        v["policy_k"] = int(v["policy_k"])
        if v["policy_k"] < 1:
            raise ValueError(f"policy_k must be >= 1, got {v['policy_k']}")
    if v["threads"] is not None:
        v["threads"] = int(v["threads"])
        if v["threads"] < 1:
            raise ValueError(f"threads must be >= 1, got {v['threads']}")
    from specdec.runtimes.precision import resolve_dtype

    v["dtype"] = resolve_dtype(v["dtype"], v["device"])  # auto: bf16 where the CPU has native kernels
    v["temperature"] = float(v["temperature"])
    v["top_p"] = float(v["top_p"])
    v["temperatures"] = float_list(v["temperatures"], "temperatures")
    if v["temperatures"] and v["temperature"] != 0.0:
        raise ValueError("give --temperature or --temperatures, not both")
    for t in v["temperatures"]:  # validates each; top-k/top-p apply to the sampled ones
        SamplingParams(t, v["top_k"] if t > 0 else 0, v["top_p"] if t > 0 else 1.0)
    if not v["temperatures"]:
        SamplingParams(v["temperature"], v["top_k"], v["top_p"])  # validates
    v["pairing"] = str(v["pairing"]).strip().lower()
    if v["pairing"] not in PAIRINGS:
        raise ValueError(f"pairing must be one of {', '.join(PAIRINGS)}, got {v['pairing']!r}")
    v["traces"] = bool(v["traces"])
    if BEST_K in {policy_name(p) for p in (*v["policies"], *v["secondary_policies"])}:
        why = ("--no-traces" if not v["traces"] else "--calibration-repeats 0" if v["calibration_repeats"] == 0
               else None)
        if v["temperature"] > 0 and v["methods"] == OUR_METHODS:  # the default: what a sampled trace replays
            v["methods"] = tuple(m for m in OUR_METHODS if not _no_sampled_replay([m]))
        missing = _no_sampled_replay(v["methods"]) if v["temperature"] > 0 else None
        if missing and not why:
            raise ValueError(f"policy {BEST_K!r} under sampling chooses K from each prompt's sampled trace, which "
                             f"replays {missing[1]} only: give --methods without {missing[0]}, drop it "
                             "(--policies cost) or give --ks")
        if why:
            raise ValueError(f"policy {BEST_K!r} chooses K from each prompt's acceptance trace and calibration "
                             f"block, which {why} leaves out; drop it (--policies cost) or give --ks")
    v["peers"] = bool(v["peers"])
    v["secondary_peers"] = bool(v["secondary_peers"])
    v["chat_template"] = bool(v["chat_template"])
    return v


def axis_configs(cfg: SweepConfig) -> list[SweepConfig]:
    """The sweeps of `cfg`'s temperature axis, in order: `cfg` when it has none, else one `SweepConfig` per
    temperature (top-k/top-p off at T = 0), each validated as if given alone, so that a setting one temperature
    refuses fails before any sweep runs (ValueError naming the temperature)."""
    if not cfg.temperatures:
        return [cfg]
    base = {f.name: getattr(cfg, f.name) for f in fields(SweepConfig)}  # validated at T = 0 (make_config)
    out = []
    for t in cfg.temperatures:
        one = {**base, "temperatures": (), "temperature": t}
        if t == 0.0:
            one.update(top_k=0, top_p=1.0)
        try:
            out.append(SweepConfig(**_normalize(one)))
        except ValueError as exc:
            raise ValueError(f"temperature {t:g}: {exc}") from None
    return out


def _no_sampled_replay(methods) -> tuple[str, str] | None:
    """Under sampling: the planned drafters a sampled trace does not replay (`DrafterEntry.sampled_replay`) and
    those it does, as words for `validate`'s refusal, or None when it replays every one."""
    from specdec.catalogue.drafters import DRAFTERS

    missing = [m for m in methods if m in DRAFTERS and DRAFTERS[m].sampled_replay is None
               and DRAFTERS[m].replay_as is None]
    if not missing:
        return None
    return ", ".join(missing), ", ".join(n for n, e in DRAFTERS.items() if e.sampled_replay)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a sweep TOML file: top-level keys (or a ``[sweep]`` table) named as `SweepConfig` fields or the
    CLI flags (dashes allowed), plus ``db``.

    Raises:
        ValueError: missing/unreadable file, not UTF-8 (a byte-order mark is fine), invalid TOML, or unknown keys
            (the message lists the valid ones); one line naming the file.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8-sig"))  # a byte-order mark (Windows editors) is dropped
    except FileNotFoundError:
        raise ValueError(f"{p}: no such config file") from None
    except OSError as exc:
        raise ValueError(f"{p}: cannot read config file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not a TOML file: not UTF-8 text (bad byte at offset {exc.start})") from None
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
        label = config_for_backends(tb, values.get("draft_backend") or tb)
        if "configs" in explicit and as_list(values["configs"], "configs") != [label]:
            raise ValueError("give either --configs or --backend/--draft-backend, not both")
        values["configs"] = (label,)
    return SweepConfig(**_normalize(values))

