"""Affine forms over the nine placement fractions, the currency of the cost model and the LP."""

import numpy as np

from placement.specs import Policy


NUM_FRACTIONS = 9
W_GPU, W_CPU, W_DISK, C_GPU, C_CPU, C_DISK, H_GPU, H_CPU, H_DISK = range(NUM_FRACTIONS)
PREFILL_TERMS = ("ctog", "gtoc", "dtoc", "ctod", "comp")
# "routed": a MoE layer's routed-expert disk reads with the compute they cannot overlap (`cost_experts.routed_reads_s`)
DECODE_TERMS = PREFILL_TERMS + ("routed",)
MEMORY_ROWS = ("gpu_prefill", "gpu_decode", "gpu_head", "cpu_prefill", "cpu_decode", "disk")


class Affine:
    """const + coef . x over the nine fractions."""

    __slots__ = ("const", "coef")

    def __init__(self, const: float = 0.0, coef: np.ndarray | None = None):
        self.const = float(const)
        self.coef = np.zeros(NUM_FRACTIONS) if coef is None else coef

    def add(self, amount: float, *indices: int) -> "Affine":
        """Add `amount * (x[i] + x[j] + ...)`, or a constant when no index is given."""
        if not indices:
            self.const += amount
        for idx in indices:
            self.coef[idx] += amount
        return self

    def plus(self, other: "Affine") -> "Affine":
        """Add another affine form in place."""
        self.const += other.const
        self.coef = self.coef + other.coef
        return self

    def __call__(self, x: np.ndarray) -> float:
        return self.const + float(self.coef @ x)

    def scaled(self, factor: float) -> "Affine":
        return Affine(self.const * factor, self.coef * factor)


def fractions_of(policy: Policy) -> np.ndarray:
    return np.array(policy.weights.as_tuple() + policy.cache.as_tuple()
                    + policy.activations.as_tuple(), dtype=float)
