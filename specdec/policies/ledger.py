"""The never-lose ledger: what speculation has lost to target-only decoding so far, priced and measured, and
whether a round may risk more. The cost policies keep one per generation (`specdec.policies.cost.CostPolicy`
for one sequence, `specdec.policies.batch_cost.BatchCostPolicy` for a batch; one row is one sequence).

Every amount is in seconds. A round is settled into the ledger after it ran: a plain round (K = 0) at its
priced time (one plain step of every row), a speculative round at its priced time minus the plain time of
the tokens it committed (its net loss; a round that won refunds). Once `MEASURED_PLAIN_ROUNDS` plain rounds
carry wall-clock seconds, the net loss is the larger of the priced one and the measured one: the speculative
rounds' measured seconds brought to the priced scale by the plain rounds' median measured/priced ratio, minus
the plain time of their tokens. So a verification dearer in the decoding loop than in the calibration stops
speculation the curve alone would keep. An investment (the draft's deferred prefill, or a catch-up dearer
than a draft step) raises what may be lost by its price.

A round fits (`allows`) while the net loss so far plus the round's expected loss stays within the allowance
plus the investments plus `budget` of the priced time so far and the round's own.
"""

from __future__ import annotations

import math
import statistics

__all__ = ["Ledger"]


class Ledger:
    """One generation's never-lose ledger (module docstring).

    Args:
        budget: the net loss allowed as a fraction of the priced time (> 0; ``math.inf``: no ledger).
        allowance_s: seconds of net loss allowed before any time has passed (>= 0).

    Raises:
        ValueError: a budget that is not > 0 or an allowance below 0.
    """

    #: Timed plain rounds before measured times enter the ledger.
    MEASURED_PLAIN_ROUNDS = 3
    #: Measured ratios kept (the latest ones).
    WINDOW = 32

    def __init__(self, budget: float, allowance_s: float) -> None:
        if math.isnan(float(budget)) or float(budget) <= 0.0:
            raise ValueError(f"the ledger's budget must be a fraction > 0 (inf: no ledger), got {budget}")
        if not (math.isfinite(float(allowance_s)) and float(allowance_s) >= 0.0):
            raise ValueError(f"the ledger's allowance must be finite and >= 0 s, got {allowance_s}")
        self.budget, self.allowance_s = float(budget), float(allowance_s)
        self.elapsed_s = 0.0  # priced seconds of every settled round
        self.invested_s = 0.0  # investments at their price
        self._net_loss = 0.0  # priced seconds of speculative rounds minus the plain time of their tokens
        self._plain_ratio: list[float] = []  # measured / priced seconds of the latest timed plain rounds
        self._spec_ratio: list[float] = []  # the same for speculative rounds
        self._spec_measured_s = 0.0  # measured seconds of the timed speculative rounds
        self._spec_plain_s = 0.0  # plain seconds of the tokens those rounds committed
        self._priced_investment_s = 0.0  # investments whose measured seconds the caller left out

    @property
    def unlimited(self) -> bool:
        """No ledger: every round fits."""
        return math.isinf(self.budget)

    def plain(self, priced_s: float, measured_s: float = 0.0) -> None:
        """Settle a plain round: `priced_s` on the curve, `measured_s` on the clock (0: not timed)."""
        self.elapsed_s += priced_s
        if measured_s > 0.0 and priced_s > 0.0:
            self._plain_ratio = [*self._plain_ratio[-(self.WINDOW - 1):], measured_s / priced_s]

    def speculative(self, priced_s: float, plain_s: float, measured_s: float = 0.0, *,
                    investment_s: float = 0.0) -> None:
        """Settle a speculative round: `priced_s` on the curve, `plain_s` the plain time of the tokens it
        committed, `measured_s` on the clock (0: not timed). `investment_s`: the price of an investment made in
        this round whose measured seconds `measured_s` leaves out (it counts at its price instead)."""
        self.elapsed_s += priced_s
        self._net_loss += priced_s - plain_s
        if measured_s > 0.0:
            if priced_s > 0.0:
                self._spec_ratio = [*self._spec_ratio[-(self.WINDOW - 1):], measured_s / priced_s]
            self._spec_measured_s += measured_s
            self._spec_plain_s += plain_s
            self._priced_investment_s += investment_s

    def invest(self, price_s: float) -> None:
        """An investment made: it raises what may be lost by `price_s`."""
        self.invested_s += price_s

    @property
    def priced_loss_s(self) -> float:
        """The priced net loss alone (seconds): speculative rounds' priced time minus their tokens' plain time."""
        return self._net_loss

    def measured(self) -> bool:
        """Whether enough plain rounds were timed for the measured form."""
        return len(self._plain_ratio) >= self.MEASURED_PLAIN_ROUNDS

    def net_loss(self) -> float:
        """Speculation's net loss so far in seconds: the priced one, or (`measured`) the larger of it and the
        measured one."""
        if not self.measured():
            return self._net_loss
        rho = statistics.median(self._plain_ratio)
        return max(self._net_loss, self._spec_measured_s / rho + self._priced_investment_s - self._spec_plain_s)

    def overhead(self) -> float:
        """How many times its curve price a speculative round costs in the decoding loop, relative to a plain
        round: the median measured/priced ratio of the speculative rounds over the plain rounds' (>= 1; 1 before
        `measured` and a timed speculative round)."""
        if not self.measured() or not self._spec_ratio:
            return 1.0
        return max(1.0, statistics.median(self._spec_ratio) / statistics.median(self._plain_ratio))

    def allows(self, loss_s: float, round_s: float, paying_s: float = 0.0, *, allowance_s: float | None = None) -> bool:
        """Whether a round expected to lose `loss_s` seconds (costing `round_s` priced, of which `paying_s` is
        an investment paid in it) fits: ``net_loss + loss <= allowance + invested + paying + budget x (elapsed
        + round)``; `allowance_s` replaces the ledger's allowance for this round (a batch's, which follows its
        live rows' plain step)."""
        if self.unlimited:
            return True
        allowance = self.allowance_s if allowance_s is None else allowance_s
        allowed = allowance + self.invested_s + paying_s + self.budget * (self.elapsed_s + round_s)
        return self.net_loss() + loss_s <= allowed
