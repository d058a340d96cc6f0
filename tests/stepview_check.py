"""The test suite's check that a step's drawn marks agree with the findings' numbers (issue 43):
shared by the stepview tests and the demo's."""

from __future__ import annotations

import numpy as np

from tb_gpuadvisor import stepview
from tb_gpuadvisor.pipeline import Analysed


def disagreements(analysed: Analysed) -> list[str]:
    """Per finding with marks: the drawn intervals of every step add up to the attribution's own
    per-step time of its causes (``DeviceBreakdown.part``) within 1 percentage point, and over all
    steps to the finding's number. The problems found, as lines."""
    steps = analysed.analysis.model.steps
    primary = analysed.analysis.breakdown.primary
    drawn: dict[str, float] = {}
    numbers: dict[str, float] = {}
    problems = []
    for index, number in enumerate(steps.number):
        view = analysed.timeline(int(number))
        duration = view["duration_us"]
        for row in view["rows"]:
            assert len(row["start"]) <= stepview.ROW_RECTS
            assert all(0 <= s <= duration + 1e-3 for s in row["start"])
        for mark in view["findings"]:
            if "why" in mark:
                assert mark["why"]
                continue
            share = 100.0 * sum(mark["dur"]) / duration
            attributed = 100.0 * sum(int(primary.part(cause)[index]) for cause in mark["causes"]) / (duration * 1e6)
            if abs(share - attributed) > 1.0 or abs(share - mark["step_percent"]) > 1.0:
                problems.append(f"step {number} {mark['check']}: drawn {share:.2f}% vs {attributed:.2f}% attributed, "
                                f"{mark['step_percent']}% said")
            drawn[mark["check"]] = drawn.get(mark["check"], 0.0) + sum(mark["dur"])
            numbers[mark["check"]] = mark["finding_percent"]
    total_us = float(np.sum(steps.duration_ps)) / 1e6
    for check, marked in drawn.items():
        if abs(100.0 * marked / total_us - numbers[check]) > 1.0:
            problems.append(f"{check}: drawn {100.0 * marked / total_us:.2f}% of all steps vs {numbers[check]}%")
    return problems
