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

This module is the sweep's public face (``specdec sweep``, the benchmarks and the tests import from it); the
work is done by one module per job:

- `specdec.bench.config`: `SweepConfig`, ``--quick``, TOML files, `make_config`; `specdec.bench.settings`:
  one declaration per setting, from which ``specdec sweep``'s options are built; `specdec.catalogue.runtimes`:
  the runtime configurations;
- `specdec.bench.plan`: prompts, `PlannedRun`, `build_plan`, the sweep's identity (`meaning`), `prepare`;
  `specdec.bench.grid`: what each prompt and batch is timed at (K grids, policies, the batch axis);
- `specdec.bench.methods`: the `Method` registry (ours and the peers) and `RunRecord`;
  `specdec.bench.peers`: the transformers peers;
- `specdec.bench.runner`: `run_sweep` (plan -> run -> record); `specdec.bench.loaded`: one configuration
  loaded (fit check, costs); `specdec.bench.probes`: roofline, equality check, acceptance trace and
  calibration beside the timed runs; `specdec.bench.batch_runs`: the batched runs (``--batch-sizes``: their
  pricing, backends, rows and exactness); `specdec.bench.state`: the state a sweep carries;
  `specdec.bench.control`: the store's lock, SIGTERM, shards;
- `specdec.bench.estimate`: rough durations (``--dry-run``);
- `specdec.measure.environment`: the machine fingerprint; `specdec.measure.timing`: cost measurement;
  `specdec.bench.store`: the SQLite store.
"""


from __future__ import annotations

from specdec.bench.config import (
    ADAPTIVE_POLICIES,
    DEFAULT_DB,
    OUR_METHODS,
    PEER_METHODS,
    QUICK,
    RUNTIME_CONFIGS,
    RuntimeConfig,
    SweepConfig,
    axis_configs,
    load_config_file,
    make_config,
)
from specdec.bench.estimate import (
    REFERENCE_COSTS,
    REFERENCE_COSTS_BF16,
    REFERENCE_COSTS_LLAMACPP,
    cost_measurement_s,
    estimate_generation_s,
    estimate_plan_s,
    format_duration,
    instrumentation_s,
    reference_costs,
)
from specdec.bench.methods import LLAMA_PROMPT_LOOKUP_SKIP, METHODS, Method
from specdec.bench.peers import hf_peer_generate
from specdec.bench.plan import (
    PlannedRun,
    Prepared,
    build_plan,
    cost_max_n,
    meaning,
    plan_summary,
    prepare,
    primary_ids,
    select_prompts,
)
from specdec.bench.requests import RunRecord
from specdec.bench.runner import LoadedConfig, SweepResult, execute, interrupt_exit_status, run_sweep
from specdec.core.sampling import SamplingParams
from specdec.measure.environment import git_commit, machine_info
from specdec.prompts import encode_prompt

__all__ = [
    "ADAPTIVE_POLICIES",
    "DEFAULT_DB",
    "LLAMA_PROMPT_LOOKUP_SKIP",
    "METHODS",
    "OUR_METHODS",
    "PEER_METHODS",
    "QUICK",
    "REFERENCE_COSTS",
    "REFERENCE_COSTS_BF16",
    "REFERENCE_COSTS_LLAMACPP",
    "RUNTIME_CONFIGS",
    "LoadedConfig",
    "Method",
    "PlannedRun",
    "Prepared",
    "RunRecord",
    "RuntimeConfig",
    "SamplingParams",
    "SweepConfig",
    "SweepResult",
    "axis_configs",
    "build_plan",
    "cost_max_n",
    "cost_measurement_s",
    "encode_prompt",
    "estimate_generation_s",
    "estimate_plan_s",
    "execute",
    "format_duration",
    "git_commit",
    "hf_peer_generate",
    "instrumentation_s",
    "interrupt_exit_status",
    "load_config_file",
    "machine_info",
    "make_config",
    "meaning",
    "plan_summary",
    "prepare",
    "primary_ids",
    "reference_costs",
    "run_sweep",
    "select_prompts",
]
