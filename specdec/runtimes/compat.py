"""Draft/target compatibility: the same token id must mean the same string for both models.

Speculative decoding compares token *ids* between draft and target, so the two vocabularies must be the
same map from ids to strings, with the same special tokens. Embedding matrices may be padded past the
tokenizer's vocabulary (e.g. 151936 rows for 151665 Qwen2.5 tokens); those rows are never real tokens and
the engine slices logits to the shared vocabulary, masking them out.

A draft of another family has another vocabulary; `token_keys` and `vocab_overlap` say what two
vocabularies share by what their tokens spell (bytes, or the names of added tokens), for the drafters of
`specdec.drafters.xtok`, which translate between the two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-character table, which byte-level BPE vocabularies spell their tokens in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _is_byte_level(tokenizer, pieces: list[str]) -> bool:
    """Whether the vocabulary spells tokens in GPT-2's byte alphabet (``Ġ`` for a space) rather than
    SentencePiece's (``▁`` for a space, ``<0x0A>`` byte tokens): the decoder's type when the fast tokenizer
    exposes it, else whichever space marker is more frequent."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        import json

        decoder = json.loads(backend.to_str()).get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
        if "ByteLevel" in kinds:
            return True
        if kinds & {"Metaspace", "Replace", "ByteFallback"}:
            return False
    return sum("Ġ" in p for p in pieces) >= sum("▁" in p for p in pieces)


def token_keys(tokenizer) -> list[bytes | str | None]:
    """What each id of a tokenizer stands for, comparable across tokenizers of different families.

    Returns one entry per id below `real_vocab_size`: the token's bytes (``b" the"``) for ordinary tokens,
    whether the vocabulary spells them byte-level (GPT-2, Qwen: ``Ġthe``) or SentencePiece-style (Llama:
    ``▁the``, ``<0x0A>``); the token's content string for added and special tokens (``"<|im_end|>"``), so
    that those match only an added token of the same name, never text; None for a piece that spells no
    bytes (unknown characters in a byte-level vocabulary).
    """
    n = real_vocab_size(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    added = {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})} | set(tokenizer.all_special_ids)
    byte_level = _is_byte_level(tokenizer, [p for p in pieces if p])
    keys: list[bytes | str | None] = []
    for i, piece in enumerate(pieces):
        if piece is None:
            keys.append(None)
        elif i in added:
            keys.append(str(piece))
        elif byte_level:
            try:
                keys.append(bytes(_BYTE_OF_CHAR[c] for c in piece))
            except KeyError:
                keys.append(None)
        else:
            m = _BYTE_PIECE.match(piece)
            keys.append(bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode("utf-8"))
    return keys


@dataclass(frozen=True)
class VocabOverlap:
    """What two tokenizers share: ids of one that spell exactly a token of the other.

    Attributes:
        target_size, draft_size: real vocabulary sizes (`real_vocab_size`).
        shared: number of distinct tokens (bytes, or added-token names) in both vocabularies.
        fraction_of_target, fraction_of_draft: `shared` over each size.
        same_ids: whether every shared token has the same id in both and the sizes match (then the pair
            can verify ids directly and `check_tokenizers` is the relevant check).
        draft_to_target: ``[draft_size]`` the target id of each draft id's token, -1 where the target has
            none (the map the token-level intersection drafter samples through).
    """

    target_size: int
    draft_size: int
    shared: int
    fraction_of_target: float
    fraction_of_draft: float
    same_ids: bool
    draft_to_target: tuple[int, ...]

    def summary(self) -> dict:
        """The scalar fields, for JSON records."""
        return {"target_size": self.target_size, "draft_size": self.draft_size, "shared": self.shared,
                "fraction_of_target": self.fraction_of_target, "fraction_of_draft": self.fraction_of_draft,
                "same_ids": self.same_ids}


def vocab_overlap(target_tok, draft_tok) -> VocabOverlap:
    """Compare two tokenizers by what their tokens spell (`token_keys`), not by id.

    Where a vocabulary spells the same bytes with two ids, the lowest id stands for them.

    Raises:
        IncompatibleTokenizersError: the two vocabularies share no token at all.
    """
    kt, kd = token_keys(target_tok), token_keys(draft_tok)
    target_id: dict = {}
    for i, key in enumerate(kt):
        if key is not None:
            target_id.setdefault(key, i)
    draft_to_target = tuple(target_id.get(key, -1) if key is not None else -1 for key in kd)
    shared = len({key for key in kd if key is not None and key in target_id})
    if shared == 0:
        raise IncompatibleTokenizersError("the draft and target tokenizers share no token")
    same_ids = len(kt) == len(kd) and all(t == i for i, t in enumerate(draft_to_target) if t >= 0)
    return VocabOverlap(len(kt), len(kd), shared, shared / len(kt), shared / len(kd), same_ids, draft_to_target)
