"""Per-round records and the rates derived from them.

Raw counts are recorded per round; every rate is derived here, never stored pre-computed (as vLLM's
spec-decode metrics), and declared once in `RATES` as (numerator, denominator) of the raw `COUNTS`, which
`GenerationResult`, the sweep's console lines and the report all evaluate. Definitions (the bonus/recovered
token is the ``+1`` of each round):

- **drafted** = sum over rounds of the draft tokens offered for verification (K of the round; a prompt-lookup
  round may propose < K), cut where the output stops: when an EOS ends the output inside the drafted block,
  the drafts after it never reached the output and are not counted (`RoundRecord.num_drafted`).
- **accepted** = sum of accepted draft tokens that reached the output (not those accepted after an EOS).
  Excludes the recovered/bonus token.
- **acceptance rate** = accepted / drafted. Numerator and denominator are cut at the same place, so a
  drafter that always agrees with the target reads 1.0 whether the output ends at the budget or at an EOS.
- **alpha-hat** = accepted / (accepted + rejections), where a rejection is a round that stopped at a
  rejected draft token. It estimates the per-token acceptance probability alpha of Leviathan et al. and,
  unlike the acceptance rate, does not fall as K grows (an all-accepted round contributes no rejection).
- **mean accepted tokens** = accepted / speculative rounds (rounds with K > 0). Excludes the bonus.
- **block efficiency** = tokens committed / target forwards (rounds). *Includes* the recovered/bonus token,
  so it is >= 1; target-only decoding has exactly 1.
- **prefill_s** = time to put the prompt (all but its last token) into the target's cache (a draft model's
  prefill is deferred to the first round that drafts, whose draft_s then holds it). **TTFT** = prefill_s
  plus the first round, i.e. until the first new token is known. **decode_s** = total_s - prefill_s.
- **tokens_per_s** = new tokens / total_s (end to end, the figure speedups are quoted on);
  **decode_tokens_per_s** = new tokens / decode_s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["COUNTS", "RATES", "GenerationResult", "Rate", "RoundRecord", "acceptance_record", "rates"]

#: The raw counts every rate is built from, by the names the ``runs`` table (and `GenerationResult.counts`)
#: gives them. Tokens and rounds are counts; ``*_s`` are seconds.
COUNTS = (
    "new_tokens", "num_rounds", "num_speculative_rounds", "num_drafted", "num_accepted", "num_rejections",
    "num_emitted", "total_s", "prefill_s", "decode_s",
)  # fmt: skip


@dataclass(frozen=True)
class Rate:
    """A derived figure declared once as (sum of raw counts) / (sum of raw counts).

    Attributes:
        name: the figure's name everywhere (``GenerationResult`` property, summary key, report column).
        numerator, denominator: names from `COUNTS`, summed.
        doc: the definition in words (units; whether the recovered/bonus token counts).
    """

    name: str
    numerator: tuple[str, ...]
    denominator: tuple[str, ...]
    doc: str

    def of(self, counts: Mapping[str, float | None]) -> float:
        """The rate from `counts` (a mapping with at least the numerator's and denominator's names; values
        may be sums over many runs). NaN when a count is missing, None or NaN, or the denominator is 0."""
        parts = []
        for names in (self.numerator, self.denominator):
            vals = [counts.get(n) for n in names]
            if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vals):
                return math.nan
            parts.append(float(sum(vals)))
        num, den = parts
        return num / den if den else math.nan


#: Every rate the project reports, by name (module docstring; docs/DESIGN.md, "Metrics").
RATES: dict[str, Rate] = {
    r.name: r
    for r in (
        Rate("acceptance_rate", ("num_accepted",), ("num_drafted",),
             "accepted draft tokens / drafted tokens (bonus/recovered token excluded)"),
        Rate("alpha_hat", ("num_accepted",), ("num_accepted", "num_rejections"),
             "accepted / (accepted + rejections): the per-token acceptance estimate (bonus excluded)"),
        Rate("mean_accepted", ("num_accepted",), ("num_speculative_rounds",),
             "accepted draft tokens per round with K > 0 (bonus excluded)"),
        Rate("mean_k", ("num_drafted",), ("num_speculative_rounds",),
             "drafted tokens per round with K > 0"),
        Rate("block_efficiency", ("num_emitted",), ("num_rounds",),
             "tokens committed per target forward (bonus/recovered included; >= 1)"),
        Rate("tokens_per_s", ("new_tokens",), ("total_s",), "new tokens / end-to-end seconds"),
        Rate("decode_tokens_per_s", ("new_tokens",), ("decode_s",), "new tokens / (total - prefill) seconds"),
    )
}  # fmt: skip


def acceptance_record(rounds: Iterable[RoundRecord]) -> dict[str, Any]:
    """The acceptance figures of `rounds` in the shape serving engines report them (docs/DESIGN.md, "Metrics",
    maps each to vLLM's, llama.cpp's and SGLang's names):

    - ``num_drafts``: rounds whose draft reached verification (``num_drafted > 0``; vLLM's ``num_drafts``);
    - ``num_draft_tokens`` / ``num_accepted_tokens``: drafted / accepted tokens (`RoundRecord.num_drafted`,
      ``num_accepted``: cut where the output stopped; the bonus/recovered token excluded);
    - ``draft_acceptance_rate`` = accepted / drafted;
    - ``mean_acceptance_length`` = 1 + accepted / num_drafts: tokens per verified draft, the bonus or recovered
      token included (vLLM's definition; rounds without a draft left out, unlike block efficiency, which
      counts every target forward);
    - ``acceptance_histogram``: element a = drafts that had exactly a tokens accepted (a = 0..max K);
    - ``accepted_per_position``: element i = drafts whose accepted prefix passed draft position i (vLLM's
      ``num_accepted_tokens_per_pos``; divided by ``num_drafts``, the share of drafts reaching i + 1).
    Rates of nothing drafted are None.
    """
    drafts = [r for r in rounds if r.num_drafted > 0]
    width = max((r.num_drafted for r in drafts), default=0)
    histogram = [0] * (width + 1)
    per_position = [0] * width
    for r in drafts:
        histogram[r.num_accepted] += 1
        for i in range(r.num_accepted):
            per_position[i] += 1
    drafted, accepted = sum(r.num_drafted for r in drafts), sum(r.num_accepted for r in drafts)
    return {"num_drafts": len(drafts), "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / len(drafts) if drafts else None,
            "acceptance_histogram": histogram if drafts else [], "accepted_per_position": per_position}


def rates(counts: Mapping[str, float | None], names: Iterable[str] | None = None) -> dict[str, float]:
    """``{name: value}`` of the `RATES` named (all by default) evaluated on `counts` (see `Rate.of`).

    Raises:
        KeyError: an unknown rate name.
    """
    return {n: RATES[n].of(counts) for n in (RATES if names is None else names)}


@dataclass(frozen=True)
class RoundRecord:
    """One round: the drafter proposed `k` tokens, the target scored k+1 positions in one forward.

    Attributes:
        k: draft tokens proposed and verified, i.e. the forward held k + 1 tokens (0 = a plain target step);
            the cost of the round. The counted drafts are `num_drafted` (cut at the output's end).
        k_requested: K the policy asked for before clamping to budget/context/drafter supply.
        num_accepted: accepted draft tokens that reached the output: the verifier's accepted prefix, cut
            where the output stopped (an EOS inside the block), i.e. ``min(num_accepted_raw, num_emitted)``.
            Every count and rate (acceptance rate, alpha-hat, mean accepted) is built on this.
        accept_flags: the verifier's flags, per evaluated draft position (see `Verdict`); they may run past
            the end of the output (drafts accepted after an EOS).
        next_kind: ``"bonus"`` (all accepted, including K = 0) or ``"recovered"``.
        num_emitted: tokens committed this round after cutting at EOS / budget (<= num_accepted + 1).
        num_accepted_raw: the verifier's accepted prefix length before the cut (None: equal to
            `num_accepted`, as in records built by hand).
        draft_s: seconds spent drafting (wall clock, device synchronized).
        verify_s: seconds of the target forward plus verification.
        forward_s: seconds of the target forward alone (device synchronized; within `verify_s`), so the
            time model can take the forward's cost apart from sampling and verification work (None in
            records built by hand).
        other_s: the rest of the round: rollback of both caches and bookkeeping.
        alpha_estimate: the policy's acceptance estimate when it chose K (None for fixed K).
        n_forward: tokens in the round's target forward when verification was padded to a cheaper shape
            (`specdec.engine.decoding.speculative_generate`'s ``pad_to``; >= k + 1, the extra ones filler); None:
            not padded, the forward held k + 1 tokens.
        draft_stopped: the draft model stopped on its confidence before the K asked (`Draft.stopped`): it
            fed its k-th token too, so the next round's catch-up is 1 token (`specdec.engine.traces.draft_pending`).
        draft_source: which part of a combining drafter drafted the round (`Draft.source`: the mixed drafter's
            ``"suffix"``, ``"model"`` or ``"none"``); None for a drafter of one kind and for target-only rounds.
    """

    k: int
    num_accepted: int
    accept_flags: tuple[bool, ...]
    next_kind: str
    num_emitted: int
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    k_requested: int | None = None
    alpha_estimate: float | None = None
    num_accepted_raw: int | None = None
    forward_s: float | None = None
    n_forward: int | None = None
    draft_stopped: bool = False
    draft_source: str | None = None

    @property
    def num_drafted(self) -> int:
        """Draft tokens counted as drafted: `k`, or, when the output stopped inside the drafted block (an EOS
        among the accepted drafts: ``num_emitted <= num_accepted``), the drafts before that cut, which are
        exactly the `num_accepted` ones (drafts after the cut never reached the output, as accepted ones
        after it are not counted). The denominator of the acceptance rate, cut where its numerator is."""
        return self.k if self.num_emitted > self.num_accepted else min(self.k, self.num_accepted)

    @property
    def rejected(self) -> bool:
        """True when a rejected draft token ended the round's output: the verifier rejected a draft and the
        recovered token that replaced it was emitted (a rejection after an EOS never reached the output)."""
        return self.next_kind == "recovered" and self.num_emitted > self.num_accepted


@dataclass
class GenerationResult:
    """Tokens and trace of one generation (target-only or speculative).

    Attributes:
        method: ``"baseline"`` or ``"speculative"``.
        prompt_ids: the prompt token ids.
        token_ids: new token ids only (the EOS included when it ended the generation).
        finish_reason: ``"eos"``, ``"length"`` (max_new_tokens reached) or ``"empty"`` (max_new_tokens 0).
        rounds: one `RoundRecord` per target forward after prefill.
        prefill_s, total_s: seconds; see module docstring.
        ttft_s: seconds until the first new token was committed.
        policy_note: what the K policy says about the run as a whole (`CostPolicy.note`: target-only from
            the start because no K can pay, or the probes it took), or None.
    """

    method: str
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    rounds: list[RoundRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    total_s: float = 0.0
    ttft_s: float = 0.0
    policy_note: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def num_drafted(self) -> int:
        """Draft tokens offered for verification, cut where the output stopped (`RoundRecord.num_drafted`)."""
        return sum(r.num_drafted for r in self.rounds)

    @property
    def num_accepted(self) -> int:
        return sum(r.num_accepted for r in self.rounds)

    @property
    def num_rejections(self) -> int:
        return sum(1 for r in self.rounds if r.rejected)

    @property
    def num_speculative_rounds(self) -> int:
        return sum(1 for r in self.rounds if r.k > 0)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted; NaN when nothing was drafted."""
        return RATES["acceptance_rate"].of(self.counts())

    @property
    def alpha_hat(self) -> float:
        """accepted / (accepted + rejections); NaN when nothing was drafted."""
        return RATES["alpha_hat"].of(self.counts())

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per speculative round (bonus excluded)."""
        return RATES["mean_accepted"].of(self.counts())

    @property
    def block_efficiency(self) -> float:
        """Tokens committed per target forward (bonus/recovered included)."""
        return RATES["block_efficiency"].of(self.counts())

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s

    @property
    def tokens_per_s(self) -> float:
        """End-to-end tokens/s: new tokens / total seconds."""
        return RATES["tokens_per_s"].of(self.counts())

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode-phase tokens/s: new tokens / (total - prefill) seconds."""
        return RATES["decode_tokens_per_s"].of(self.counts())

    @property
    def draft_s(self) -> float:
        return sum(r.draft_s for r in self.rounds)

    def acceptance_record(self) -> dict[str, Any]:
        """This generation's `acceptance_record` (the serving engines' shape)."""
        return acceptance_record(self.rounds)

    def counts(self) -> dict[str, float]:
        """The raw `COUNTS` of this generation (tokens, rounds, seconds) that every rate is built from."""
        return {
            "new_tokens": self.num_tokens, "num_rounds": self.num_rounds,
            "num_speculative_rounds": self.num_speculative_rounds, "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted, "num_rejections": self.num_rejections,
            "num_emitted": sum(r.num_emitted for r in self.rounds), "total_s": self.total_s,
            "prefill_s": self.prefill_s, "decode_s": self.decode_s,
        }  # fmt: skip

    @property
    def verify_s(self) -> float:
        return sum(r.verify_s for r in self.rounds)

    def summary(self) -> dict:
        """A flat JSON-ready dict of the counts and derived figures (NaN -> None)."""
        def clean(x):
            return None if isinstance(x, float) and math.isnan(x) else x

        return {
            "method": self.method,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "num_tokens": self.num_tokens,
            "num_rounds": self.num_rounds,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "num_rejections": self.num_rejections,
            **{name: clean(value) for name, value in rates(self.counts()).items() if name != "mean_k"},
            "prefill_s": self.prefill_s,
            "ttft_s": self.ttft_s,
            "decode_s": self.decode_s,
            "total_s": self.total_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "acceptance": self.acceptance_record(),
        }

    def rounds_as_dicts(self) -> list[dict]:
        """Per-round records as plain dicts (accept_flags as a '1011' string; the counted `num_drafted` too)."""
        out = []
        for r in self.rounds:
            d = asdict(r)
            d["accept_flags"] = "".join("1" if f else "0" for f in r.accept_flags)
            d["num_drafted"] = r.num_drafted
            out.append(d)
        return out
