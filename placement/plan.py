"""`Plan`, what the solver hands the engine, and `InfeasiblePlanError` for when nothing fits."""

from dataclasses import dataclass

from placement.jsonable import JsonMixin
from placement.specs import Policy
from placement.units import format_bytes

ROW_LABELS = {
    "gpu_prefill": "gpu memory (prefill)", "gpu_decode": "gpu memory (decode)",
    "gpu_head": "gpu memory (output head)",
    "cpu_prefill": "cpu memory (prefill)", "cpu_decode": "cpu memory (decode)",
    "disk": "disk",
}
TIERS = ("gpu", "cpu", "disk")


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan(JsonMixin):
    """The chosen policy and what the cost model predicts for it."""

    policy: Policy
    tokens_per_s: float  # predicted generation throughput
    total_s: float  # one block: prefill + decode
    prefill_s: float
    decode_s: float
    prefill_layer_s: dict[str, float]  # per-layer terms ctog/gtoc/dtoc/ctod/comp
    decode_layer_s: dict[str, float]
    peak_bytes: dict[str, float]  # per tier ("gpu", "cpu", "disk"), max of prefill and decode
    budget_bytes: dict[str, float]  # per tier, after derating
    binding_constraint: str  # the full memory row, e.g. "cpu memory (decode)", or "none (...)"
    num_lps_solved: int  # LPs the search solved (the rest were pruned by bounds)
    search_s: float  # wall time of the search

    def summary(self) -> str:
        """One line for logs."""
        pol = self.policy
        return (f"{self.tokens_per_s:.2f} tok/s, block {pol.gpu_batch_size}x{pol.num_gpu_batches}, "
                f"binding: {self.binding_constraint}")


class InfeasiblePlanError(ValueError):
    """No policy fits: names the tier that overflows most and by how many bytes."""

    def __init__(self, constraint: str, shortfall_bytes: float, budget_bytes: float,
                 hint: str = ""):
        self.constraint = constraint
        self.shortfall_bytes = int(shortfall_bytes)
        self.budget_bytes = int(budget_bytes)
        message = (f"{constraint}: needs {format_bytes(shortfall_bytes)} more than the "
                   f"{format_bytes(budget_bytes)} budget")
        super().__init__(message + (f"; {hint}" if hint else ""))
