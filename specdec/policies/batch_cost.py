"""The batch cost policy: one K per round for a batch of rows, from per-row acceptance estimates and the
batch's measured cost curve, under the never-lose ledger (`BatchCostPolicy`; its rules are
`specdec.policies.cost.CostPolicy`'s for a batch)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from specdec.policies.base import RoundPlan
from specdec.policies.batch import batch_committed, best_batch_k
from specdec.policies.ledger import Ledger

__all__ = ["BatchCostPolicy"]


class BatchCostPolicy:
    """K from the batch's priced rate with a decayed per-row acceptance estimate, never losing more than a
    bounded amount to batched target-only decoding.

    Each round over the B live rows it takes the K in ``0..max_k`` maximising expected committed tokens per
    second, ``sum_i E(a_i, K) / (target_cost(B (K + 1)) + draft_cost(B, K))`` (`best_batch_k`; K = 0 is one
    plain step per row), where row i's estimate is ``(w * prior_alpha + S_i) / (w + S_i + F_i)``, after each
    of its rounds with K > 0 ``S_i <- decay * S_i + accepted`` and ``F_i <- decay * F_i + rejected`` (the
    alpha-hat of `specdec.core.metrics`, decayed). Rounds with K = 0 carry no evidence. A free drafter (prompt
    lookup, suffix) says before the round how many tokens each row has to draft (``next_k``'s `available`,
    from `specdec.drafters.base.PerRowDrafters.preview`): row i then commits ``E(a_i, min(K, available_i))``, a row
    without a match exactly 1 token, and a round where no row has a match is plain. So the estimate is the
    acceptance of a drafted token, and the batch drafts only when rows that can draft pay for the rows that
    cannot. Without `available`, a row that drafted nothing in a round with K > 0 is *dry*: it is expected to
    commit 1 token (alpha 0) until it drafts again or a plain round passes.

    So that speculation never loses more than a bounded amount (the batch form of
    `specdec.policies.cost.CostPolicy`'s rules):

    - **the draft's catch-up is priced.** With a draft model (`draft_cost` given) the draft caches nothing
      before a row's first drafting round (`specdec.drafters.model.BatchedModelDrafter` defers its prefill), so
      that round feeds the row's whole context (`start`'s ``context_lens``) and every token committed since;
      later rounds feed 1 or 2 tokens per row, more after plain rounds. A catch-up of P tokens over the
      batch costs ``c_B (target_cost(P) - target_cost(B))`` more than the draft step `draft_cost` prices,
      ``c_B = draft_cost(B, 1) / target_cost(B)`` (the draft's cost relative to the target's at one token
      per row).
    - **a catch-up is an investment.** It is made only when the time the chosen K is expected to save over
      the rows' remaining budgets (``sum_i remaining_i x (target_cost(B) / B - round / sum_i E(a_i, K))``)
      is at least `invest_margin` times its price; otherwise the round is plain (so a batch that never
      drafts never runs the draft model).
    - **optimism before going plain.** When the estimate says K = 0 but the rows' estimates plus
      `explore_z` standard deviations (`upper_alpha`) would draft, and the draft's catch-up costs no more
      than a step, the round drafts at that K (a probe, `probes`): one unlucky round after the prefill was
      paid must not end speculation for the batch.
    - **a ledger.** A speculative round is taken only while the net loss of the speculative rounds so far
      (each one's priced cost, catch-up included, minus the plain-decoding time of the tokens it committed,
      ``tokens x target_cost(B) / B``) plus the round's expected loss at the estimate stays within
      ``probe_allowance`` plain steps (at most `allowance_fraction` of the longest budget) plus the
      investments made plus ``probe_budget`` of the priced time so far. While a row's estimate rests on
      fewer than `PROBE_EVIDENCE` trials, or for a probe, while nothing was invested in the draft, the
      round is priced as if every draft failed, and K is shortened until that worst case fits. A round is
      priced at its widest row's shape, B x max_i(K_i + 1): an upper bound on a ragged round (llama.cpp
      runs one pass per token depth, or pads).
    - **measured rounds.** Rounds carry their wall-clock seconds (`RoundRecord` draft_s + verify_s +
      other_s). Once `MEASURED_PLAIN_ROUNDS` plain rounds are timed, the ledger's net loss is the larger of
      the priced one and the measured one (the speculative rounds' measured seconds, brought to the priced
      scale by the median measured/priced ratio of the plain rounds, minus the plain time of their tokens),
      and speculative rounds are priced ``overhead()`` times their curve price: the median measured/priced
      ratio of the speculative rounds over that of the plain rounds (at least 1). So a round dearer in the
      decoding loop than in the calibration (logits of every verified position, per-row verification,
      cache trimming) stops speculation that the curve alone would keep. A timed batch opens with
      `reference_rounds` plain rounds so that the reference exists before the first speculative round.

    Args:
        target_cost: seconds of one target forward over n tokens in total (e.g. a measured
            `specdec.core.costs.CostCurve`'s ``forward_s``).
        max_k: largest K (>= 1).
        draft_cost: ``draft_cost(B, K)`` seconds of drafting K tokens for B rows (one draft step per token,
            the catch-up of 1 token per row included), None for free drafting (prompt lookup, suffix).
        prior_alpha, prior_weight, decay: the estimate's prior (in [0, 1]), its weight in pseudo-trials
            (>= 0) and the per-round decay in (0, 1].
        probe_budget: the net loss allowed as a fraction of the priced time (> 0; ``math.inf``: no ledger).
        probe_allowance: plain batch steps of net loss allowed before any time has passed (>= 0).
        invest_margin: how many times its price a catch-up must be expected to save (>= 0; 0: always make
            it).
        default_budget: new tokens assumed left per row when `start` gets no budgets (>= 1).
        explore_z: standard deviations of optimism before going plain (>= 0; 0: decide at the estimate).
        allowance_fraction: the allowance is at most this fraction of the longest budget, in plain steps
            (>= 0).
        reference_rounds: plain rounds a timed batch (`start`'s ``timed``) opens with, so that the measured
            ledger has its reference from the start (>= 0).

    Raises:
        ValueError: a parameter out of range.
    """

    def __init__(self, target_cost: Callable[[int], float], max_k: int = 8, *,
                 draft_cost: Callable[[int, int], float] | None = None, prior_alpha: float = 0.6,
                 prior_weight: float = 2.0, decay: float = 0.8, probe_budget: float = 0.01,
                 probe_allowance: float = 1.0, invest_margin: float = 2.0, default_budget: int = 128,
                 explore_z: float = 1.0, allowance_fraction: float = 0.01, reference_rounds: int = 3) -> None:
        if int(max_k) < 1:
            raise ValueError(f"max_k must be >= 1, got {max_k}")
        if not 0.0 <= prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha must be in [0, 1], got {prior_alpha}")
        if not (math.isfinite(prior_weight) and prior_weight >= 0.0):
            raise ValueError(f"prior_weight must be finite and >= 0, got {prior_weight}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if math.isnan(probe_budget) or probe_budget <= 0.0:
            raise ValueError(f"probe_budget must be a fraction > 0 (inf: no ledger), got {probe_budget}")
        if not (math.isfinite(probe_allowance) and probe_allowance >= 0.0):
            raise ValueError(f"probe_allowance must be finite and >= 0 plain steps, got {probe_allowance}")
        if not (math.isfinite(invest_margin) and invest_margin >= 0.0):
            raise ValueError(f"invest_margin must be finite and >= 0, got {invest_margin}")
        if int(default_budget) < 1:
            raise ValueError(f"default_budget must be >= 1 token, got {default_budget}")
        if not (math.isfinite(explore_z) and explore_z >= 0.0):
            raise ValueError(f"explore_z must be finite and >= 0, got {explore_z}")
        self.target_cost = target_cost
        self.draft_cost = draft_cost
        self.max_k = int(max_k)
        self.prior_alpha, self.prior_weight, self.decay = float(prior_alpha), float(prior_weight), float(decay)
        self.probe_budget, self.probe_allowance = float(probe_budget), float(probe_allowance)
        self.invest_margin, self.default_budget = float(invest_margin), int(default_budget)
        self.explore_z = float(explore_z)
        if not (math.isfinite(allowance_fraction) and allowance_fraction >= 0.0):
            raise ValueError(f"allowance_fraction must be finite and >= 0, got {allowance_fraction}")
        self.allowance_fraction = float(allowance_fraction)
        if int(reference_rounds) < 0:
            raise ValueError(f"reference_rounds must be >= 0, got {reference_rounds}")
        self.reference_rounds = int(reference_rounds)
        self.start(0)

    def start(self, n_rows: int, *, context_lens: Sequence[int] | None = None,
              budgets: Sequence[int] | None = None, timed: bool = False) -> None:
        # a timed batch opens with `reference_rounds` plain rounds: the measured reference of the ledger
        self._reference = self.reference_rounds if timed else 0
        self._plain_rounds = 0  # plain rounds settled
        self._succ = [0.0] * n_rows
        self._fail = [0.0] * n_rows
        self._dry = [False] * n_rows  # drafted nothing in the last round with K > 0
        # tokens the draft's next catch-up feeds per row: the whole context before the deferred prefill
        if self.draft_cost is not None and context_lens is not None:
            self._pending = [max(1, int(n)) for n in context_lens]
        else:
            self._pending = [1] * n_rows
        self._left = [int(n) for n in budgets] if budgets is not None else [self.default_budget] * n_rows
        # the ledger's allowance in plain steps: `probe_allowance`, at most `allowance_fraction` of the longest
        # budget (so that a short generation is not allowed a larger share of its time)
        self._allowance_steps = min(self.probe_allowance, self.allowance_fraction * max(self._left, default=0))
        #: the never-lose ledger, in seconds (its allowance follows the live rows' plain step: `next_k`)
        self.ledger = Ledger(self.probe_budget, 0.0)
        self._round: tuple[int, int, float] | None = None  # (K, B, catch-up seconds) of the round in flight
        self._round_tokens = 0  # tokens committed in the round in flight
        self._round_verified = 0  # tokens the target verified in it (sum of K_i + 1)
        self._round_width = 0  # the widest row's K_i + 1 in it
        self._round_measured = 0.0  # measured seconds of the round in flight (0: not timed)
        self.invested_rounds = 0  # catch-ups dearer than a draft step made (the draft's deferred prefill)
        self.probes = 0  # rounds drafted on the optimistic estimate only (`upper_alpha`)
        self.declined = 0  # rounds made plain because a catch-up would not pay or the ledger was spent

    def alpha(self, row: int) -> float:
        """Row `row`'s acceptance estimate in [0, 1]."""
        den = self.trials(row)
        return (self.prior_weight * self.prior_alpha + self._succ[row]) / den if den > 0.0 else self.prior_alpha

    def catch_up_s(self, rows: Sequence[int]) -> float:
        """Priced seconds the draft's next catch-up adds over one draft step, for the live `rows`."""
        if self.draft_cost is None or not rows:
            return 0.0
        b = len(rows)
        p = sum(self._pending[r] for r in rows)
        if p <= b:
            return 0.0
        t1 = float(self.target_cost(b))
        return max(0.0, self._drafting_s(b, 1) / t1 * (float(self.target_cost(p)) - t1))

    def _settle(self) -> None:
        """Price the round in flight (if any) into the ledger and clear its counters."""
        if self._round is None:
            self._round_tokens = self._round_verified = self._round_width = 0
            self._round_measured = 0.0
            return
        k, b, extra = self._round
        t1 = float(self.target_cost(b))
        measured = self._round_measured
        if k == 0:
            self._plain_rounds += 1
            self._dry = [False] * len(self._dry)  # after a plain round every row may have something to draft
            self.ledger.plain(t1, measured)
        else:
            # a ragged round runs at its widest row's shape (llama.cpp: padded, or one pass per token depth)
            n = max(b * self._round_width, self._round_verified, b)
            cost = float(self.target_cost(n)) + self._drafting_s(b, k) + extra
            self.ledger.speculative(cost, self._round_tokens * t1 / b, measured)
        self._round = None
        self._round_tokens = self._round_verified = self._round_width = 0
        self._round_measured = 0.0

    def net_loss(self) -> float:
        """The ledger's net loss of speculation so far, in priced seconds (`specdec.policies.ledger.Ledger`)."""
        return self.ledger.net_loss()

    def overhead(self) -> float:
        """How many times its curve price a speculative round costs in the decoding loop, relative to a plain
        round (`specdec.policies.ledger.Ledger.overhead`)."""
        return self.ledger.overhead()

    def upper_alpha(self, row: int) -> float:
        """Row `row`'s estimate plus `explore_z` standard deviations of a Beta posterior on its trials
        (``n = w + S + F``): ``a + z sqrt(a (1 - a) / (n + 1))``, capped at 1."""
        a = self.alpha(row)
        return min(1.0, a + self.explore_z * math.sqrt(a * (1.0 - a) / (self.trials(row) + 1.0)))

    #: Decayed trials (prior included) a row needs before its estimate, not the worst case, prices the ledger.
    PROBE_EVIDENCE = 3.0

    def expected_alpha(self, row: int) -> float:
        """The acceptance a round's expected gain uses for row `row`: 0 while the row is dry (it commits
        1 token whatever K is), else `alpha`."""
        return 0.0 if self._dry[row] else self.alpha(row)

    def trials(self, row: int) -> float:
        """Row `row`'s acceptance trials behind its estimate, ``w + S + F``."""
        return self.prior_weight + self._succ[row] + self._fail[row]

    def _drafting_s(self, b: int, k: int) -> float:
        """Priced seconds of drafting K tokens for b rows (0 for free drafting)."""
        return float(self.draft_cost(b, k)) if self.draft_cost is not None else 0.0

    def _round_s(self, b: int, k: int) -> float:
        """Priced seconds of a round of K drafts over b rows at the full shape, catch-up aside."""
        return float(self.target_cost(b * (k + 1))) + self._drafting_s(b, k)

    def next_k(self, rows, available=None) -> int:
        self._settle()
        rows = list(rows)
        if not rows:
            return 0
        b = len(rows)
        if available is not None and len(available) != b:
            raise ValueError(f"available must hold one count per live row ({b}), got {len(available)}")
        if self._plain_rounds < self._reference:  # the measured reference first
            self._round = (0, b, 0.0)
            return 0
        # rows' draft caps: what a free drafter has to draft (known), else unlimited with dry rows at alpha 0
        caps = [max(0, int(n)) for n in available] if available is not None else [self.max_k] * b
        known = available is not None
        if max(caps) == 0:  # nothing to draft in any row: a plain round, which costs nothing to decide
            self._round = (0, b, 0.0)
            return 0
        step = self._drafting_s(b, 1)
        extra = self.catch_up_s(rows)
        invest = extra > step  # the deferred prefill, or a catch-up after a plain stretch
        kappa = self.overhead()
        paid = kappa * extra  # the catch-up at the loop's measured overhead (`extra`: its curve price)

        def target_cost(n: int) -> float:  # a speculative round's shape at its measured overhead
            return float(self.target_cost(n)) * (kappa if n > b else 1.0)

        def round_s(k: int) -> float:  # a round of K at the measured overhead, catch-up aside
            return kappa * self._round_s(b, k)

        draft_cost = None if self.draft_cost is None else (lambda bb, kk: kappa * float(self.draft_cost(bb, kk)))
        alphas = [self.alpha(r) if known else self.expected_alpha(r) for r in rows]
        drafting = [r for r, c in zip(rows, caps, strict=True) if c > 0 and (known or not self._dry[r])]
        k = best_batch_k(alphas, target_cost, max_k=self.max_k, draft_cost=draft_cost, caps=caps)
        explore = False
        if k == 0 and self.explore_z > 0.0 and not invest:
            # optimism while the draft is cheap to resume: one unlucky round must not end speculation
            k = best_batch_k([self.upper_alpha(r) if r in drafting else 0.0 for r in rows], target_cost,
                             max_k=self.max_k, draft_cost=draft_cost, caps=caps)
            explore = k > 0
        if k > 0:
            t1 = float(self.target_cost(b))
            if invest:
                left = sum(max(0, self._left[r]) for r in rows)
                saved = left * (t1 / b - round_s(k) / batch_committed(alphas, k, caps))
                if saved < self.invest_margin * paid:
                    k = 0
            if k > 0 and not math.isinf(self.probe_budget):
                # once a prefill was invested in, its rounds are judged at the estimate (abandoning it at the
                # first rejection would waste it)
                # (a row with nothing to draft, or a dry one, is already priced at its worst case, 1 token)
                thin = self.ledger.invested_s == 0.0 and (
                    explore or min((self.trials(r) for r in drafting), default=math.inf) < self.PROBE_EVIDENCE)
                while k > 0:
                    if thin:  # the estimate is the prior or a guess: price the round as if all drafts fail
                        loss = round_s(k) + (0.0 if invest else paid) - t1
                    else:
                        loss = round_s(k) + (0.0 if invest else paid) - batch_committed(alphas, k, caps) * t1 / b
                    if self.ledger.allows(loss, round_s(k) + paid, paid if invest else 0.0,
                                          allowance_s=self._allowance_steps * t1):
                        break
                    k = k - 1 if thin else 0  # a shorter draft risks less
            if k == 0:
                self.declined += 1
            elif invest:
                self.ledger.invest(extra)  # at the curve price, as the ledger counts it
                self.invested_rounds += 1
            elif explore:
                self.probes += 1
        self._round = (k, b, extra if k > 0 else 0.0)  # the ledger prices at the curve (see net_loss)
        return k

    def next_round(self, rows, available=None) -> RoundPlan:
        """`next_k`'s K as the round's plan (no confidence stop)."""
        return RoundPlan(self.next_k(rows, available))

    def alpha_estimate(self, rows) -> float | None:
        return sum(self.alpha(r) for r in rows) / len(rows) if rows else None

    def observe(self, row, record) -> None:
        # the round's wall-clock seconds (one batched round: every row carries the same)
        measured = (record.draft_s or 0.0) + (record.verify_s or 0.0) + (record.other_s or 0.0)
        self._round_measured = max(self._round_measured, measured)
        self._round_tokens += record.num_emitted
        self._round_verified += record.k + 1
        self._round_width = max(self._round_width, record.k + 1)
        self._left[row] -= record.num_emitted
        if self._round is not None and self._round[0] > 0:
            self._dry[row] = record.k <= 0
        if record.k > 0:
            self._pending[row] = 2 if record.num_accepted >= record.k else 1
        else:
            self._pending[row] += record.num_emitted
        if record.k <= 0:
            return
        self._succ[row] = self.decay * self._succ[row] + record.num_accepted
        self._fail[row] = self.decay * self._fail[row] + (1.0 if record.rejected else 0.0)

    def note(self) -> str:
        """One line for the run's record: catch-ups made and rounds declined."""
        return (f"{self.invested_rounds} draft catch-ups over a step made, {self.probes} probes, {self.declined} "
                "rounds declined to plain")
