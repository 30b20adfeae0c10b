"""Published model architectures, built with random weights, for timing only.

The cost of a draft step and of verifying n tokens depends on the architecture, the dtype, the runtime and
the hardware, not on the values of the weights. So a model built from its published configuration with
random weights (fixed seed, no download) times the same as the trained one, and the original study's pairs
(GPT-2 -> GPT-2-medium / GPT-2-large) can be costed on a machine that cannot download their weights.
Everything measured this way is labelled ``random weights: timing only``; acceptance needs the real
weights and never comes from here.

The configurations are copied from the models' published ``config.json`` files (GPT-2: the OpenAI
checkpoints on the Hugging Face hub; Qwen2.5-Coder: the configuration specdec's converted default pair
carries, whose output head is untied as in the GGUF files it is converted from).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ARCHS", "ORIGINAL_PAIRS", "RANDOM_WEIGHTS_LABEL", "Arch", "build_random_model", "resolve_archs"]

#: Printed beside every figure measured on a model built here.
RANDOM_WEIGHTS_LABEL = "random weights: timing only"

_GPT2 = {
    "model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_ctx": 1024, "activation_function":
    "gelu_new", "layer_norm_epsilon": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256,
    "tie_word_embeddings": True,
}  # fmt: skip
_QWEN2 = {
    "model_type": "qwen2", "vocab_size": 151936, "max_position_embeddings": 32768, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": None,
    "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
}  # fmt: skip


@dataclass(frozen=True)
class Arch:
    """One published architecture.

    Attributes:
        name: the name users pass (``gpt2-large``), the hub id of the trained checkpoint.
        config: the fields of its ``config.json`` that decide the computation.
        params: the parameter count this configuration builds (GPT-2: the published counts; Qwen2.5-Coder:
            the published 494M / 1.54B plus the untied output head specdec's converted pair carries).
    """

    name: str
    config: dict[str, Any]
    params: int


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("gpt2", {**_GPT2, "n_embd": 768, "n_layer": 12, "n_head": 12}, 124_439_808),
        Arch("gpt2-medium", {**_GPT2, "n_embd": 1024, "n_layer": 24, "n_head": 16}, 354_823_168),
        Arch("gpt2-large", {**_GPT2, "n_embd": 1280, "n_layer": 36, "n_head": 20}, 774_030_080),
        Arch(
            "qwen2.5-coder-0.5b",
            {**_QWEN2, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "max_window_layers": 24},
            630_167_424,
        ),
        Arch(
            "qwen2.5-coder-1.5b",
            {**_QWEN2, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
             "num_attention_heads": 12, "num_key_value_heads": 2, "max_window_layers": 28},
            1_777_088_000,
        ),
    )
}

#: Draft -> target pairs costed by ``specdec costs --arch``: the original study's two and the default pair.
ORIGINAL_PAIRS: tuple[tuple[str, str], ...] = (
    ("gpt2", "gpt2-medium"),
    ("gpt2", "gpt2-large"),
    ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"),
)


def resolve_archs(names: str | list[str]) -> list[Arch]:
    """Architectures by name (a comma-separated string or a list), in the order given, without repeats.

    Raises:
        ValueError: an unknown name (the message lists the known ones) or an empty list.
    """
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not items:
        raise ValueError(f"no architecture named; known: {', '.join(ARCHS)}")
    unknown = [n for n in items if n not in ARCHS]
    if unknown:
        raise ValueError(f"unknown architecture {unknown[0]!r}; known: {', '.join(ARCHS)}")
    return [ARCHS[n] for n in dict.fromkeys(items)]


def build_random_model(arch: Arch | str, *, dtype: str = "float32", device: str = "cpu", seed: int = 0):
    """A transformers causal LM of `arch`'s exact architecture with random weights (no file is read).

    Args:
        arch: an `Arch` or its name. dtype: ``float32`` | ``bfloat16`` | ``float16``. device: a torch
            device string (``cpu``, ``cuda``). seed: the weights' seed (same seed, same weights).

    Returns:
        The model in eval mode on `device` in `dtype`. Its forward over ``[1, n]`` ids returns logits
        ``[1, n, vocab_size]``.

    Raises:
        ValueError: unknown architecture or dtype.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(arch, str):
        (arch,) = resolve_archs(arch)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(dtypes)}")
    fields = dict(arch.config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    with torch.device(device):  # initialize on the device itself (a GPU fills 1.5B weights in milliseconds)
        model = AutoModelForCausalLM.from_config(config, dtype=dtypes[dtype])
    return model.to(device).eval()


def measure_arch_costs(
    archs: list[Arch],
    *,
    dtype: str = "float32",
    device: str = "cpu",
    max_n: int = 17,
    repeats: int = 3,
    context_tokens: int = 64,
    pairs: tuple[tuple[str, str], ...] = ORIGINAL_PAIRS,
) -> dict[str, Any]:
    """Time each architecture (random weights) as a target and as a draft, then derive c for each pair.

    Each model is built, timed exactly as `specdec.measure.timing.measure_costs` times a real pair (the same
    `forward_times`: a warm cache of `context_tokens` synthetic ids, n = 1 .. max_n appended, median of
    `repeats`; the single step again with 3x the repeats, as a draft is timed), and freed before the next
    one, so at most one model is in memory. The device is synchronized before every clock read.

    Args:
        archs: the architectures to time. dtype, device: as `build_random_model`. max_n: longest forward
            timed (17 = verification at K = 16). repeats: timed forwards per n. context_tokens: warm cache.
        pairs: (draft, target) names; a pair is costed when both were timed.

    Returns:
        ``{"weights": RANDOM_WEIGHTS_LABEL, "dtype", "device", "context_tokens", "repeats",
        "archs": {name: {"params", "step_s", "step_spread_s", "forward_s": {n: s}, "forward_spread_s",
        "verify_steps": {n: v(n)}}}, "pairs": [{"draft", "target", "c", "draft_step_s", "target_step_s",
        "verify_steps"}]}``; seconds throughout, v(n) in target steps.

    Raises:
        ValueError: max_n, repeats or context_tokens < 1, or the context cannot hold them.
    """
    import gc

    from specdec.measure.timing import DRAFT_REPEAT_FACTOR, forward_times, verification_steps
    from specdec.runtimes.hf import HFBackend

    if max_n < 1 or repeats < 1 or context_tokens < 1:
        raise ValueError("max_n, repeats and context_tokens must all be >= 1")
    out: dict[str, Any] = {"weights": RANDOM_WEIGHTS_LABEL, "dtype": dtype, "device": device,
                           "context_tokens": context_tokens, "repeats": repeats, "archs": {}, "pairs": []}
    for arch in archs:
        backend = HFBackend(build_random_model(arch, dtype=dtype, device=device))
        if context_tokens + max_n > backend.max_length:
            raise ValueError(f"{arch.name}: {context_tokens} + {max_n} tokens exceed its context")
        vocab = arch.config["vocab_size"]
        context = [(7 + 31 * i) % vocab for i in range(context_tokens)]
        fwd, spread = forward_times(backend, context, list(range(1, max_n + 1)), repeats=repeats)
        step, step_spread = forward_times(backend, context, [1], repeats=DRAFT_REPEAT_FACTOR * repeats)
        out["archs"][arch.name] = {
            "params": arch.params, "step_s": step[1], "step_spread_s": step_spread[1], "forward_s": fwd,
            "forward_spread_s": spread, "verify_steps": verification_steps(fwd),
        }  # fmt: skip
        del backend
        gc.collect()
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    timed = out["archs"]
    for d, t in pairs:
        if d in timed and t in timed:
            out["pairs"].append({
                "draft": d, "target": t, "c": timed[d]["step_s"] / timed[t]["step_s"],
                "draft_step_s": timed[d]["step_s"], "target_step_s": timed[t]["step_s"],
                "verify_steps": timed[t]["verify_steps"],
            })  # fmt: skip
    return out


def format_arch_costs(result: dict[str, Any]) -> str:
    """`measure_arch_costs` output as a plain-text table (ms and target steps), labelled random weights."""
    ns = [n for n in (2, 3, 5, 9, 17) if all(n in a["verify_steps"] for a in result["archs"].values())]
    lines = [(f"{RANDOM_WEIGHTS_LABEL}: {result['dtype']} on {result['device']}, warm cache of "
             f"{result['context_tokens']} tokens, median of {result['repeats']} (single step: 3x as many)"),
             f"{'model':22s} {'params':>8s} {'step ms':>9s} " + " ".join(f"{'v(' + str(n) + ')':>6s}" for n in ns)]
    for name, a in result["archs"].items():
        vs = " ".join(f"{a['verify_steps'][n]:6.2f}" for n in ns)
        lines.append(f"{name:22s} {a['params'] / 1e6:7.0f}M {a['step_s'] * 1e3:9.2f} {vs}")
    for p in result["pairs"]:
        lines.append(f"c({p['draft']} -> {p['target']}) = {p['c']:.3f}")
    return "\n".join(lines)
