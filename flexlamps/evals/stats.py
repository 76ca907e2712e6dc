"""HELM's `Stat`: a named running aggregate (count, sum, sum of squares, min, max, mean, variance).

Per-instance stats hold one value each. Run-level stats follow HELM: one value per train trial,
the mean over that trial's instances, so a leaderboard's `sum / count` weighs runs equally.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass
class Stat:
    name: str
    split: str = "test"
    count: int = 0
    sum: float = 0.0
    sum_squared: float = 0.0
    min: Optional[float] = None
    max: Optional[float] = None

    def add(self, x: float) -> "Stat":
        x = float(x)
        self.count += 1
        self.sum += x
        self.sum_squared += x * x
        self.min = x if self.min is None else min(self.min, x)
        self.max = x if self.max is None else max(self.max, x)
        return self

    @property
    def mean(self) -> Optional[float]:
        return self.sum / self.count if self.count else None

    @property
    def variance(self) -> Optional[float]:
        if not self.count:
            return None
        return max(self.sum_squared / self.count - self.mean ** 2, 0.0)

    def to_json(self) -> dict:
        var = self.variance
        return {
            "name": {"name": self.name, "split": self.split},
            "count": self.count,
            "sum": self.sum,
            "sum_squared": self.sum_squared,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "variance": var,
            "stddev": math.sqrt(var) if var is not None else None,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Stat":
        return cls(d["name"]["name"], d["name"].get("split", "test"), d["count"], d["sum"], d["sum_squared"],
                   d.get("min"), d.get("max"))


def single(name: str, value: float, split: str = "test") -> Stat:
    return Stat(name, split).add(value)


def aggregate(per_instance: Iterable[tuple[int, list[Stat]]]) -> list[Stat]:
    """Run-level stats from (train_trial_index, stats) pairs: per trial, the mean over instances
    becomes one value; trials then add up (count = number of trials)."""
    by_trial: dict[tuple[int, str, str], Stat] = {}
    order: list[tuple[str, str]] = []
    for trial, stats in per_instance:
        for s in stats:
            key = (trial, s.name, s.split)
            if key not in by_trial:
                by_trial[key] = Stat(s.name, s.split)
                if (s.name, s.split) not in order:
                    order.append((s.name, s.split))
            by_trial[key].add(s.mean)
    out = {k: Stat(*k) for k in order}
    for (trial, name, split), st in by_trial.items():
        out[(name, split)].add(st.mean)
    return list(out.values())
