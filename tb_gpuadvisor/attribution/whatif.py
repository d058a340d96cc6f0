"""One what-if per cause, and the savings of a session's findings made to add up.

Each check with a time model declares its fix as a replay scenario (``Replayed`` in
checks/base.py); its ``estimated_savings_ms_per_step`` is the replayed gain of that
scenario (see replay.py).
``reconcile`` then turns standalone gains into shares of one combined prediction:
taken in rank order, each finding keeps only what it adds to the fixes ranked above
it, so two findings never claim the same time (precision and tensor_core describe one
fix) and the savings of a session add up to at most its mean step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.attribution.breakdown import Breakdown
from tb_gpuadvisor.attribution.replay import Replay, Scenario
from tb_gpuadvisor.timeline import PS_PER_US, SessionModel

# Launch call cost assumed when the capture records no launch calls: the median the corpus
# captures measure (7-14 us), not the 20-40 us often quoted.
DEFAULT_LAUNCH_US = 10.0


def launch_cost_us(model: SessionModel) -> tuple[float, bool]:
    """Median duration of the capture's own launch calls, and whether it was measured."""
    median_ps = model.launch_median_ps
    return (DEFAULT_LAUNCH_US, False) if median_ps is None else (median_ps / PS_PER_US, True)


class Savings(ABC):
    """What a session's fixes gain, alone and together, and their savings made to add up.

    ``checks`` are the causes with a time model; a subclass says how fixes combine: one
    session's replay (WhatIf), or the hosts of a many-host session joined (multihost.merge).
    """

    checks: frozenset[str]
    mean_step_ms: float

    @abstractmethod
    def combined_ms(self, check_ids: list[str]) -> float:
        """The gain of several checks' fixes applied together, ms per step."""

    def saving_ms(self, check_id: str) -> float:
        """The standalone gain of the check's fix, ms per step (0 when it has no time model)."""
        return self.combined_ms([check_id])

    def reconcile(self, ranked: list[tuple[str, float]]) -> list[float]:
        """Savings for findings (check id, standalone saving) in rank order, made disjoint.

        A replayed finding keeps what its fix adds to the replayed fixes ranked above it;
        one without a time model keeps its own estimate, capped by what is left of the
        step. The results add up to at most the mean step.
        """
        out: list[float] = []
        replayed: list[str] = []
        gained = 0.0        # combined gain of the replayed fixes so far
        for check_id, saving in ranked:
            share = max(0.0, saving)
            if check_id in self.checks and saving > 0:
                combined = self.combined_ms(replayed + [check_id])
                share = max(0.0, combined - gained)
                replayed.append(check_id)
                gained = combined
            out.append(min(share, max(0.0, self.mean_step_ms - sum(out))))
        return out


@dataclass
class WhatIf(Savings):
    """The replay of a session and the scenario of every check."""

    replay: Replay
    scenarios: dict[str, Scenario]
    mean_step_ms: float

    @classmethod
    def build(cls, model: SessionModel, breakdown: Breakdown, scenarios: dict[str, Scenario]) -> "WhatIf":
        """SCENARIOS: the checks' declared scenarios for this capture, by check id."""
        steps = breakdown.steps
        mean = float(np.mean(steps.duration_ps)) / 1e9 if len(steps) else 0.0
        return cls(Replay(model, breakdown), scenarios, mean)

    @property
    def checks(self) -> frozenset[str]:     # type: ignore[override]
        return frozenset(self.scenarios)

    def combined_ms(self, check_ids: list[str]) -> float:
        known = [self.scenarios[c] for c in check_ids if c in self.scenarios]
        if not known:
            return 0.0
        total = known[0]
        for scenario in known[1:]:
            total = total + scenario
        return self.replay.gain_ms(total)
