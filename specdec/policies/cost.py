"""The cost policy: K per round from measured costs and a running acceptance estimate, with a ledger that
bounds what speculation may lose to target-only decoding (`CostPolicy`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from specdec.core.costs import CostCurve
from specdec.core.metrics import RoundRecord
from specdec.core.theory import expected_tokens_per_round
from specdec.policies.base import KOnly, check_k
from specdec.policies.ledger import Ledger


class CostPolicy(KOnly):
    """Choose K to maximise expected tokens per second, from a running alpha estimate and measured costs.

    `next_k` returns the K in ``0..max_k`` with the highest ``E(a, K) / round_cost_s[K]`` (ties -> the
    smaller K), where ``E(a, K) = (1 - a^(K+1)) / (1 - a)`` tokens (Leviathan et al. 2023, Thm. 3.8) and
    ``round_cost_s[K] = K * draft_step_s + T(K + 1)`` seconds, T being the measured target forward curve
    (`specdec.core.costs.CostCurve`; Sec. 3.4 with a measured verification cost); K = 0 is one plain step.
    Two departures from that argmax: it drafts with a probe's K when the optimistic estimate `upper_alpha`
    (`explore_z` standard deviations above) would draft, and after `backoff` consecutive plain rounds it
    probes (`probe_plan`: the fewest plain rounds that keep one probe's expected overhead within
    `probe_overhead`).

    So that the policy never loses to target-only decoding by more than a bounded fraction:

    - only *viable* K are ever chosen or probed (`viable_ks`: K + 1 tokens, all accepted, beat K + 1 plain
      steps on the priced round); when none is (``v(K + 1) + K c >= K + 1`` for every K, e.g. llama.cpp's
      curve with a draft model), the policy is target-only from the first round and never probes
      (`target_only`);
    - a round is priced with the draft's catch-up (`CostCurve.round_s`'s ``pending``: the committed tokens
      the draft has not cached, one more for every plain round since it last drafted, as
      `specdec.engine.traces.draft_pending` counts them);
    - the draft's deferred prefill is an investment, decided at the estimate: a draft model caches nothing
      before its first drafting round (`specdec.drafters.model.ModelDrafter.defers_prefill`), so that round feeds
      the whole prompt (`start`'s ``prefill_tokens``). Its price beyond one draft step, ``F =
      (draft_forward(P) - draft_step) / target_step`` target steps, is paid only when the K the estimate
      chooses is expected to save at least `invest_margin` x F over the tokens left
      (``left x (1 - round_steps(K) / E(a, K))``, `invest_pays`); before it is paid no round drafts on
      optimism alone, so a generation whose estimate cannot pay it back never runs the draft model. Once
      paid, F is sunk: it raises the ledger's allowance by F (`invested`), so the rounds after it are
      judged at the estimate and one unlucky first round does not end speculation
      (`specdec.policies.batch_cost.BatchCostPolicy` makes the same decision per batch);
    - every speculative round, a probe (a round the point estimate would not take) or not, is taken only
      while a ledger allows it (`probe_affordable`): the net loss of the speculative rounds so far (each
      one's priced cost in target steps minus the tokens it committed; a round that won refunds; the
      measured loss instead when the timed rounds show a larger one, `net_loss`) plus the
      round's expected loss at the estimate must stay within `probe_allowance` target steps plus
      `probe_budget` of the priced time so far. Probes taken: `probes`. Replayed on the stored llama.cpp
      traces (tests/test_never_lose.py) no prompt type falls below 0.97x of target-only decoding.

    The estimate (`current_alpha`) is ``(w * prior_alpha + S) / (w + S + F)`` over decayed counts: after each
    round with K > 0, ``S <- decay * S + accepted``, ``F <- decay * F + rejected`` and (`forget_prior`)
    ``w <- decay * w`` from ``w = prior_weight``. `start()` resets it to the prior: nothing carries across
    generations. Why these choices, their history and their replayed results: docs/DESIGN.md, "K policies".

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
            estimate; see `upper_alpha`).
        pad_verify: the engine pads verification to the cheapest measured shape (`speculative_generate`'s
            ``pad_to=CostCurve.padded_n``): price a round's forward at ``curve.padded_value(K + 1)`` instead
            of ``T(K + 1)``, so K follows the curve the engine actually runs.
        probe_budget: the most a round may bring the net loss of speculation to, as a fraction of the
            priced time so far (> 0; 0.01: speculation costs at most about 1% plus `probe_allowance` over
            target-only decoding; ``math.inf``: no ledger, probes follow `probe_plan`'s back-off alone).
        probe_allowance: target steps of net loss allowed before any time has passed (>= 0), so that the
            first rounds can test the prior.
        draft_forward_s: ``{n: seconds}`` of one draft forward over n tokens (the catch-up after plain
            rounds; `CostCurve.draft_forward_s`), or None: every catch-up priced at one draft step.
        invest_margin: how many times its price the draft's deferred prefill must be expected to save before
            it is paid (>= 0; 0: pay it whenever the estimate drafts).
        default_budget: new tokens assumed left when `start` gets no budget (>= 1).

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
        pad_verify: bool = False,
        probe_budget: float = 0.01,
        probe_allowance: float = 1.0,
        draft_forward_s: Mapping[int, float] | None = None,
        invest_margin: float = 2.0,
        default_budget: int = 128,
    ) -> None:
        self.max_k = check_k(max_k, "max_k")
        if draft_step_s is None or not isinstance(target_forward_s, Mapping):
            raise ValueError("the cost policy needs draft_step_s (seconds) and target_forward_s {n: seconds}")
        # validates all three; n = 1 required
        self.curve = CostCurve(target_forward_s, draft_step_s, draft_forward_s or None)
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
        self.probe_k = None if probe_k is None else min(check_k(probe_k, "probe_k"), self.max_k)
        self.max_backoff = check_k(max_backoff, "max_backoff")
        self.forget_prior = bool(forget_prior)
        if not (math.isfinite(float(explore_z)) and float(explore_z) >= 0.0):
            raise ValueError(f"explore_z must be finite and >= 0, got {explore_z}")
        self.explore_z = float(explore_z)

        # Round cost in seconds for K = 0..max_k, fixed for the policy's life (specdec.core.costs' one rule
        # for forwards longer than the measured curve).
        self.c = self.curve.c  # Leviathan's c (dimensionless)
        self.pad_verify = bool(pad_verify)
        self.round_cost_s = [self.curve.round_s(k, padded=self.pad_verify) for k in range(self.max_k + 1)]
        # The K whose round can beat plain decoding at all (alpha = 1, no catch-up beyond one token): no
        # other K is ever chosen or probed, and with none the policy is target-only from the start.
        self.viable_ks = tuple(
            k for k in range(1, self.max_k + 1) if (k + 1) / self.round_cost_s[k] > 1.0 / self.round_cost_s[0]
        )
        self.speculation_can_win = bool(self.viable_ks)
        if math.isnan(float(probe_budget)) or float(probe_budget) <= 0.0:
            raise ValueError(f"probe_budget must be a fraction > 0 (inf: no ledger), got {probe_budget}")
        self.probe_budget = float(probe_budget)
        if not (math.isfinite(float(probe_allowance)) and float(probe_allowance) >= 0.0):
            raise ValueError(f"probe_allowance must be finite and >= 0 target steps, got {probe_allowance}")
        self.probe_allowance = float(probe_allowance)
        if not (math.isfinite(float(invest_margin)) and float(invest_margin) >= 0.0):
            raise ValueError(f"invest_margin must be finite and >= 0, got {invest_margin}")
        self.invest_margin = float(invest_margin)
        if int(default_budget) < 1:
            raise ValueError(f"default_budget must be >= 1 token, got {default_budget}")
        self.default_budget = int(default_budget)
        self._cost_cache: dict[tuple[int, int], float] = {}
        self.start()

    @property
    def target_only(self) -> bool:
        """True when no K can pay on the priced curve: every round is a plain target step, with no probe."""
        return not self.speculation_can_win

    def round_steps(self, k: int, pending: int = 1) -> float:
        """A round of K drafts, priced in target steps (`CostCurve.round_s` / one step), with the draft's
        catch-up over `pending` uncached tokens."""
        key = (int(k), int(pending))
        if key not in self._cost_cache:
            s = self.curve.round_s(int(k), padded=self.pad_verify, pending=max(1, int(pending)))
            self._cost_cache[key] = s / self.round_cost_s[0]
        return self._cost_cache[key]

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
            costs = {"draft_step_s": costs.draft_step_s, "target_forward_s": costs.target_forward_s,
                     "draft_forward_s": costs.draft_forward_s}
        if costs.get("draft_forward_s") and "draft_forward_s" not in kw:
            kw = {**kw, "draft_forward_s": costs["draft_forward_s"]}
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

    def start(self, prefill_tokens: int | None = None, budget: int | None = None) -> None:
        """A new generation: the estimate back to the prior, an empty ledger. `prefill_tokens`: the prompt
        tokens the draft's deferred prefill feeds in its first drafting round (None: none to pay, the first
        catch-up is one token); `budget`: new tokens asked for (None: `default_budget`)."""
        if prefill_tokens is not None and int(prefill_tokens) < 0:
            raise ValueError(f"prefill_tokens must be >= 0, got {prefill_tokens}")
        if budget is not None and int(budget) < 0:
            raise ValueError(f"budget must be >= 0 tokens, got {budget}")
        self._succ = 0.0  # decayed accepted draft tokens
        self._fail = 0.0  # decayed rejections
        self._prior_w = self.prior_weight  # the prior's weight now (decays with the data if forget_prior)
        self._plain = 0  # consecutive plain (K = 0) decisions since the last probe / speculative round
        self._last_alpha = self.current_alpha()
        self._last_k: int | None = None
        self._last_tokens: float | None = None
        # tokens the draft's next catch-up forward feeds (`specdec.engine.traces.draft_pending`): the whole prompt
        # while its prefill is deferred
        self._pending = max(1, int(prefill_tokens)) if prefill_tokens is not None else 1
        self._prefill_due = prefill_tokens is not None and self.catch_up_steps() > (self.c or 0.0)
        self._left = int(budget) if budget is not None else self.default_budget  # new tokens still to come
        self.declined = 0  # rounds kept plain because the draft's prefill would not pay back
        #: the never-lose ledger, in seconds (one target step is ``round_cost_s[0]``)
        self.ledger = Ledger(self.probe_budget, self.probe_allowance * self.round_cost_s[0])
        self.probes = 0  # probes taken in this generation

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
        """The K in 0 and `viable_ks` maximising predicted tokens per second (ties -> smaller K; a K outside
        `viable_ks` never beats K = 0 at any alpha)."""
        rates = self.tokens_per_s(alpha)
        best = 0
        for k in self.viable_ks:
            if rates[k] > rates[best]:
                best = k
        return best

    # -- the protocol ----------------------------------------------------------------------------------

    def probe_plan(self, alpha: float) -> tuple[int, int]:
        """``(K, N)``: the K a probe asks for at acceptance `alpha` (tokens; the viable K with the highest
        predicted rate, or `probe_k`), and the plain rounds N before it:
        the fewest that keep the probe's expected overhead within `probe_overhead`: a probe costs
        ``R = round_cost_s[K] / round_cost_s[0]`` plain steps for ``E = E(alpha, K)`` tokens, so N plain rounds
        and one probe lose ``(R - E) / (N + E)``, and ``N = ceil((R - E) / probe_overhead - E)`` clamped to
        ``1..max_backoff``."""
        rates = self.tokens_per_s(alpha)
        if self.probe_k is not None:
            k = self.probe_k
        else:
            ks = self.viable_ks or (1,)
            k = ks[0]
            for j in ks[1:]:
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

    def trials(self) -> float:
        """The decayed acceptance trials behind the estimate, ``n = w + S + F`` (the prior's remaining weight
        plus decayed accepted tokens and rejections)."""
        return self._prior_w + self._succ + self._fail

    def upper_alpha(self) -> float:
        """The estimate plus `explore_z` standard deviations of a Beta posterior with the decayed counts
        (``n = trials()``): ``a + z * sqrt(a (1 - a) / (n + 1))``, capped at 1."""
        a = self.current_alpha()
        n = self.trials()
        return min(1.0, a + self.explore_z * math.sqrt(a * (1.0 - a) / (n + 1.0)))

    def probe_loss(self, k: int, alpha: float) -> float:
        """Expected loss of a probe of K drafts now at acceptance `alpha`, in target steps: its priced cost
        (with the draft's current catch-up) minus the tokens it is expected to commit, E(alpha, K)."""
        return self.round_steps(k, self._pending) - expected_tokens_per_round(alpha, k)

    def catch_up_steps(self) -> float:
        """What the draft's next catch-up costs beyond one draft step, in target steps (>= 0; 0 for a free
        drafter): ``(draft_forward(pending) - draft_step) / target_step``."""
        extra = self.curve.draft_forward(self._pending) - self.draft_step_s
        return max(0.0, extra) / self.round_cost_s[0]

    def invest_pays(self, k: int, alpha: float) -> bool:
        """Whether paying the draft's deferred prefill now (`catch_up_steps`, F) for rounds of K drafts is
        expected to pay back `invest_margin` times over the tokens left: ``left x (1 - round_steps(K) /
        E(alpha, K)) >= invest_margin x F`` (target steps; E from Leviathan et al. 2023, Thm. 3.8)."""
        if k <= 0:
            return False
        saved = max(0, self._left) * (1.0 - self.round_steps(k) / expected_tokens_per_round(alpha, k))
        return saved >= self.invest_margin * self.catch_up_steps()

    @property
    def invested(self) -> float:
        """Target steps of the draft's deferred prefill paid in this generation (they raise the ledger's
        allowance)."""
        return self.ledger.invested_s / self.round_cost_s[0]

    def net_loss(self) -> float:
        """The ledger's net loss of speculation so far, in target steps (`specdec.policies.ledger.Ledger`: each
        speculative round's priced cost minus the tokens it committed, or, once `Ledger.MEASURED_PLAIN_ROUNDS`
        plain rounds were timed, the larger of it and the measured one). The measured form catches a
        verification dearer in the decoding loop than in the calibration (rounds replayed from traces carry no
        times and keep the priced form); it counts the draft's deferred prefill at its price, as the allowance
        does."""
        return self.ledger.net_loss() / self.round_cost_s[0]

    def probe_affordable(self, k: int, alpha: float) -> bool:
        """Whether a round of K drafts fits the ledger: `net_loss()` + `probe_loss(k, alpha)` <=
        `probe_allowance` + the prefill invested (`invested`, and this round's when it pays it) +
        `probe_budget` x (priced time so far + the round's cost)."""
        t1 = self.round_cost_s[0]
        paying = self.catch_up_steps() if self._prefill_due else 0.0
        return self.ledger.allows(self.probe_loss(k, alpha) * t1, self.round_steps(k, self._pending) * t1,
                                  paying * t1)

    def next_k(self) -> int:
        a = self.current_alpha()
        k = self.best_k(a)
        if k > 0 and self._prefill_due and not self.invest_pays(k, a):
            k = 0  # the draft's prefill would not pay back over the tokens left: decode plainly
            self.declined += 1
        if k > 0 and not self.probe_affordable(k, a):
            k = 0  # the ledger: speculation has lost more than it may; decode plainly (probes may follow)
        if k == 0 and self.speculation_can_win and not self._prefill_due:
            pa = self._probe_alpha()
            probe_k, wait = self.probe_plan(pa)
            explore = self.explore_z > 0.0 and self.best_k(self.upper_alpha()) > 0
            if (explore or self._plain >= wait) and self.probe_affordable(probe_k, a):
                k = probe_k
                self.probes += 1
        if k == 0:
            self._plain += 1
        else:
            self._plain = 0
        self._last_alpha = a
        self._last_k = k
        self._last_tokens = self.tokens_per_s(a)[k] * self.round_cost_s[k]
        return k

    def note(self) -> str:
        """One line for the run's record (``runs.policy_note``): target-only from the start, or the probes."""
        if self.target_only:
            return ("target-only: no K can pay on the measured curve (v(K+1) + K c >= K + 1 for every K), "
                    "0 probes")
        note = f"{self.probes} probes"
        if self.invested > 0.0:
            note += f", draft prefill paid ({self.invested:.1f} target steps)"
        elif self.declined:
            note += (f", draft prefill declined ({self.catch_up_steps():.1f} target steps would not pay back "
                     "at the estimate)")
        return note

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
        t1 = self.round_cost_s[0]
        cost = self.round_steps(record.k, self._pending)
        self._left -= record.num_emitted
        paid = 0.0
        if record.k > 0 and self._prefill_due:
            paid = self.catch_up_steps()  # the deferred prefill, paid in this round: sunk from now on
            self.ledger.invest(paid * t1)
            self._prefill_due = False
        measured = record.draft_s + record.verify_s + record.other_s
        if record.k > 0:
            # the prefill's measured seconds leave the measured ledger, which counts it at its price
            catch_up = max(0.0, record.draft_s - record.k * self.draft_step_s) if paid else 0.0
            self.ledger.speculative(cost * t1, record.num_emitted * t1, max(0.0, measured - catch_up),
                                    investment_s=paid * t1)
            full = record.num_accepted >= record.k and not record.draft_stopped
            self._pending = 2 if full else 1
        else:
            self.ledger.plain(cost * t1, measured)
            self._pending += 1
        if record.k > 0:
            self._succ = self.decay * self._succ + record.num_accepted
            self._fail = self.decay * self._fail + (1.0 if record.rejected else 0.0)
            if self.forget_prior:
                self._prior_w *= self.decay
