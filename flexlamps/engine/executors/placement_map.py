"""Turn a policy's tier fractions into a concrete tier for every weight tensor and cache layer.

Like FlexGen, the split is applied inside each layer: a layer's tensors are walked in order
and each goes to the tier where the middle of its byte range falls, so every layer keeps
about `weights.gpu` of its bytes on the GPU and the I/O per layer is even. Unlike FlexGen,
what one group (the global tensors, then each layer) rounds off is carried into the next
group's target, so each tier holds its planned share of all the weights to within about one
tensor: the bytes the planner counted are the bytes the budgets are charged.

A MoE layer's routed experts are placed whole, one unit each (all its matrices on one tier),
after the layer's other tensors (attention, router, shared experts: read by every step) and
hottest first (`expert_order`, from a measured `placement.routing.RoutingProfile`), so the
experts most tokens route to land on the fastest tier.

The embedding table and the output head are not placed whole: each is cut by vocab rows into
one piece per tier, in the policy's fractions (an embedding lookup gathers rows from every
piece, the head's logits are computed piece by piece). A table can be a large part of a small
model; placed whole it would overshoot a tier's planned share by up to the table's size. A MoE
model's head, read whole every step, keeps its disk share on the cpu tier instead, the layers
giving back as many bytes of their coldest experts (`_head_split`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flexlamps.engine.executors.expert_weights import expert_index
from flexlamps.models.config import ModelConfig
from flexlamps.models.weight_specs import WeightSpec, weight_specs

TABLE_NAMES = ("embed_tokens", "lm_head")  # read in rows / vocab chunks, never staged whole
TIERS = ("gpu", "cpu", "disk")


@dataclass(frozen=True, slots=True)
class RowPiece:
    """Rows `start:stop` of a table (embedding or output head), stored on one tier."""

    name: str  # the stored tensor's name: the table's own when it is whole
    tier: str
    start: int  # first vocab row
    stop: int  # one past the last

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, slots=True)
class WeightPlacement:
    """Where every stored weight tensor lives."""

    tiers: dict[str, str]  # every stored tensor's tier: each weight, or each piece of a table
    pieces: dict[str, tuple[RowPiece, ...]]  # each table's pieces, in row order

    def pieces_of(self, spec: WeightSpec) -> tuple[RowPiece, ...]:
        """What is stored of `spec`: a table's pieces, or the whole tensor as one piece."""
        return self.pieces.get(spec.name) or (RowPiece(spec.name, self.tiers[spec.name], 0, spec.shape[0]),)


def table_pieces(spec: WeightSpec, split, rows: tuple[int, int] | None = None) -> tuple[RowPiece, ...]:
    """A table cut by rows in the split's fractions (to the nearest row), gpu rows first. `rows`:
    (a multiple every cut falls on, the most rows a piece holds), for a table kept as codes whose
    kernel layout is cut in whole tiles (a table not made of them stays whole, on the tier where
    its middle row falls)."""
    num_rows = spec.shape[0]
    align, most = rows or (1, num_rows)
    if num_rows % align:
        return (RowPiece(spec.name, _tier_at(0.5, split), 0, num_rows),)
    ends = [round(split.gpu * num_rows / align) * align, round((split.gpu + split.cpu) * num_rows / align) * align,
            num_rows]
    bounds = [(tier, cut, min(stop, cut + most)) for tier, start, stop in zip(TIERS, [0] + ends[:2], ends)
              for cut in range(start, stop, most)]
    if len(bounds) == 1:
        return (RowPiece(spec.name, bounds[0][0], 0, num_rows),)
    return tuple(RowPiece(f"{spec.name}.rows{start}-{stop}", tier, start, stop) for tier, start, stop in bounds)


def placement_units(specs: list[WeightSpec], hottest_first: list[int] | None) -> list[list[WeightSpec]]:
    """A layer's tensors as units placed whole, in order: each tensor alone, then each routed
    expert's tensors together, hottest first (default: by index)."""
    units: list[list[WeightSpec]] = []
    experts: dict[int, list[WeightSpec]] = {}
    for s in specs:
        e = expert_index(s.local_name) if s.layer is not None else None
        if e is None:
            units.append([s])
        else:
            experts.setdefault(e, []).append(s)
    hottest_first = [e for e in hottest_first or [] if e in experts]
    order = hottest_first + sorted(set(experts) - set(hottest_first))
    return units + [experts[e] for e in order]


