"""A MoE model's routing measured on the user's prompts (`flexlamps profile --model M --prompts
FILE`): how many tokens picked each expert of each layer, cached beside the hardware profile
under the checkpoint's fingerprint. The offload executor reads it to place each layer's hottest
experts on the fastest tier; without one, experts are placed by index (uniform routing).
"""

from __future__ import annotations

import json
from pathlib import Path

from flexlamps.cache_folder import cache_root
from flexlamps.io.atomic import atomic_output
from placement.routing import RoutingProfile


def routing_cache_path(fingerprint: str) -> Path:
    return cache_root() / f"routing-{fingerprint}.json"


def cached_routing(reader) -> RoutingProfile | None:
    """The routing measured for this checkpoint, when `flexlamps profile --prompts` cached one."""
    if reader.config.moe is None:
        return None
    path = routing_cache_path(reader.fingerprint())
    if not path.exists():
        return None
    try:
        return RoutingProfile.from_json(path.read_text())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"the routing profile {path} is damaged ({exc}); delete it or run "
                         "`flexlamps profile --model M --prompts FILE` again") from None


def save_routing(reader, profile: RoutingProfile) -> Path:
    path = routing_cache_path(reader.fingerprint())
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as handle:
        handle.write(json.dumps(profile.to_dict()) + "\n")
    return path
