"""specdec: speculative decoding implemented exactly, measured honestly against target-only decoding."""

__version__ = "0.1.0"

import logging as _logging

# torchao (installed for --quant int8) is imported by transformers whenever it is present; on a machine without
# CUDA it logs a warning for each CUDA-only kernel library it cannot load, and torch logs deprecation notices
# for torchao's enums. Neither concerns the paths specdec runs; they would break one-line error output.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
