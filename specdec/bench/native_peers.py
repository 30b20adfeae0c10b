"""llama.cpp's own speculative decoding (`specdec.bench.native`) as peer methods of the sweep.

Each native method (``native_target``, ``native_draft``, ``native_ngram_*``; registered in
`specdec.bench.methods`, compared with ours through `specdec.catalogue.peers.PEER_PAIRS`) runs the
configuration's own GGUF files with the threads, context size and weight repacking of its llama.cpp target
backend, greedy, on the prompt ids the sweep gives every method, so its output is compared token for token
with our target-only output and its tokens/s paired with the neighbouring target-only runs like any
method's.

One ``llama-server`` process serves one (configuration, method, K) (a `NativeConfig` holds all three) and is
reused across that configuration's runs (its warm-up first): `SERVERS` keeps the live ones, and the runner
closes them when it tears the configuration down (`close_servers`), so no run times a process start. A
stateful drafter gets a fresh process before each run (`NativeServer.fresh_process`), outside the timed
figure.

What a run records (`record`): the engine's own end-to-end time (``prompt_ms + predicted_ms``, prefill
included) as ``total_s``, so ``tokens_per_s`` is `NativeRun.tokens_per_s`, comparable to ours; the prefill
(first token included) as ``prefill_s`` and ``ttft_s``, the rest as ``decode_s``; drafted and accepted tokens
(``draft_n``, ``draft_n_accepted``) for a drafting method. Where the binaries (or a build's drafter) are
missing, or the sweep samples, the method is recorded as skipped with the one line of `skip_reason`. The
build that ran (`specdec.bench.native_bin.build_info`) is stored with the configuration's runtime record
(`runtime_record`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdec.bench.native import NativeConfig, NativeRun, NativeServer
from specdec.bench.native_bin import NativeUnavailableError, build_info, model_free_methods, require_binary
from specdec.bench.requests import RunRecord, RunRequest, Runtime
from specdec.catalogue.peers import NATIVE_PEERS

__all__ = [
    "GREEDY_ONLY", "MODEL_FREE", "SERVERS", "ServerPool", "close_servers", "native_config", "native_name",
    "record", "run_native", "runtime_record", "skip_reason",
]  # fmt: skip

#: llama.cpp's model-free drafters timed as peers (`specdec.bench.native.NATIVE_METHODS`).
MODEL_FREE = tuple(m for m in NATIVE_PEERS if m not in ("target", "draft-simple"))
#: Why a sampled sweep skips them: llama.cpp's samplers, seeds and EOS ban (``ignore_eos``) are not ours.
GREEDY_ONLY = "llama.cpp's native methods run greedy only (--temperature 0); sampled runs are not wired"
#: llama.cpp's ``stop_type`` -> our ``finish_reason``
_FINISH = {"limit": "length", "eos": "eos"}


def native_name(method: str) -> str:
    """The sweep's name (``runs.method``) of native method `method`: ``native_target``, ``native_draft``,
    ``native_ngram_simple`` ..."""
    return NATIVE_PEERS[method]


class ServerPool:
    """The live ``llama-server`` processes, one per `NativeConfig` (configuration, method and K), started on
    first use and kept until `close`."""

    def __init__(self) -> None:
        self._servers: dict[NativeConfig, NativeServer] = {}

    def get(self, config: NativeConfig) -> NativeServer:
        """The server of `config` (made on first use; it starts its process on its first `complete`)."""
        if config not in self._servers:
            self._servers[config] = NativeServer(config)
        return self._servers[config]

    def __len__(self) -> int:
        return len(self._servers)

    def close(self) -> None:
        """Stop every process and forget them (each server's `NativeServer.close`)."""
        servers, self._servers = self._servers, {}
        for server in servers.values():
            server.close()


#: The sweep's live servers (closed by the runner after each configuration).
SERVERS = ServerPool()


def close_servers() -> None:
    """Stop the sweep's live native servers (`SERVERS`)."""
    SERVERS.close()


def skip_reason(method: str) -> Callable[[Any], str | None]:
    """For `Method.skip`: a function of the sweep's settings giving the one-line reason native `method` cannot
    run (a sampled sweep, no ``llama-server``, or a build without that ``--spec-type``), or None when it
    can."""

    def reason(cfg: Any = None) -> str | None:
        if cfg is not None and not cfg.greedy:
            return f"skipped: {GREEDY_ONLY}"
        try:
            binary = require_binary("llama-server")
        except NativeUnavailableError as exc:
            return f"skipped: {exc}"
        if method in MODEL_FREE and method not in model_free_methods(binary):
            return f"skipped: this llama.cpp build ({binary}) has no --spec-type {method}"
        return None

    return reason


def runtime_record() -> dict[str, Any]:
    """For `Method.runtime_record`: ``{"native": build_info()}``, the llama.cpp build the native peers ran
    (stored with the configuration's runtime record)."""
    return {"native": build_info()}


def _gguf(model: Any, role: str) -> Path:
    path = getattr(getattr(model, "backend", None), "model_path", None)
    if path is None:
        raise ValueError(f"llama.cpp's native methods need the {role} on llama.cpp (a GGUF file)")
    return Path(path)


def native_config(rt: Runtime, method: str, k: int | None) -> NativeConfig:
    """The `NativeConfig` of native `method` on `rt`'s configuration: its target GGUF (and, for
    ``draft-simple``, its draft GGUF and K as ``--spec-draft-n-max``), with the target backend's threads,
    context size and weight repacking.

    Raises:
        ValueError: a model is not on llama.cpp, or ``draft-simple`` without a draft.
    """
    target = rt.pair.target.backend
    draft = None
    if method == "draft-simple":
        if rt.pair.draft is None:
            raise ValueError("native_draft needs the configuration's draft model")
        draft = _gguf(rt.pair.draft, "draft")
    return NativeConfig(
        _gguf(rt.pair.target, "target"), method, draft=draft, threads=int(target.n_threads),
        n_ctx=int(target.max_length), draft_max=int(k) if draft is not None and k is not None else None,
        repack=bool(getattr(target, "extra_buffers", True)),
    )  # fmt: skip


def record(run: NativeRun, drafting: bool) -> RunRecord:
    """The `RunRecord` of native `run` (module docstring); drafted/accepted counts only when `drafting`."""
    prefill = run.prompt_ms / 1000.0
    return RunRecord(
        run.token_ids, _FINISH.get(run.finish_reason, run.finish_reason), run.engine_s,
        num_drafted=run.draft_n if drafting else None, num_accepted=run.draft_accepted if drafting else None,
        prefill_s=prefill, ttft_s=prefill, decode_s=run.predicted_ms / 1000.0,
    )  # fmt: skip


def run_native(method: str) -> Callable[[Runtime, RunRequest], RunRecord]:
    """The sweep's run function of native `method`: greedy, on the configuration's server from `SERVERS`.

    Raises (from the run): ValueError: a sampled sweep (native runs are greedy only: llama.cpp's
    ``ignore_eos`` bans EOS instead of generating past it) or a model not on llama.cpp.
    NativeServerError / NativeUnavailableError: the server failed or is missing.
    """

    def run(rt: Runtime, req: RunRequest) -> RunRecord:
        if not rt.sampling.greedy or rt.ignore_eos:
            raise ValueError(GREEDY_ONLY)
        server = SERVERS.get(native_config(rt, method, req.k))
        return record(server.complete(req.prompt_ids, req.max_new_tokens), drafting=method != "target")

    return run
