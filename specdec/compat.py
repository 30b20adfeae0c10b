"""Draft/target compatibility: the same token id must mean the same string for both models.

Speculative decoding compares token *ids* between draft and target, so the two vocabularies must be the
same map from ids to strings, with the same special tokens. Embedding matrices may be padded past the
tokenizer's vocabulary (e.g. 151936 rows for 151665 Qwen2.5 tokens); those rows are never real tokens and
the engine slices logits to the shared vocabulary, masking them out.
"""

from __future__ import annotations

import re


class IncompatibleTokenizersError(ValueError):
    """Draft and target tokenizers do not map ids to the same strings (one-line message)."""


_SPECIAL = ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id")
_PLACEHOLDER = re.compile(r"^\[PAD\d+\]$")


def real_vocab_size(tokenizer) -> int:
    """Vocabulary size without trailing padding placeholders.

    Tokenizers rebuilt from GGUF files list every embedding row, naming the padding rows ``[PAD151665]``
    etc.; those are not tokens and are masked out like any padding row.
    """
    n = len(tokenizer)
    inv = {i: t for t, i in tokenizer.get_vocab().items()}
    while n > 0 and _PLACEHOLDER.match(inv.get(n - 1, "")):
        n -= 1
    return n


def check_tokenizers(target_tok, draft_tok) -> int:
    """Check that two Hugging Face tokenizers are interchangeable for speculative decoding.

    Compares the full id -> token map (`get_vocab`, added tokens included) and the special token ids.

    Args:
        target_tok, draft_tok: `PreTrainedTokenizerBase` instances.

    Returns:
        The shared vocabulary size (`real_vocab_size`): logits columns at or past it are masked out.

    Raises:
        IncompatibleTokenizersError: sizes, any id -> token entry, or a special token id differ.
    """
    if target_tok is draft_tok:
        return real_vocab_size(target_tok)
    n_t, n_d = len(target_tok), len(draft_tok)
    if n_t != n_d:
        raise IncompatibleTokenizersError(
            f"incompatible tokenizers: target has {n_t} tokens, draft has {n_d}; draft and target must share a vocabulary"
        )
    vt, vd = target_tok.get_vocab(), draft_tok.get_vocab()
    if vt != vd:
        diff = sorted(set(vt.items()) ^ set(vd.items()), key=lambda kv: kv[1])[:3]
        raise IncompatibleTokenizersError(
            f"incompatible tokenizers: {len(set(vt.items()) ^ set(vd.items()))} id->token entries differ "
            f"(first: {diff}); draft and target must share a vocabulary"
        )
    for name in _SPECIAL:
        a, b = getattr(target_tok, name, None), getattr(draft_tok, name, None)
        if a != b:
            raise IncompatibleTokenizersError(f"incompatible tokenizers: {name} is {a} for the target, {b} for the draft")
    return real_vocab_size(target_tok)


def check_vocab_fits(vocab_size: int, **backends) -> None:
    """Every model must produce logits for the whole shared vocabulary.

    Raises:
        IncompatibleTokenizersError: a backend's logits are narrower than `vocab_size`.
    """
    for role, backend in backends.items():
        if backend.vocab_size < vocab_size:
            raise IncompatibleTokenizersError(
                f"the {role} model scores {backend.vocab_size} tokens but the tokenizer has {vocab_size}"
            )


def eos_ids_for(tokenizer, generation_config=None) -> frozenset[int]:
    """The ids that end generation: the tokenizer's EOS plus the model's generation-config EOS ids
    (instruct models list several, e.g. Qwen2.5's ``<|im_end|>`` and ``<|endoftext|>``), as `generate()` does."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gc_eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if isinstance(gc_eos, int):
        ids.add(gc_eos)
    elif gc_eos:
        ids.update(int(x) for x in gc_eos)
    return frozenset(ids)
