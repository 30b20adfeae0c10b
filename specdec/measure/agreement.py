"""Greedy agreement between two models of one vocabulary: how far their greedy outputs run identical.

A requantized GGUF is another model than the file it was made from (two roundings stacked), so before it
serves as a target its greedy output is compared, prompt by prompt, with the shipped file's and with the
fp32 transformers reference of the same weights (`benchmarks/llamacpp_candidates.py`). Two figures per
prompt over `n` new tokens:

* first divergence: the first output position where the two differ (`n` when all `n` agree);
* identical share: the share of the `n` positions holding the same token (after a divergence the two texts
  usually drift apart, so this mostly tells a late divergence from an early one).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["agreement", "compare_outputs", "greedy_ids"]


def greedy_ids(backend: Any, prompt_ids: Sequence[int], n: int, vocab_size: int | None = None) -> list[int]:
    """`n` greedy (argmax) tokens after `prompt_ids` on a fresh cache of any `specdec.runtimes.base.Backend`.

    Args:
        backend: a backend (llama.cpp or transformers); its cache is reset first and left holding the run.
        prompt_ids: the prompt's token ids (non-empty).
        n: new tokens (no stopping on EOS: the same positions are compared for every model).
        vocab_size: score only the first `vocab_size` logits columns (a transformers head padded past the
            tokenizer's vocabulary); None: every column.

    Raises:
        ValueError: empty prompt or negative `n`.
    """
    if not prompt_ids:
        raise ValueError("greedy_ids needs a non-empty prompt")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    backend.reset()
    logits = backend.forward(list(prompt_ids), last=1)
    out: list[int] = []
    for _ in range(n):
        row = logits[-1] if vocab_size is None else logits[-1][:vocab_size]
        tok = int(row.argmax())
        out.append(tok)
        if len(out) < n:
            logits = backend.forward([tok])
    return out


def agreement(output: Sequence[int], reference: Sequence[int]) -> dict[str, Any]:
    """Agreement of one greedy `output` with the `reference` output of the same prompt.

    Returns:
        ``{"first_divergence": int, "identical_share": float, "identical": bool}`` over the ``n =
        len(reference)`` positions: the first position where they differ (``n`` when none does; a shorter
        `output` differs where it ends), the share of positions holding the same token (0.0..1.0; 1.0 for
        ``n == 0``) and whether all ``n`` agree.
    """
    n = len(reference)
    first = next((i for i in range(n) if i >= len(output) or output[i] != reference[i]), n)
    same = sum(1 for i in range(min(n, len(output))) if output[i] == reference[i])
    return {"first_divergence": first, "identical_share": same / n if n else 1.0, "identical": first == n}


def compare_outputs(outputs: Mapping[str, Sequence[Sequence[int]]], references: Mapping[str, Sequence[Sequence[int]]],
                    prompt_ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """Agreement of each model's greedy outputs with each reference's, over the same prompts.

    Args:
        outputs: model label -> one greedy output per prompt.
        references: reference label -> one greedy output per prompt (same prompt order).
        prompt_ids: names of the prompts (default ``"0"``, ``"1"``, ...).

    Returns:
        ``{model: {reference: {"prompts_identical": int, "prompts": int, "mean_first_divergence": float,
        "mean_identical_share": float, "per_prompt": {prompt: agreement(...)}}}}``.

    Raises:
        ValueError: a model or reference has another number of outputs than the first reference.
    """
    refs = dict(references)
    if not refs:
        return {label: {} for label in outputs}
    count = len(next(iter(refs.values())))
    names = list(prompt_ids) if prompt_ids is not None else [str(i) for i in range(count)]
    for label, outs in {**refs, **outputs}.items():
        if len(outs) != count or len(names) != count:
            raise ValueError(f"{label}: {len(outs)} outputs for {count} prompts ({len(names)} names)")
    result: dict[str, dict[str, Any]] = {}
    for label, outs in outputs.items():
        result[label] = {}
        for ref_label, ref_outs in refs.items():
            per = {name: agreement(o, r) for name, o, r in zip(names, outs, ref_outs, strict=True)}
            result[label][ref_label] = {
                "prompts_identical": sum(a["identical"] for a in per.values()), "prompts": count,
                "mean_first_divergence": statistics.mean(a["first_divergence"] for a in per.values()) if per else 0.0,
                "mean_identical_share": statistics.mean(a["identical_share"] for a in per.values()) if per else 1.0,
                "per_prompt": per,
            }  # fmt: skip
    return result
