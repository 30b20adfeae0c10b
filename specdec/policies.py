"""K policies: how many draft tokens to propose in the next round.

The engine calls `start()` once per generation, `next_k()` before every round and `observe(record)` after
it. A policy only *asks*; the engine clamps K to the token budget and to every model's context, and records
both the asked (``RoundRecord.k_requested``) and the used (``RoundRecord.k``) K, plus `alpha_estimate()`.

Policies (build them by name with `make_policy`):

- ``fixed`` (`FixedK`): always K (Leviathan et al. 2023; Chen et al. 2023).
- ``heuristic`` (`HeuristicK`): K += 2 after a fully accepted round, K -= 1 otherwise (K >= 1), restarted
  from its initial K on every generation: transformers' ``AssistedCandidateGenerator`` schedule
  ``"heuristic_transient"``.
- ``confidence`` (`ConfidenceK`): asks for its max K every round and lets the draft model stop early when
  its top-token probability falls below a threshold (llama.cpp ``--draft-p-min``; transformers'
  ``assistant_confidence_threshold``). The stop happens inside `ModelDrafter.propose`; call
  ``policy.configure(drafter)`` once before generating so the drafter knows the threshold.
- ``cost`` (`CostPolicy`, ours): picks the K in 0..max_k that maximises expected tokens per second under the
  analytical model of Leviathan et al. 2023 (Sec. 3.4; `specdec.theory.refined_speedup`) with the measured
  draft step time and target verification cost curve, using a decayed running estimate of alpha; K = 0
  decodes plainly and is left again by periodic probes.

Every policy has ``configure(drafter)``: call it once per (policy, drafter) pairing before generating. Only
`ConfidenceK` sets a threshold; the others clear one a previous confidence run may have left on a reused
drafter. `configure_drafter` does this for any policy object.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from specdec.costs import CostCurve
from specdec.metrics import RoundRecord

POLICY_NAMES = ("fixed", "heuristic", "confidence", "cost")


class KPolicy(Protocol):
    """Chooses K each round (0 = decode one token plainly this round)."""

    name: str

    def start(self) -> None:
        """Reset per-generation state (no state carries across generations)."""
        ...

    def next_k(self) -> int:
        """K for the next round (>= 0)."""
        ...

    def alpha_estimate(self) -> float | None:
        """The acceptance estimate the last `next_k` used, for the trace (None if it uses none)."""
        ...

    def observe(self, record: RoundRecord) -> None:
        """Learn from the round just finished."""
        ...


def _check_k(k: object, what: str = "K") -> int:
    if isinstance(k, bool) or int(k) != k or int(k) < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {k!r}")
    return int(k)


def _set_threshold(drafter: Any, threshold: float | None) -> bool:
    """Set ``drafter.confidence_threshold`` if the drafter supports a confidence stop; True if it does."""
    if hasattr(drafter, "confidence_threshold"):
        drafter.confidence_threshold = threshold
        return True
    return False


def configure_drafter(policy: Any, drafter: Any) -> bool:
    """Prepare `drafter` for `policy` (call once before generating with the pair).

    Calls ``policy.configure(drafter)`` when the policy has one; otherwise clears any confidence threshold
    on the drafter. Returns True when the drafter ends up using a confidence stop.
    """
    configure = getattr(policy, "configure", None)
    if configure is not None:
        return bool(configure(drafter))
    _set_threshold(drafter, None)
    return False


class FixedK:
    """Always propose K tokens (the classic setting of Leviathan et al.).

    Raises:
        ValueError: k < 1.
    """

    name = "fixed"

    def __init__(self, k: int) -> None:
        if int(k) < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        self.k = int(k)

    def start(self) -> None:
        pass

    def next_k(self) -> int:
        return self.k

    def alpha_estimate(self) -> float | None:
        return None

    def observe(self, record: RoundRecord) -> None:
        pass

    def configure(self, drafter: Any) -> bool:
        """Clear any confidence stop on `drafter` (a fixed K means exactly K draft tokens). Returns False."""
        _set_threshold(drafter, None)
        return False


class HeuristicK:
    """transformers' ``"heuristic_transient"`` schedule (``AssistedCandidateGenerator.update_candidate_strategy``).

    After a round whose every proposed draft token was accepted, K += 2; after a round with a rejection,
    K = max(1, K - 1). A round in which nothing was proposed (K clamped to 0, or a prompt-lookup miss) carries
    no evidence and leaves K unchanged. `start()` restores the initial K: nothing carries across generations
    ("transient"; transformers' plain ``"heuristic"`` would keep K between calls).

    Args:
        k: initial K (tokens, >= 1); also the K after every `start()`.
        max_k: optional cap (tokens, >= k); None = no cap of its own (the engine still clamps K to the
            budget and the context).

    Raises:
        ValueError: k < 1 or max_k < k.
    """

    name = "heuristic"

    def __init__(self, k: int, max_k: int | None = None) -> None:
        self.initial_k = _check_k(k)
        self.max_k = None if max_k is None else _check_k(max_k, "max_k")
        if self.max_k is not None and self.max_k < self.initial_k:
            raise ValueError(f"max_k ({self.max_k}) must be >= the initial K ({self.initial_k})")
        self.k = self.initial_k

    def start(self) -> None:
        self.k = self.initial_k

    def next_k(self) -> int:
        return self.k

    def alpha_estimate(self) -> float | None:
        return None

    def observe(self, record: RoundRecord) -> None:
        if record.k <= 0:
            return
        if record.num_accepted >= record.k:
            self.k += 2
            if self.max_k is not None:
                self.k = min(self.k, self.max_k)
        else:
            self.k = max(1, self.k - 1)

    def configure(self, drafter: Any) -> bool:
        """Clear any confidence stop on `drafter`. Returns False."""
        _set_threshold(drafter, None)
        return False


class ConfidenceK:
    """Ask for `max_k` every round; the draft stops early when its top-token probability is below a threshold.

    The stop itself is implemented by drafters that have probabilities (`ModelDrafter.confidence_threshold`):
    before drafting token i >= 1, if max q_i < `confidence_threshold` the round ends with i tokens (always
    at least one). Sources: llama.cpp ``common_speculative_gen_draft`` (``p_min``, default 0.75 in
    ``speculative-simple``) and transformers' ``assistant_confidence_threshold`` (default 0.4). Call
    `configure` once with the drafter before generating; for a drafter without probabilities (prompt
    lookup) this is `FixedK(max_k)`.

    Args:
        max_k: K asked for every round (tokens, >= 1).
        confidence_threshold: probability threshold (>= 0; 0 never stops, > 1 always stops after one token).

    Raises:
        ValueError: max_k < 1 or a negative / non-finite threshold.
    """

    name = "confidence"

    def __init__(self, max_k: int, confidence_threshold: float = 0.4) -> None:
        self.max_k = _check_k(max_k, "max_k")
        t = float(confidence_threshold)
        if not math.isfinite(t) or t < 0.0:
            raise ValueError(f"confidence_threshold must be finite and >= 0, got {confidence_threshold}")
        self.confidence_threshold = t

    def start(self) -> None:
        pass

    def next_k(self) -> int:
        return self.max_k

    def alpha_estimate(self) -> float | None:
        return None

    def observe(self, record: RoundRecord) -> None:
        pass

    def configure(self, drafter: Any) -> bool:
        """Set ``drafter.confidence_threshold`` when the drafter supports a confidence stop.

        Returns:
            True if the drafter will stop on low confidence; False if it has no such stop (then this policy
            behaves as `FixedK(max_k)`).
        """
        return _set_threshold(drafter, self.confidence_threshold)


class CostPolicy:
    """Choose K to maximise expected tokens per second, from a running alpha estimate and measured costs.

    Model (Leviathan et al. 2023, Thm. 3.8 and Sec. 3.4, with a measured verification cost as in
    `specdec.theory.refined_speedup`): a round with K draft tokens yields on average
    ``E(a, K) = (1 - a^(K+1)) / (1 - a)`` tokens and costs ``K * draft_step_s + T(K + 1)`` seconds, where
    ``T(n)`` is the time of one target forward over n tokens. The policy asks for the K in ``0..max_k``
    with the highest ``E / cost`` (ties -> the smaller K); K = 0 is plain decoding, 1 token per ``T(1)``.
    ``T`` is linearly interpolated between measured n, and linearly extrapolated (never decreasing) past the
    largest measured n.

    Acceptance estimate: decayed counts with a Beta-like prior,
    ``a = (w * prior_alpha + S) / (w + S + F)``, where after each round that proposed K > 0 tokens
    ``S <- decay * S + num_accepted``, ``F <- decay * F + (1 if rejected else 0)`` and ``w <- decay * w``
    (``w`` starts at `prior_weight`): the alpha-hat of `specdec.metrics` over an exponential window of about
    ``1 / (1 - decay)`` rounds, so it follows the text, with the prior treated as the oldest data and
    forgotten like it. Rounds with K = 0 observe no acceptance and leave the estimate unchanged. (A prior
    that kept its weight, ``forget_prior=False``, caps the estimate: with K = 2 fully accepted every round,
    ``(1.2 + 10) / (2 + 10) = 0.93``, which on the default pair's cost staircase keeps K at 2 where K = 16 is
    faster; and it holds a free drafter's estimate at ``1.2 / 7 = 0.17`` however often it misses.)

    Probing (loss-bounded): while the model says K = 0 the estimate cannot change, so every so often the
    policy drafts anyway. The probe asks for the best K > 0 at the current estimate (usually 1) unless
    `probe_k` fixes it, after ``N`` plain rounds, where N is the fewest that keep the probe's expected
    overhead within `probe_overhead` of plain decoding: a probe costs ``R = round_cost(K) / T(1)`` plain
    steps and yields ``E = E(a, K)`` tokens, so a cycle of N plain rounds and one probe takes ``N + R`` steps
    for ``N + E`` tokens, and ``(R - E) / (N + E) <= probe_overhead`` gives
    ``N = ceil((R - E) / probe_overhead - E)``, clamped to ``1..max_backoff``. Once the decayed evidence
    ``S + F`` reaches 3 trials, E is taken at the lower of the estimate and the data alone
    (``S / (S + F)``, no prior), so the prior cannot make a hopeless drafter look cheap to probe; before
    that, one early rejection must not make the drafter look hopeless (the data alone would say 0). Near
    break-even a probe is almost free and comes after one plain round; a hopeless drafter (alpha near 0) is
    probed rarely. When even alpha = 1 cannot beat plain decoding with these costs, the policy never probes.

    Exploring (``explore_z``): the policy decodes plainly only when the estimate plus `explore_z` standard
    deviations of a Beta posterior on the decayed counts (`upper_alpha`: ``n = w + S + F`` trials) would
    too; otherwise it drafts with the K a probe would use. The decayed window holds few trials (at the
    default decay 0.8, about 5 with K = 1 rounds, ~10 with K = 2), so the estimate is noisy and the bound
    stays 0.15-0.19 above it: in effect, on the default pair's costs, K = 1 is drafted down to an estimate
    of ~0.24 instead of K = 1's break-even 0.41 (a longer window, ``decay`` near 1, closes the bound on the
    estimate). A drafter near alpha = 0 is unaffected (the bound is 0 there, and probing keeps its 3%
    budget); near break-even the optimism is not covered by that budget. Replayed (`benchmarks/
    sim_policy.py`): on the default pair's real acceptance sequences (48 method x prompt cells, two
    stores' costs) it lifted draft/natural from 0.91x to 0.99x of the best fixed K (a hard first 50 tokens
    that single-token probes read at 0.16-0.27 while the draft matched 45% of them) and the worst cell
    from 0.91x to 0.92x; on i.i.d. acceptance (``--synthetic``, c = 0.32) it is at most 0.9% slower than
    ``explore_z = 0`` at any alpha (alpha = 0.25, just below break-even: 0.973x vs 0.982x plain) and up
    to 2% faster at alpha = 0.4-0.5.

    (An earlier version probed with K = 2 after 8 plain rounds and doubled that back-off after every probe
    that still said K = 0; on the default pair it decoded plainly for most of a prompt whose K = 1
    acceptance was 0.72, after a few early rejections; see docs/DESIGN.md.)

    `start()` resets the estimate to the prior: nothing carries across generations.

    Args:
        draft_step_s: seconds of one draft step (one draft token), measured for this pair and machine
            (finite, >= 0; about 0 for prompt lookup).
        target_forward_s: ``{n: seconds}`` of one warm-cache target forward over n tokens; must contain n = 1
            (a plain decoding step). Keys may be strings (JSON).
        max_k: largest K asked for (tokens, >= 1).
        prior_alpha: prior acceptance probability in [0, 1].
        prior_weight: initial weight of the prior in acceptance trials (pseudo-counts), >= 0.
        decay: per observed round multiplier of the past counts, in (0, 1].
        probe_overhead: the expected time a probe may add over plain decoding, as a fraction (> 0).
        probe_k: K asked for by a probe (None: the best K > 0 at the current estimate; capped at max_k).
        max_backoff: most plain rounds between probes (>= 1).
        forget_prior: decay the prior's weight with the data (default) instead of keeping it constant.
        explore_z: standard deviations of optimism before deciding on plain decoding (>= 0; 0: decide at the
            estimate; see "Exploring").

    Raises:
        ValueError: invalid costs or parameters.
    """

    name = "cost"

    def __init__(
        self,
        draft_step_s: float,
        target_forward_s: Mapping[int, float],
        max_k: int = 16,
        prior_alpha: float = 0.6,
        prior_weight: float = 2.0,
        decay: float = 0.8,
        probe_overhead: float = 0.03,
        *,
        probe_k: int | None = None,
        max_backoff: int = 64,
        forget_prior: bool = True,
        explore_z: float = 1.0,
    ) -> None:
        self.max_k = _check_k(max_k, "max_k")
        if draft_step_s is None or not isinstance(target_forward_s, Mapping):
            raise ValueError("the cost policy needs draft_step_s (seconds) and target_forward_s {n: seconds}")
        self.curve = CostCurve(target_forward_s, draft_step_s)  # validates both; n = 1 required
        self.draft_step_s = float(self.curve.draft_step_s)
        self.target_forward_s = dict(self.curve.target_forward_s)
        if not (0.0 <= float(prior_alpha) <= 1.0):
            raise ValueError(f"prior_alpha must be in [0, 1], got {prior_alpha}")
        if not (math.isfinite(float(prior_weight)) and float(prior_weight) >= 0.0):
            raise ValueError(f"prior_weight must be finite and >= 0, got {prior_weight}")
        if not (0.0 < float(decay) <= 1.0):
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.prior_alpha = float(prior_alpha)
        self.prior_weight = float(prior_weight)
        self.decay = float(decay)
        if not (math.isfinite(float(probe_overhead)) and float(probe_overhead) > 0.0):
            raise ValueError(f"probe_overhead must be a finite fraction > 0, got {probe_overhead}")
        self.probe_overhead = float(probe_overhead)
        self.probe_k = None if probe_k is None else min(_check_k(probe_k, "probe_k"), self.max_k)
        self.max_backoff = _check_k(max_backoff, "max_backoff")
        self.forget_prior = bool(forget_prior)
        if not (math.isfinite(float(explore_z)) and float(explore_z) >= 0.0):
            raise ValueError(f"explore_z must be finite and >= 0, got {explore_z}")
        self.explore_z = float(explore_z)

        # Round cost in seconds for K = 0..max_k, fixed for the policy's life (specdec.costs' one rule
        # for forwards longer than the measured curve).
        self.c = self.curve.c  # Leviathan's c (dimensionless)
        self.round_cost_s = [self.curve.round_s(k) for k in range(self.max_k + 1)]
        # Can any K beat plain decoding even at alpha = 1?  If not, probing is pointless.
        self.speculation_can_win = any(
            (k + 1) / self.round_cost_s[k] > 1.0 / self.round_cost_s[0] for k in range(1, self.max_k + 1)
        )
        self.start()

    @classmethod
    def from_costs(cls, costs: Mapping[str, Any] | CostCurve, **kw: Any) -> CostPolicy:
        """Build from a `CostCurve` or a costs dict ``{"draft_step_s": s, "target_forward_s": {n: s}}`` (e.g. loaded from the
        JSON written by ``specdec costs``; the n keys may be strings; other keys are ignored). `kw` go to the
        constructor (max_k, prior_alpha, ...).

        Raises:
            ValueError: a key is missing, ``draft_step_s`` is None (costs measured without a draft), or a
                value is invalid.
        """
        if isinstance(costs, CostCurve):
            costs = {"draft_step_s": costs.draft_step_s, "target_forward_s": costs.target_forward_s}
        missing = [key for key in ("draft_step_s", "target_forward_s") if key not in costs]
        if missing:
            raise ValueError(f"costs lack {missing}: measure them with `specdec costs`")
        if costs["draft_step_s"] is None:
            raise ValueError(
                "costs have no draft step time (measured without a draft model); for a model-free drafter "
                "such as prompt lookup pass {**costs, 'draft_step_s': 0.0}"
            )
        return cls(float(costs["draft_step_s"]), costs["target_forward_s"], **kw)

    # -- state -----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._succ = 0.0  # decayed accepted draft tokens
        self._fail = 0.0  # decayed rejections
        self._prior_w = self.prior_weight  # the prior's weight now (decays with the data if forget_prior)
        self._plain = 0  # consecutive plain (K = 0) decisions since the last probe / speculative round
        self._last_alpha = self.current_alpha()
        self._last_k: int | None = None
        self._last_tokens: float | None = None

    def current_alpha(self) -> float:
        """The acceptance estimate from everything observed so far (dimensionless, in [0, 1])."""
        num = self._prior_w * self.prior_alpha + self._succ
        den = self._prior_w + self._succ + self._fail
        return num / den if den > 0.0 else self.prior_alpha

    def tokens_per_s(self, alpha: float) -> list[float]:
        """Predicted tokens per second for K = 0..max_k at acceptance `alpha`."""
        out = []
        e, term = 0.0, 1.0
        for k in range(self.max_k + 1):
            e += term  # E(alpha, k) = sum_{i=0..k} alpha^i
            term *= alpha
            out.append(e / self.round_cost_s[k])
        return out

    def best_k(self, alpha: float) -> int:
        """The K in 0..max_k maximising predicted tokens per second (ties -> smaller K)."""
        rates = self.tokens_per_s(alpha)
        best = 0
        for k, r in enumerate(rates):
            if r > rates[best]:
                best = k
        return best

    # -- the protocol ----------------------------------------------------------------------------------

    def probe_plan(self, alpha: float) -> tuple[int, int]:
        """``(K, N)``: the K a probe asks for at acceptance `alpha` (tokens), and the plain rounds N before it:
        the fewest that keep the probe's expected overhead within `probe_overhead` (class docstring)."""
        rates = self.tokens_per_s(alpha)
        if self.probe_k is not None:
            k = self.probe_k
        else:
            k = 1
            for j in range(2, self.max_k + 1):
                if rates[j] > rates[k]:
                    k = j
        t1 = self.round_cost_s[0]
        expected = rates[k] * self.round_cost_s[k]  # E(alpha, K) tokens
        loss = self.round_cost_s[k] / t1 - expected  # plain steps one probe loses (>= 0 when K = 0 wins)
        n = math.ceil(loss / self.probe_overhead - expected - 1e-9)
        return k, max(1, min(n, self.max_backoff))

    #: Decayed trials (S + F) before the data-only estimate may lower the acceptance a probe is planned at.
    PROBE_EVIDENCE = 3.0

    def _probe_alpha(self) -> float:
        """The acceptance a probe is planned at: the estimate, or min(estimate, data-only S / (S + F)) once
        S + F >= `PROBE_EVIDENCE`."""
        a = self.current_alpha()
        seen = self._succ + self._fail
        return min(a, self._succ / seen) if seen >= self.PROBE_EVIDENCE else a

    def upper_alpha(self) -> float:
        """The estimate plus `explore_z` standard deviations of a Beta posterior with the decayed counts
        (``n = w + S + F`` trials): ``a + z * sqrt(a (1 - a) / (n + 1))``, capped at 1."""
        a = self.current_alpha()
        n = self._prior_w + self._succ + self._fail
        return min(1.0, a + self.explore_z * math.sqrt(a * (1.0 - a) / (n + 1.0)))

    def next_k(self) -> int:
        a = self.current_alpha()
        k = self.best_k(a)
        if k == 0 and self.explore_z > 0.0 and self.best_k(self.upper_alpha()) > 0:
            k = self.probe_plan(self._probe_alpha())[0]  # the K a probe would use now
        if k == 0:
            probe_k, wait = self.probe_plan(self._probe_alpha())
            if self.speculation_can_win and self._plain >= wait:
                k = probe_k
                self._plain = 0
            else:
                self._plain += 1
        else:
            self._plain = 0
        self._last_alpha = a
        self._last_k = k
        self._last_tokens = self.tokens_per_s(a)[k] * self.round_cost_s[k]
        return k

    def alpha_estimate(self) -> float | None:
        """The acceptance estimate the last `next_k` used (the prior before any decision)."""
        return self._last_alpha

    def predicted_tokens(self) -> float | None:
        """Expected tokens per round, E(alpha, K), for the last decision (None before any)."""
        return self._last_tokens

    def predicted_tokens_per_s(self) -> float | None:
        """Predicted tokens per second for the last decision (None before any)."""
        if self._last_k is None:
            return None
        return self._last_tokens / self.round_cost_s[self._last_k]

    @property
    def backoff(self) -> int:
        """Plain rounds before the next probe at the current estimate (N of `probe_plan`)."""
        return self.probe_plan(self._probe_alpha())[1]

    def observe(self, record: RoundRecord) -> None:
        if record.k > 0:
            self._succ = self.decay * self._succ + record.num_accepted
            self._fail = self.decay * self._fail + (1.0 if record.rejected else 0.0)
            if self.forget_prior:
                self._prior_w *= self.decay

    def configure(self, drafter: Any) -> bool:
        """Clear any confidence stop on `drafter` (the cost model assumes K tokens are drafted). Returns False."""
        _set_threshold(drafter, None)
        return False