def place_weights(cfg: ModelConfig, split, size_of=None, specs: list[WeightSpec] | None = None,
                  expert_order=None, table_rows: dict | None = None) -> WeightPlacement:
    """Tier of every weight tensor, the tables cut into pieces. `size_of(spec)`: the bytes it is
    stored in (default: its element count), so that shares are shares of stored bytes, as the
    planner counts them (compressed matrices shrink, embedding tables do not). `specs`: the
    tensors as stored (default: the model's `weight_specs`). `expert_order(layer)`: a MoE
    layer's experts, hottest first (default: by index). `table_rows`: {table: `table_pieces`'
    rows} for tables kept as codes."""
    size_of = size_of or (lambda spec: spec.numel)
    groups: dict[int | None, list[WeightSpec]] = {}
    for s in specs if specs is not None else weight_specs(cfg):
        groups.setdefault(s.layer, []).append(s)
    order = sorted(groups, key=lambda layer: -1 if layer is None else layer)  # globals first
    head_name, head_split = _head_split(groups, split, size_of)
    tiers, pieces = {}, {}
    seen = on_gpu = on_gpu_or_cpu = 0  # bytes walked, and placed on the gpu / gpu+cpu tiers
    debt = (0.0, 0.0)  # what the global tensors rounded off, paid back evenly over the layers
    for index, layer in enumerate(order):
        specs = groups[layer]
        seen += sum(size_of(s) for s in specs)
        # this group's share of each boundary, plus what earlier groups rounded off (the
        # globals' rounding spread over the layers, so every layer streams about as much)
        left = 1 - index / (len(order) - 1) if len(order) > 1 and index else 0.0
        gpu_end = split.gpu * seen - on_gpu - debt[0] * left
        cpu_end = (split.gpu + split.cpu) * seen - on_gpu_or_cpu - debt[1] * left
        for s in (s for s in specs if s.name in TABLE_NAMES):  # cut in the split's fractions
            pieces[s.name] = table_pieces(s, head_split if s.name == head_name else split, (table_rows or {}).get(s.name))
            for piece in pieces[s.name]:
                tiers[piece.name] = piece.tier
                size = size_of(s) * piece.num_rows // s.shape[0]
                gpu_bytes, memory_bytes = size * (piece.tier == "gpu"), size * (piece.tier != "disk")
                on_gpu, on_gpu_or_cpu = on_gpu + gpu_bytes, on_gpu_or_cpu + memory_bytes
                gpu_end, cpu_end = gpu_end - gpu_bytes, cpu_end - memory_bytes
        done = 0
        hottest = expert_order(layer) if expert_order is not None and layer is not None else None
        for unit in placement_units([s for s in specs if s.name not in TABLE_NAMES], hottest):
            size = sum(size_of(s) for s in unit)  # whole, by where its middle falls
            middle = done + size / 2
            tier = "gpu" if middle < gpu_end else "cpu" if middle < cpu_end else "disk"
            tiers.update({s.name: tier for s in unit})
            on_gpu += size if tier == "gpu" else 0
            on_gpu_or_cpu += size if tier != "disk" else 0
            done += size
        if layer is None:
            debt = (split.gpu * seen - on_gpu, (split.gpu + split.cpu) * seen - on_gpu_or_cpu)
    return WeightPlacement(tiers, pieces)


def _head_split(groups: dict, split, size_of) -> tuple[str | None, object]:
    """The output head (its table's name) and the split it is cut by. A MoE model reads its head
    whole every step and a routed expert only when routed, so the head's disk share goes to the
    cpu tier instead, given back by every layer from the experts it keeps in memory (placed after
    its dense parts, coldest last: those go to disk): where each layer keeps that many. Else (a
    dense model, or memory tiers that hold little beyond the layers' dense parts) the split."""
    tables = {s.name: s for s in groups.get(None, []) if s.name in TABLE_NAMES}
    head = tables.get("lm_head") or tables.get("embed_tokens")
    layers = [specs for layer, specs in groups.items() if layer is not None]
    if head is None or not layers or split.disk <= 0:
        return None, split
    give_back = size_of(head) * split.disk / len(layers)  # each layer's share
    for specs in layers:
        total = sum(size_of(s) for s in specs)
        dense = sum(size_of(s) for s in specs if expert_index(s.local_name) is None)
        experts_in_memory = (split.gpu + split.cpu) * total - max(dense, split.gpu * total)
        if dense == total or experts_in_memory < give_back:
            return None, split
    return head.name, type(split)(gpu=split.gpu, cpu=split.cpu + split.disk, disk=0.0)


def cache_tiers(num_layers: int, split) -> list[str]:
    """Tier per layer's KV cache: the first `split.gpu` of the layers on the GPU, and so on."""
    return [_tier_at((i + 0.5) / num_layers, split) for i in range(num_layers)]


def _tier_at(point: float, split) -> str:
    if point < split.gpu:
        return "gpu"
    if point < split.gpu + split.cpu:
        return "cpu"
    return "disk"
