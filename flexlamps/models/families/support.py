"""What each family runs, by its forward kind (`Family.forward`): the cache it keeps per sequence
and whether the augmented engine's paged pool (`flexlamps agents`) holds that cache. Torch-free:
`flexlamps models` prints it and the engine refuses by the same table (`check_paged`), so the
list cannot claim what the engine refuses; tests/integration/test_family_support.py runs every
claim on each family's tiny checkpoint.

Every forward kind runs in memory and offloaded (weights over gpu / cpu / disk), and with
`--compress-weight`, which stores every matmul weight (`WeightSpec.role == "linear"`) 4-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexlamps.models.errors import UnsupportedModelError
from flexlamps.models.families import family_for


@dataclass(frozen=True)
class ForwardSupport:
    cache: str  # what a sequence keeps, as `flexlamps models` names it
    paged: bool  # the augmented engine's paged pool holds it (engine.caches.paged / paged_state)


SUPPORT = {
    "decoder": ForwardSupport("KV", paged=True),
    "opt": ForwardSupport("KV", paged=True),
    "mla": ForwardSupport("MLA latent", paged=False),  # the paged pool holds K/V heads, not latents
    "hybrid": ForwardSupport("KV + DeltaNet state", paged=True),
}
RUNS_EVERYWHERE = ("in memory", "offloaded", "4-bit weights")  # every forward kind (see the docstring)


def support_of(model_type: str) -> ForwardSupport:
    return SUPPORT[family_for(model_type).forward]


def runs(forward: str) -> str:
    """What a family of this forward kind runs, as `flexlamps models` lists it."""
    return ", ".join(RUNS_EVERYWHERE + (("agents",) if SUPPORT[forward].paged else ()))


def check_paged(model_type: str) -> None:
    """Raise when the augmented engine's paged pool cannot hold this model's cache."""
    support = support_of(model_type)
    if not support.paged:
        raise UnsupportedModelError(
            f"{model_type} keeps an {support.cache} cache, which the augmented engine's paged pool does not hold: "
            "`flexlamps agents` runs the families `flexlamps models` marks with agents; use `flexlamps generate`")