def make_policy(
    name: str,
    k: int,
    *,
    costs: Mapping[str, Any] | None = None,
    confidence_threshold: float = 0.4,
    max_k: int | None = None,
) -> KPolicy:
    """Build a policy by name.

    Args:
        name: one of ``fixed``, ``heuristic``, ``confidence``, ``cost`` (case-insensitive).
        k: tokens (>= 1): the fixed K (``fixed``), the initial K (``heuristic``), or the maximum K
            (``confidence``, ``cost``).
        costs: for ``cost`` only: ``{"draft_step_s": s, "target_forward_s": {n: s}}`` measured with
            ``specdec costs`` (or stored from an earlier measurement).
        confidence_threshold: for ``confidence`` only (see `ConfidenceK`).
        max_k: for ``heuristic`` only: optional cap on K (None = only the engine's clamps).

    Raises:
        ValueError: unknown name (the message lists the names), k < 1, or ``cost`` without costs.
    """
    key = str(name).strip().lower()
    if key == "fixed":
        return FixedK(k)
    if key == "heuristic":
        return HeuristicK(k, max_k=max_k)
    if key == "confidence":
        return ConfidenceK(k, confidence_threshold)
    if key == "cost":
        if costs is None:
            raise ValueError(
                "the cost policy needs measured costs (draft_step_s, target_forward_s): "
                "measure them with `specdec costs` or pass stored ones"
            )
        return CostPolicy.from_costs(costs, max_k=k)
    raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICY_NAMES)}")
