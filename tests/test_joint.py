"""Issue 17: the joint law of several tokens under speculative sampling, tested statistically.

`stochastic_verify` is a pure function; here it runs the whole speculative loop over a small synthetic
"language model" whose next-token distributions depend on the context, so a round's K + 1 target rows and
K draft rows all differ (as in a real model), and a bug that only shows in later positions (row offsets,
a q of the wrong position, the bonus row) changes the joint law of the first three tokens.

Test: Pearson's chi-square of the empirical joint of (x1, x2, x3) against the exact target law
p(x1) p(x2 | x1) p(x3 | x1, x2), 27 cells (df = 26), at significance alpha = 0.001 (critical value
chi2.ppf(0.999, 26) = 54.05). The seed is fixed, so the test is deterministic; alpha is the chance that a
correct implementation fails it for a random seed (observed: 18.7). Negative controls: the same test on two classic faults
(recovered token drawn from p instead of norm(max(0, p - q)); draft tokens drawn from a q other than the one
reported) must exceed the critical value.
"""

from __future__ import annotations

import functools
import itertools

import torch

import specdec.core.verification as ver
from specdec.core.verification import stochastic_verify

VOCAB = 3
K = 3
N_DRAWS = 30_000
CHI2_CRIT_DF26_A001 = 54.05  # scipy.stats.chi2.ppf(0.999, 26)


def _dist(seed: int, ctx: tuple[int, ...]) -> torch.Tensor:
    """A context-dependent distribution over VOCAB tokens (a function of the last two), entries in about
    [0.1, 0.7]."""
    return _table(seed, tuple(ctx[-2:]))


@functools.cache
def _table(seed: int, key: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + sum((t + 1) * 10**i for i, t in enumerate(key)))
    w = torch.rand(VOCAB, generator=g) + 0.25
    return w / w.sum()


def p_of(ctx):  # the target
    return _dist(1, tuple(ctx))


def q_of(ctx):  # the draft: another context-dependent law, far enough from p for frequent rejections
    return _dist(2, tuple(ctx))


def run_first_three(generator, *, q_sampled=q_of) -> tuple[int, int, int]:
    """Speculative rounds of K = 3 from an empty context until three tokens are out; returns them."""
    out: list[int] = []
    while len(out) < 3:
        draft, qs = [], []
        for _ in range(K):
            q_rep = q_of(out + draft)
            t = int(torch.multinomial(q_sampled(out + draft), 1, generator=generator))
            draft.append(t)
            qs.append(q_rep)
        target = torch.stack([p_of(out + draft[:i]) for i in range(K + 1)])
        verdict = stochastic_verify(draft, torch.stack(qs), target, generator)
        out.extend(verdict.committed_tokens(draft))
    return tuple(out[:3])


def chi_square(sampler, n_draws: int = N_DRAWS) -> float:
    g = torch.Generator().manual_seed(1234)
    counts = dict.fromkeys(itertools.product(range(VOCAB), repeat=3), 0)
    for _ in range(n_draws):
        counts[sampler(g)] += 1
    stat = 0.0
    for (a, b, c), n in counts.items():
        expected = n_draws * float(p_of([])[a] * p_of([a])[b] * p_of([a, b])[c])
        stat += (n - expected) ** 2 / expected
    return stat


def test_k3_joint_law_of_three_tokens_is_the_targets():
    stat = chi_square(run_first_three)
    print(f"chi2 = {stat:.1f} (df 26, critical {CHI2_CRIT_DF26_A001} at alpha 0.001)")
    assert stat < CHI2_CRIT_DF26_A001, stat


def test_negative_control_recovered_token_from_p(monkeypatch):
    """The C8 fault (recovered token drawn from p, not norm(max(0, p - q))) is rejected by the same test."""
    monkeypatch.setattr(ver, "residual", lambda p, q: p)
    stat = chi_square(run_first_three, 5000)  # a control needs fewer draws: its statistic grows with them
    print(f"chi2 = {stat:.1f}")
    assert stat > CHI2_CRIT_DF26_A001, stat


def test_negative_control_q_not_the_sampled_distribution():
    """The C7 fault (drafts drawn from one q, another reported) is rejected by the same test."""
    stat = chi_square(lambda g: run_first_three(g, q_sampled=lambda ctx: _dist(3, tuple(ctx))), 5000)
    print(f"chi2 = {stat:.1f}")
    assert stat > CHI2_CRIT_DF26_A001, stat
