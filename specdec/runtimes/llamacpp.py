"""The llama.cpp backend: a GGUF model and its KV cache, through llama-cpp-python's low-level batch API.

Evaluation follows llama.cpp's ``examples/speculative-simple``: one ``llama_decode`` per target forward over
a batch whose every token has its logits flag set (``common_batch_add(batch, id, n_past++, {0}, true)``),
and one ``llama_memory_seq_rm(mem, 0, n_past, -1)`` to drop the rejected suffix (the
``llama_kv_self_seq_rm`` of older releases). Logits come back as a float32 ``[n, n_vocab]`` CPU tensor,
copied out of llama.cpp's output buffer (which the next decode overwrites) in one ``memmove``.

Loading goes through llama-cpp-python's ``_internals.LlamaModel`` / ``LlamaContext`` (the objects the
``Llama`` class wraps) rather than ``Llama`` itself, because two parameters that exactness and safety need
are not reachable through ``Llama.__init__`` in 0.3.36:

* ``llama_model_params.use_extra_bufts`` (weight repacking into ggml's extra CPU buffer types): on by
  default (`repack_default`) except on a CPU that reports AMX. Repacking lets Q4_0/Q4_K/IQ4_NL weights run
  through GEMM kernels that process several rows per weight read, which makes the single step faster and a
  verification forward cheaper per token. On a CPU with AMX, in a llama.cpp built with AMX kernels, the same
  switch puts the quantized weights (Q4_0, Q4_1, Q8_0, ...) in ggml's AMX buffer type, and then every
  ``llama_decode`` of 2 or more tokens dies (SIGSEGV) in ``ggml_backend_amx_mul_mat``: its one-time tile setup
  (``ggml_tile_config_init``) hands ``ldtilecfg`` a 64-byte tile configuration on the stack of which the
  compiled code (llama-cpp-python 0.3.36 built by GCC 12.2) stores only the first 32 bytes: the stores of the
  tile shapes were optimised away and the rows are stack garbage, so the instruction faults (#GP; upstream
  llama.cpp PR #26954 moves that configuration off the stack for this reason).
  Single-token decodes take an AVX512-VNNI path without tiles and work. A signal cannot be caught, so the
  backend never lets that buffer type run: where ggml offers it (`amx_buffer_type_active`), repacking stays
  off even when asked for (`extra_buffers` then records False and `extra_buffers_note` says why).
* ``llama_context_params.n_outputs_max_per_seq`` ("max outputs per sequence", default 1 in this llama.cpp):
  set to 0 (= n_outputs_max = n_batch) so that a batch may return logits for every position. (With 1, all
  positions still came back in 0.3.36; the explicit 0 guards against the cap being enforced later.)

Thread counts: llama.cpp uses ``n_threads`` for single-token batches and ``n_threads_batch`` otherwise, so
the baseline's 1-token forward and the verification forward would run on different thread counts unless the
two are equal; this backend always sets both to the same ``n_threads``.

Cost of a verification forward: without extra buffers, ggml's CPU matmul for quantized weights (Q4_1, Q4_K)
runs one vec_dot per (row, token), so a forward over n tokens costs nearly n single-token forwards
(SmolLM2-135M Q4_1, 2 shared cores: t(17)/t(1) ~ 7-13). Speculation pays off on CPU only when the draft is
much cheaper than the target and acceptance is high. Repacked GEMM kernels (the default where safe) make
the single step cheaper and flatten the curve for the tensor types that have a repack (Q6_K has none on x86).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Self

import numpy as np
import torch

from specdec.runtimes.base import BackendError, ContextOverflowError

# OpenMP's wait policy: llama.cpp's CPU backend (an OpenMP build) shares torch's libgomp, loaded and configured
# once at `import torch`, so only an OMP_WAIT_POLICY in the environment before the process starts applies;
# setting it here would be too late. Unset, libgomp spins briefly at each barrier and then sleeps. ggml waits
# at an OpenMP barrier after every op, so PASSIVE (sleep at once) costs a futex wake-up per op: ~24 ms more per
# forward of the default target on the 2-vCPU Intel Xeon VM (87 -> 111 ms; `specdec costs`), whatever n.

DEFAULT_MAX_CTX = 4096
DEFAULT_N_BATCH = 512


class GGUFNotFoundError(ValueError):
    """The GGUF file asked for does not exist (one-line message naming the path)."""


def require_file(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.is_file():
        raise GGUFNotFoundError(f"GGUF model file not found: {p} (give the path of a .gguf file)")
    return p


def llama_cpp_lib():
    try:
        import llama_cpp  # noqa: F401
        from llama_cpp import _internals
        from llama_cpp import llama_cpp as lib
    except ImportError as exc:  # pragma: no cover - exercised only without llama-cpp-python
        raise BackendError("the llama.cpp backend needs llama-cpp-python: pip install llama-cpp-python") from exc
    return lib, _internals


_BACKEND_READY = False


def init_backend(lib, verbose: bool) -> None:
    global _BACKEND_READY
    from llama_cpp._logger import set_verbose

    set_verbose(verbose)  # llama-cpp-python's log callback: ERROR and above only when quiet
    if not _BACKEND_READY:
        lib.llama_backend_init()
        _BACKEND_READY = True


#: CPU flags (/proc/cpuinfo names) of the AMX units whose ggml buffer type crashes on some VMs.
AMX_FLAGS = frozenset({"amx_int8", "amx_bf16", "amx_tile"})


def repack_default(flags=None) -> tuple[bool, str]:
    """Whether llama.cpp may repack weights on this CPU (``use_extra_bufts``), and why, in one line.

    Args:
        flags: CPU flag names (default: this machine's, `specdec.runtimes.precision.cpu_flags`).

    Returns:
        ``(True, "...")`` unless the CPU reports an AMX unit (`AMX_FLAGS`), where the AMX buffer type that the
        same switch enables has crashed the process; then ``(False, "...")``.
    """
    if flags is None:
        from specdec.runtimes.precision import cpu_flags

        flags = cpu_flags()
    amx = sorted(AMX_FLAGS & set(flags))
    if amx:
        return False, f"weight repacking off: this CPU reports {', '.join(amx)} and ggml's AMX path can crash"
    return True, "weight repacking on (no AMX on this CPU)"


AMX_BUFFER_NOTE = ("weight repacking off although asked for: ggml offers its AMX buffer type here, and its "
                   "batched matmul crashes the process (invalid AMX tile configuration)")


@functools.lru_cache(maxsize=1)
def ggml_extra_buffer_types() -> tuple[str, ...] | None:
    """Names of the extra CPU buffer types this process's ggml offers, in the order ``use_extra_bufts`` tries
    them for each weight (e.g. ``("AMX", "CPU_REPACK")``), or None when ggml cannot be asked.

    Asks ggml itself (``ggml_backend_dev_get_extra_bufts`` of the CPU device, ``ggml_backend_buft_name``): the
    answer covers the build (AMX kernels compiled in or not) and the machine (AMX present and the kernel's
    ``ARCH_REQ_XCOMP_PERM`` granted). Its prototypes leave llama-cpp-python's own ``libggml`` handle alone.
    """
    try:
        llama_cpp_lib()
        from llama_cpp._ggml import libggml
    except (BackendError, ImportError, OSError):
        return None
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    try:
        dev_by_type = ctypes.CFUNCTYPE(vp, ctypes.c_int)(("ggml_backend_dev_by_type", libggml))
        dev_reg = ctypes.CFUNCTYPE(vp, vp)(("ggml_backend_dev_backend_reg", libggml))
        proc_address = ctypes.CFUNCTYPE(vp, vp, cp)(("ggml_backend_reg_get_proc_address", libggml))
        buft_name = ctypes.CFUNCTYPE(cp, vp)(("ggml_backend_buft_name", libggml))
    except AttributeError:  # pragma: no cover - a ggml without the backend registry API
        return None
    cpu = dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    reg = dev_reg(cpu) if cpu else None
    addr = proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
    if not addr:
        return None
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(vp), vp)(addr)(cpu)  # NULL-terminated array
    names: list[str] = []
    i = 0
    while bufts and bufts[i]:
        names.append((buft_name(bufts[i]) or b"?").decode())
        i += 1
    return tuple(names)


def amx_buffer_type_active(flags=None) -> bool:
    """Whether ``use_extra_bufts`` would place weights in ggml's AMX buffer type in this process (see the
    module docstring: its batched matmul crashes). Asks ggml (`ggml_extra_buffer_types`); where it cannot be
    asked, falls back to the CPU flags (`AMX_FLAGS` among `flags`, default: this machine's)."""
    types = ggml_extra_buffer_types()
    if types is not None:
        return "AMX" in types
    if flags is None:
        from specdec.runtimes.precision import cpu_flags

        flags = cpu_flags()
    return bool(AMX_FLAGS & set(flags))


def default_threads() -> int:
    """CPUs this process may run on (``sched_getaffinity``), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class LlamaCppBackend:
    """A GGUF causal LM on llama.cpp behind the `Backend` interface (CPU logits, float32).

    Args:
        model_path: a ``.gguf`` file.
        n_ctx: context window in tokens (default: ``min(trained context, 4096)``); `max_length` is this.
        n_threads: threads for every decode, single-token or batched (default: the CPUs this process may
            use). Both llama.cpp thread counts get this value (see the module docstring).
        n_batch: tokens per ``llama_decode`` call (logical = physical batch). Longer inputs (a long prompt's
            prefill) are fed in chunks of `n_batch`; logits, if asked for, are concatenated.
        extra_buffers: let llama.cpp repack weights into its extra CPU buffer types (AVX/AMX repack).
            None (default): `repack_default` - on unless the CPU reports AMX. True is not honoured where
            ggml offers its AMX buffer type (`amx_buffer_type_active`: that path crashes). `extra_buffers`
            then holds what ran and `extra_buffers_note` why.
        verbose: let llama.cpp print its load log.
        n_seq_max: sequences the context serves (``n_seq_max``; > 1 only for
            `specdec.runtimes.llamacpp_batched`, which addresses them by ``seq_id``; this class uses seq 0).

    Attributes:
        name: ``"llamacpp"``.
        vocab_size: ``n_vocab`` of the GGUF vocabulary (logits row width).
        max_length: ``n_ctx``.
        device: ``cpu`` (logits are always returned on the CPU).
        n_threads, n_batch: as constructed.
        extra_buffers: whether weight repacking ran (``use_extra_bufts``); extra_buffers_note: why, one line.

    Raises:
        GGUFNotFoundError: `model_path` does not exist.
        BackendError: llama.cpp cannot load the file or create a context, or the model is recurrent/hybrid
            (its state cannot be rolled back to an arbitrary length with one ``seq_rm``).
    """

    name = "llamacpp"
    device = torch.device("cpu")

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        extra_buffers: bool | None = None,
        verbose: bool = False,
        n_seq_max: int = 1,
    ) -> None:
        path = require_file(model_path)
        lib, internals = llama_cpp_lib()
        self._lib = lib
        init_backend(lib, verbose)
        self.model_path = str(path)

        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = 0
        if extra_buffers is None:
            extra_buffers, self.extra_buffers_note = repack_default()
        else:
            self.extra_buffers_note = f"weight repacking {'on' if extra_buffers else 'off'} (asked for)"
        if extra_buffers and amx_buffer_type_active():
            # ggml's AMX buffer type would take the weights, and its matmul over 2+ tokens kills the process
            # (an uncatchable SIGSEGV in ggml_backend_amx_mul_mat; module docstring): never turn it on.
            extra_buffers, self.extra_buffers_note = False, AMX_BUFFER_NOTE
        self.extra_buffers = bool(extra_buffers)
        mparams.use_extra_bufts = self.extra_buffers
        try:
            self._model = internals.LlamaModel(path_model=self.model_path, params=mparams, verbose=verbose)
        except ValueError as exc:
            raise BackendError(f"llama.cpp cannot load {path.name}: {exc}") from exc
        if lib.llama_model_is_recurrent(self._model.model) or lib.llama_model_is_hybrid(self._model.model):
            self._model.close()
            raise BackendError(
                f"{path.name} is a recurrent/hybrid model: its state cannot be rolled back by llama_memory_seq_rm"
            )
        self.n_ctx_train = int(self._model.n_ctx_train())
        if n_ctx is None:
            n_ctx = min(self.n_ctx_train, DEFAULT_MAX_CTX) if self.n_ctx_train > 0 else DEFAULT_MAX_CTX
        if n_ctx < 1 or n_batch < 1:
            raise ValueError(f"n_ctx and n_batch must be >= 1, got {n_ctx}, {n_batch}")
        self.n_threads = int(n_threads or default_threads())
        self.n_batch = int(min(n_batch, n_ctx))

        cparams = lib.llama_context_default_params()
        cparams.n_ctx = int(n_ctx)
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = int(n_seq_max)
        cparams.kv_unified = False  # with n_seq_max > 1: one KV stream of n_ctx / n_seq_max cells per sequence
        cparams.n_outputs_max = 0  # = n_batch
        cparams.n_outputs_max_per_seq = 0  # = n_outputs_max: logits for every position of a batch
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        cparams.swa_full = True  # sliding-window layers keep every position, so seq_rm can roll back
        cparams.embeddings = False
        try:
            self._ctx = internals.LlamaContext(model=self._model, params=cparams, verbose=verbose)
        except ValueError as exc:
            self._model.close()
            raise BackendError(f"llama.cpp cannot create a context of {n_ctx} tokens for {path.name}: {exc}") from exc
        if self._ctx.memory is None:
            self.close()
            raise BackendError(f"{path.name}: the llama.cpp context has no KV memory")

        self.vocab_size = int(self._model.n_vocab())
        self.max_length = int(min(n_ctx, lib.llama_n_ctx(self._ctx.ctx)))
        self._n_past = 0

        # One batch for the backend's lifetime; seq ids never change, tokens/positions/flags are written
        # through numpy views of the C arrays (no per-token ctypes calls).
        self._batch = internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1, verbose=verbose)
        b = self._batch.batch
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
            b.n_seq_id[i] = 1
        self._tok = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._flags = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        self._positions = np.arange(self.max_length, dtype=np.int32)
        self._decode = lib.llama_decode
        self._get_logits = lib.llama_get_logits
        self.reset()

    # -- Backend interface ---------------------------------------------------------------------------

    @property
    def cache_length(self) -> int:
        return self._n_past

    def forward(self, tokens: list[int], *, logits: bool = True, last: int | None = None) -> torch.Tensor | None:
        """See `Backend.forward`.

        Args:
            tokens: ``n`` token ids appended at positions ``cache_length .. cache_length + n - 1``.
            logits: True: every position's logits flag is set; False: none is (no LM head at all).
            last: set the logits flag of the last `last` positions only (llama.cpp then computes the
                output layer for those rows alone).

        Returns:
            float32 ``[n, vocab_size]`` (``[min(last, n), vocab_size]``) CPU tensor (a copy: llama.cpp
            reuses its buffer), or None.

        Raises:
            ContextOverflowError: ``cache_length + n > max_length`` (nothing is evaluated).
            BackendError: ``llama_decode`` failed; the cache is restored to the `cache_length` it had before
                the call (every chunk of a multi-chunk forward is removed, not only the failed one).
        """
        n = len(tokens)
        if last is not None and last < 1:
            raise ValueError(f"last must be >= 1 (rows to score), got {last}")
        if n == 0:
            return torch.empty(0, self.vocab_size) if logits else None
        if self._n_past + n > self.max_length:
            raise ContextOverflowError(
                f"{self._n_past} cached + {n} new tokens exceed the context of {self.max_length}"
            )
        first = n - min(n, last) if (logits and last is not None) else 0  # first token index with logits
        out = torch.empty(n - first, self.vocab_size, dtype=torch.float32) if logits else None
        batch = self._batch.batch
        row_bytes = 4 * self.vocab_size
        n_before = self._n_past
        for start in range(0, n, self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            m = len(chunk)
            p = self._n_past
            self._tok[:m] = chunk
            self._pos[:m] = self._positions[p:p + m]
            skip = min(m, max(0, first - start)) if logits else m  # leading tokens of this chunk unscored
            self._flags[:skip] = 0
            self._flags[skip:m] = 1
            batch.n_tokens = m
            rc = self._decode(self._ctx.ctx, batch)
            if rc != 0:
                self._restore(n_before)  # earlier chunks of this forward are in the cache too
                raise BackendError(f"llama_decode returned {rc} for {m} tokens at position {p}")
            self._n_past = p + m
            if out is not None and skip < m:
                ptr = self._get_logits(self._ctx.ctx)  # rows of the flagged tokens only, in order
                if not ptr:
                    self._restore(n_before)
                    raise BackendError("llama_get_logits returned NULL")
                ctypes.memmove(out.data_ptr() + (start + skip - first) * row_bytes, ptr, (m - skip) * row_bytes)
        return out

    def _restore(self, length: int) -> None:
        """Drop every position >= `length` (all chunks of a failed forward) and set the length back."""
        self._lib.llama_memory_seq_rm(self._ctx.memory, 0, int(length), -1)
        self._n_past = int(length)

    def truncate(self, length: int) -> None:
        """See `Backend.truncate`: one ``llama_memory_seq_rm(mem, 0, length, -1)`` call.

        Raises:
            ValueError: `length` is negative or above `cache_length`.
            BackendError: llama.cpp refused the partial removal.
        """
        if length < 0 or length > self._n_past:
            raise ValueError(f"cannot truncate a cache of {self._n_past} tokens to {length}")
        if length == self._n_past:
            return
        if not self._lib.llama_memory_seq_rm(self._ctx.memory, 0, int(length), -1):
            raise BackendError(f"llama.cpp cannot roll its cache back from {self._n_past} to {length} tokens")
        self._n_past = int(length)

    def reset(self) -> None:
        """Empty the cache (``llama_memory_clear``, data included)."""
        self._lib.llama_memory_clear(self._ctx.memory, True)
        self._n_past = 0

    def synchronize(self) -> None:
        """No-op in effect: on the CPU ``llama_decode`` returns when done (``llama_synchronize`` is called
        anyway, for builds that offload layers)."""
        self._lib.llama_synchronize(self._ctx.ctx)

    # -- extras ------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """llama.cpp's own tokenizer (``llama_tokenize``), for cross-checking a Hugging Face tokenizer."""
        return list(self._model.tokenize(text.encode("utf-8"), add_special, parse_special))

    def eog_ids(self) -> frozenset[int]:
        """Every token llama.cpp marks end-of-generation (``llama_vocab_is_eog`` over the vocabulary).

        llama.cpp's set is wider than the tokenizer's EOS: it adds the EOT/EOM and FIM pad/repo/separator
        tokens and every token whose text is a known end-of-turn marker (``<|im_end|>``,
        ``<|endoftext|>``, ``<|eot_id|>``, ...; ``src/llama-vocab.cpp``). SmolLM2-135M-Instruct: EOS 2
        (``<|im_end|>``), end-of-generation {0, 2, 4}.
        """
        return eog_ids_of(self._lib, self._model.model)

    def metadata(self) -> dict[str, str]:
        """The GGUF key/value metadata (strings), e.g. ``general.architecture``."""
        return self._model.metadata()

    def close(self) -> None:
        """Free the batch, context and model (the backend is unusable afterwards)."""
        for obj in (getattr(self, "_batch", None), getattr(self, "_ctx", None), getattr(self, "_model", None)):
            if obj is not None:
                obj.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LlamaCppBackend({Path(self.model_path).name!r}, n_ctx={self.max_length}, "
            f"n_threads={self.n_threads}, cache_length={self._n_past})"
        )


def eog_ids_of(lib, model) -> frozenset[int]:
    vocab = lib.llama_model_get_vocab(model)
    return frozenset(i for i in range(lib.llama_vocab_n_tokens(vocab)) if lib.llama_vocab_is_eog(vocab, i))


def load_llamacpp(
    path: str | os.PathLike, *, n_ctx: int | None = None, n_threads: int | None = None, **kwargs
) -> LlamaCppBackend:
    """Load a GGUF file as a `LlamaCppBackend` (quiet; see the class for `kwargs`).

    Raises:
        GGUFNotFoundError: (a ValueError) the file does not exist; one line naming it.
        BackendError: llama-cpp-python is missing or llama.cpp cannot load the file.
    """
    return LlamaCppBackend(require_file(path), n_ctx=n_ctx, n_threads=n_threads, **kwargs)
