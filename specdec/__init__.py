"""specdec: speculative decoding implemented exactly, measured honestly against target-only decoding.

The Python API (`specdec.entrypoints.api`)::

    from specdec import load_pair, generate

    pair = load_pair("qwen2.5-coder")
    out = generate(pair, "def fib(n):", max_new_tokens=64)
    print(out.text, out.acceptance_rate, out.block_efficiency, out.tokens_per_s)

``import specdec`` stays cheap: torch and transformers load on first use of these names.
"""

__version__ = "0.1.0"

__all__ = ["Generation", "Pair", "__version__", "generate", "load_pair"]

_API = frozenset({"Generation", "Pair", "generate", "load_pair"})


def __getattr__(name: str):
    """The API names, imported from `specdec.entrypoints.api` on first access (it imports torch)."""
    if name in _API:
        from specdec.entrypoints import api

        return getattr(api, name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _API)

import logging as _logging

# torchao (installed for --quant int8) is imported by transformers whenever it is present; on a machine without
# CUDA it logs a warning for each CUDA-only kernel library it cannot load, and torch logs deprecation notices
# for torchao's enums. Neither concerns the paths specdec runs; they would break one-line error output.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
