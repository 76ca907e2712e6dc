"""Measuring for the planner, part of the Python API (`flexlamps profile` is a thin layer over it):
this machine as a `placement.HardwareSpec` (`profile_machine`, its probes named by `PROBE_NAMES`),
a MoE model's routing on the user's prompts, cached where the engine reads it (`profile_routing`),
and a sparse-attention MLA model's latent-pool miss curves (`latent_miss_curves`)."""

from __future__ import annotations

from pathlib import Path

from flexlamps.engine.latent_profile import measure_latent_miss_curves as latent_miss_curves
from flexlamps.engine.routing_measure import measure_routing
from flexlamps.engine.routing_profile import save_routing
from flexlamps.hardware.machine import PROBE_NAMES, profile_machine
from placement.routing import RoutingProfile

__all__ = ["PROBE_NAMES", "latent_miss_curves", "profile_machine", "profile_routing"]


def profile_routing(reader, prompt_ids: list[list[int]], new_tokens: int) -> tuple[RoutingProfile, Path]:
    """A MoE model's routing (`reader`: its checkpoint, `flexlamps.api.open_checkpoint`) counted over the
    prompts and `new_tokens` greedy tokens each, and the file it is cached in: later runs of the
    same checkpoint put the hottest experts on the fastest tier."""
    profile = measure_routing(reader, prompt_ids, new_tokens)
    return profile, save_routing(reader, profile)
