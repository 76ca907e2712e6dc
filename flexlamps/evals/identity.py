"""What a run's results depend on, so a finished run is reused only when nothing it was computed
from has changed: the instances (a file's whole content), the adapter settings, the model's
weights and the engine settings that change numbers, and the code of the metrics."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from flexlamps.evals.instances import Scenario
from flexlamps.evals.run_specs import RunSpec

# The modules whose code turns engine results into stats: editing them recomputes the stats
# (from the results kept in the progress log; the engine is not asked again).
_METRIC_MODULES = ("metrics.py", "scoring.py", "stats.py")


@dataclass(frozen=True)
class EngineIdentity:
    """The engine settings that change a request's result (placement does not: offloaded runs
    equal in-memory ones)."""

    model: str  # flexlamps.io.fingerprint.model_fingerprint of the weights
    dtype: str
    compress_weight: Optional[bool] = None
    compress_cache: Optional[bool] = None
    weight_quant: Optional[str] = None

    @property
    def key(self) -> str:
        return _digest(asdict(self))


@lru_cache(maxsize=1)
def metric_code_version() -> str:
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in _METRIC_MODULES:
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


def scenario_digest(scenario: Scenario) -> str:
    """Every instance as evaluated (text, references, split, id), in order."""
    return _digest([scenario.name, [i.to_json() for i in scenario.instances]])


def run_fingerprint(spec: RunSpec, scenario: Scenario, engine_key: str) -> str:
    return _digest([spec.to_json(), spec.main_metric, spec.seed, scenario_digest(scenario), engine_key,
                    metric_code_version()])


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]
