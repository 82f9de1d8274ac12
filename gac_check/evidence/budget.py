"""The stages' time budgets: what each stage may spend of ``--minutes``, and its clock.

Each stage has a share of the total (:data:`SHARES`); its deadline is the run's start plus
the shares of every stage up to and including it, so a stage that finishes early leaves its
time to the next and the run never passes ``--minutes`` by more than one step of the stage
that is running when its deadline passes (a chunk of a sweep, a form's preparation, a test).
How the shares were sized for eight minutes on an H100: docs/measuring.md.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

#: Stage name -> share of the total. At --minutes 8: 168, 106, 120, 48 and 38 seconds
#: (sized in docs/measuring.md, "GPU evidence in one call", from the first H200 run: the
#: suites needed 83 s whole, slow paths 16 s and the report 9 s of their shares).
SHARES = {"baseline": 0.35, "suites": 0.22, "latency": 0.25, "slowpaths": 0.10,
          "report": 0.08}
STOPPED = "stopped at budget"


@dataclass
class StageClock:
    """One stage's deadline, and what the stage says about how it ended."""

    name: str
    budget_s: float
    deadline: float  # time.monotonic()
    started: float = field(default_factory=time.monotonic)
    stopped: bool = False  # set by the stage when it left work undone for lack of time

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def expired(self) -> bool:
        if self.left() <= 0:
            self.stopped = True
            return True
        return False

    def summary(self) -> dict:
        return {"budget_s": round(self.budget_s, 1),
                "spent_s": round(time.monotonic() - self.started, 1),
                "status": STOPPED if self.stopped else "complete"}


class Budget:
    """The run's clock: ``stage(name)`` opens the next stage's :class:`StageClock`."""

    def __init__(self, minutes: float, stages: tuple[str, ...] = tuple(SHARES)) -> None:
        self.total_s = minutes * 60.0
        self.start = time.monotonic()
        # a run of some stages shares the whole budget among them, in the same proportions
        whole = sum(SHARES[name] for name in stages)
        self._shares = {name: SHARES[name] / whole for name in SHARES if name in stages}
        self._ends: dict[str, float] = {}
        cumulative = 0.0
        for name, share in self._shares.items():
            cumulative += share * self.total_s
            self._ends[name] = cumulative

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(self._shares)

    def seconds(self, name: str) -> float:
        return self._shares[name] * self.total_s

    def stage(self, name: str) -> StageClock:
        return StageClock(name, self.seconds(name), self.start + self._ends[name])
