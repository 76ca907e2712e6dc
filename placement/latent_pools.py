"""Per-layer GPU pools of an offloaded latent cache (ESS's layout), as the planner's LP sees them.

A sparse-attention MLA model (DeepSeek-V3.2) keeps its indexer keys on the gpu tier, every
latent record on the cpu tier, and per layer a gpu pool of the hottest records (LRU). Each
decode step copies a layer's misses to the gpu. How many depends on the layer and its pool:
`LatentMissCurves` holds, per layer, the misses per step per sequence (a fraction of the
top-k) at pool sizes given as fractions of the context, measured on the model by `flexlamps
profile --model` or, by default, ESS's curves (`ess_miss_curves.json`, written by
`scripts/sim_ess.py --write-curves` from traces calibrated to ESS's per-layer range).

The planner chooses every layer's pool inside its LP. With variables p_l (layer l's pool
fraction) and m_l (its misses), the rows are m_l >= each piece of the convex hull of l's
curve, mean(p_l) = c_gpu (the cache fraction on the gpu tier, what the memory rows charge)
and the copy time proportional to mean(m_l) (what the time rows charge). That LP is separable
over layers given c_gpu, so it is solved exactly by `MissEnvelope`: its value as a function
of c_gpu is convex piecewise linear (the hull segments of all layers, steepest first), so the
planner's LP carries it as one variable m >= each piece, and `MissEnvelope.pools(c_gpu)` is
the per-layer optimum at the chosen c_gpu (the greedy allocation that attains it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placement.jsonable import JsonMixin

ESS_CURVES_PATH = Path(__file__).with_name("ess_miss_curves.json")


@dataclass(frozen=True, slots=True, kw_only=True)
class LatentMissCurves(JsonMixin):
    """Per layer: misses per decode step per sequence, as a fraction of the top-k, by pool size
    as a fraction of the context (LRU pools, after a warm-up)."""

    source: str  # where the numbers come from (ESS's curves, or the model and run they were measured on)
    pool_fractions: list[float]  # ascending, in (0, 1]
    miss_fractions: list[list[float]]  # [layer][pool size], each in [0, 1]

    def __post_init__(self):
        fractions = np.asarray(self.pool_fractions, dtype=float)
        if fractions.ndim != 1 or fractions.size < 1 or (np.diff(fractions) <= 0).any() \
                or fractions[0] <= 0 or fractions[-1] > 1:
            raise ValueError(f"LatentMissCurves.pool_fractions must ascend within (0, 1], got {self.pool_fractions}")
        for layer, row in enumerate(self.miss_fractions):
            if len(row) != fractions.size or not all(0 <= v <= 1 for v in row):
                raise ValueError(f"LatentMissCurves.miss_fractions[{layer}] needs {fractions.size} values "
                                 f"in [0, 1], got {row}")
        if not self.miss_fractions:
            raise ValueError("LatentMissCurves.miss_fractions has no layer")

    @classmethod
    def ess(cls) -> "LatentMissCurves":
        """ESS's per-layer curves (DeepSeek-V3.2 at 32K context), shipped with the planner."""
        return cls.from_dict(json.loads(ESS_CURVES_PATH.read_text()))

    def for_layers(self, num_layers: int) -> list[list[float]]:
        """One curve per model layer: the curve of the layer at the same relative depth."""
        count = len(self.miss_fractions)
        return [self.miss_fractions[round(layer * (count - 1) / max(num_layers - 1, 1))]
                for layer in range(num_layers)]


def lower_hull(xs, ys) -> list[tuple[float, float]]:
    """Vertices of the convex lower envelope of the points (xs ascending): a miss curve as the
    convex function an LP can carry."""
    hull: list[tuple[float, float]] = []
    for x, y in zip(xs, ys):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):  # middle point on or above the chord
                hull.pop()
            else:
                break
        hull.append((float(x), float(y)))
    return hull


@dataclass(frozen=True, slots=True)
class _Segment:
    layer: int
    slope: float  # misses (fraction of top-k) per unit of pool fraction; <= 0
    length: float  # pool fraction it spans


class MissEnvelope:
    """Mean misses over the layers (fraction of the top-k) when the layers' pools, each at least
    `floor` of the context, average `c_gpu`, split between the layers as well as possible."""

    def __init__(self, curves: LatentMissCurves, num_layers: int, floor: float):
        self.num_layers = num_layers
        self.floor = min(1.0, max(floor, curves.pool_fractions[0]))
        self.floor_misses = []
        self.layer_points = []  # (xs, ys) per layer from the floor up, for `misses_at`
        segments = []
        for layer, row in enumerate(curves.for_layers(num_layers)):
            xs = np.asarray(curves.pool_fractions, dtype=float)
            ys = np.asarray(row, dtype=float)
            if xs[-1] < 1.0:  # a pool holding the whole context misses nothing after warm-up
                xs, ys = np.append(xs, 1.0), np.append(ys, 0.0)
            keep = xs > self.floor
            xs = np.concatenate([[self.floor], xs[keep]])
            ys = np.concatenate([[np.interp(self.floor, curves.pool_fractions, row)], ys[keep]])
            self.layer_points.append((xs, ys))
            hull = lower_hull(xs, ys)
            self.floor_misses.append(hull[0][1])
            for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
                if y2 < y1:  # a flat tail saves nothing: pools stop growing there
                    segments.append(_Segment(layer, (y2 - y1) / (x2 - x1), x2 - x1))
        self.segments = sorted(segments, key=lambda s: (s.slope, s.layer))  # steepest first

    def pieces(self) -> list[tuple[float, float]]:
        """(slope, intercept): mean misses >= slope * c_gpu + intercept for each piece, equal to
        the envelope where that piece is the active one (a convex function as LP rows)."""
        x, y = self.floor, float(np.mean(self.floor_misses))
        out = []
        for seg in self.segments:
            slope = seg.slope  # mean over layers: the pool mean moves length / L, misses slope * that
            out.append((slope, y - slope * x))
            x, y = x + seg.length / self.num_layers, y + slope * seg.length / self.num_layers
        out.append((0.0, y))
        return out

    def value(self, c_gpu: float) -> float:
        return max(slope * c_gpu + intercept for slope, intercept in self.pieces())

    def misses_at(self, pools: tuple[float, ...]) -> float:
        """Mean misses over the layers with these pools (fractions of the context), read off each
        layer's curve between its measured sizes."""
        if len(pools) != self.num_layers:
            raise ValueError(f"latent pools for {len(pools)} layers, the model has {self.num_layers}")
        return float(np.mean([np.interp(max(p, self.floor), xs, ys)
                              for p, (xs, ys) in zip(pools, self.layer_points)]))

    def pools(self, c_gpu: float) -> list[float]:
        """Each layer's pool fraction at mean `c_gpu`: the steepest segments first."""
        pools = [self.floor] * self.num_layers
        room = max(0.0, c_gpu - self.floor) * self.num_layers
        for seg in self.segments:
            take = min(seg.length, room)
            pools[seg.layer] += take
            room -= take
        # past every useful segment: the rest evenly, so the pools still average c_gpu
        spare = [1.0 - p for p in pools]
        if room > 1e-12 and sum(spare) > 0:
            share = min(1.0, room / sum(spare))
            pools = [p + share * s for p, s in zip(pools, spare)]
        return pools
