"""`solve`: enumerate the discrete policy knobs, solve the fraction LP for each, keep the best.

Knobs: GPU batch size, number of GPU batches, weight / cache compression, CPU attention.
The grid is fixed (it does not depend on memory), and a choice is skipped only when it
provably cannot fit (a memory row's minimum over all fractions exceeds its budget, or a
smaller choice already failed) or provably cannot beat the best plan so far (a lower bound on
its time), so the result is the true optimum over the grid (to within the LP's noise, `_TIE`,
where the plan that computes less wins): more memory never makes it worse.
"""

import dataclasses
import itertools
import math
import time

import numpy as np

from placement.affine import C_DISK, C_GPU, H_CPU, H_DISK, H_GPU, MEMORY_ROWS, NUM_FRACTIONS, fractions_of
from placement.choice import Choice
from placement.cost import (decode_layer_time, decode_layer_values, memory_at, prefill_layer_time, terms_of_policy,
                            total_time)
from placement.expert_cache_terms import expert_stored_bytes, with_expert_hits
from placement.expert_groups import ONE_AT_A_TIME, STREAMED
from placement.lp import memory_excess, memory_implied_highs, solve_fractions, time_lower_bounds
from placement.model_spec import ModelSpec
from placement.plan import ROW_LABELS, InfeasiblePlanError, Plan
from placement.specs import (CompressionSpec, EngineCapabilities, HardwareSpec, Policy, TierSplit,
                             WorkloadSpec)
from placement.terms import build_terms

GPU_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
NUM_GPU_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


# a block split into micro-batches of one size may hold this share more sequences than the job has (its last
# micro-batch short): the plan prices them, so the price is at most that share fast
FIT_OVERSHOOT = 0.01


def block_grid(max_block_size: int) -> list[tuple[int, int]]:
    """The (gpu_batch_size, num_gpu_batches) points searched: the grid's, gpu_batch_size *
    num_gpu_batches at most `max_block_size`, and for each of NUM_GPU_BATCHES the block of that many
    micro-batches of ceil(max / count) that holds all `max_block_size` sequences, where that is within
    FIT_OVERSHOOT of them. A job of N prompts is ceil(N / block) sweeps, each paying a decode step's
    expert reads: on the grid alone 1000 prompts ran as 768 + 232 (two sweeps' reads), 16 x 63 reads once."""
    grid = [(gbs, ngb) for gbs, ngb in itertools.product(GPU_BATCH_SIZES, NUM_GPU_BATCHES) if gbs * ngb <= max_block_size]
    fits = [(-(-max_block_size // ngb), ngb) for ngb in NUM_GPU_BATCHES if ngb <= max_block_size]
    return grid + [(gbs, ngb) for gbs, ngb in fits if gbs <= GPU_BATCH_SIZES[-1] and (gbs, ngb) not in grid
                   and gbs * ngb <= max_block_size * (1 + FIT_OVERSHOOT)]


def budgets_for(hardware: HardwareSpec, usable_fraction: float) -> dict[str, float]:
    """Bytes each memory row may use: capacities derated for fragmentation, runtime, OS."""
    if not 0 < usable_fraction <= 1:
        raise ValueError(f"usable_fraction must be in (0, 1], got {usable_fraction}")
    gpu = hardware.gpu_mem_bytes * usable_fraction
    cpu = hardware.cpu_mem_bytes * usable_fraction
    return {"gpu_prefill": gpu, "gpu_decode": gpu, "gpu_head": gpu, "cpu_prefill": cpu, "cpu_decode": cpu,
            "disk": hardware.disk_bytes * usable_fraction}


def _flag_sets(allow_weight_compression: bool, allow_cache_compression: bool,
               allow_cpu_attention: bool, allow_merged_decode: bool,
               capabilities: EngineCapabilities) -> list[tuple[bool, bool, bool, bool]]:
    """(compress weights, compress cache, cpu attention, merged decode) the search may try:
    what the caller allows and the engine can run."""
    merges = [m for m, able in ((False, capabilities.per_micro_batch_decode),
                                (True, capabilities.merged_decode and allow_merged_decode)) if able]
    if not merges:
        raise ValueError("allow_merged_decode=False, but the engine only runs merged decode")
    return list(itertools.product(
        (False, True) if allow_weight_compression and capabilities.weight_compression else (False,),
        (False, True) if allow_cache_compression and capabilities.cache_compression else (False,),
        (False, True) if allow_cpu_attention and capabilities.cpu_attention else (False,),
        merges))


def fraction_highs(capabilities: EngineCapabilities, model: ModelSpec | None = None) -> list[np.ndarray]:
    """Upper bounds on the nine fractions, one vector per placement the engine can run:
    the cache off disk unless it can keep it there (a KV cache: an MLA latent cache and a hybrid's
    DeltaNet state stay in memory), and the activations on one tier at a time (a vector per
    allowed tier) unless it can split them."""
    base = np.ones(NUM_FRACTIONS)
    if not capabilities.cache_on_disk or (model is not None and model.arch in ("mla", "hybrid")):
        base[C_DISK] = 0.0
    act_tiers = capabilities.activation_tiers()
    act_index = {"gpu": H_GPU, "cpu": H_CPU, "disk": H_DISK}
    if capabilities.split_activations:
        base[[act_index[t] for t in ("gpu", "cpu", "disk") if t not in act_tiers]] = 0.0
        return [base]
    out = []
    for tier in act_tiers:
        highs = base.copy()
        highs[[H_GPU, H_CPU, H_DISK]] = 0.0
        highs[act_index[tier]] = 1.0
        out.append(highs)
    return out


def solve(model: ModelSpec, hardware: HardwareSpec, workload: WorkloadSpec, *,
          usable_fraction: float = 0.9, allow_weight_compression: bool = True,
          allow_cache_compression: bool = True, allow_cpu_attention: bool = True,
          max_block_size: int = 8192, compression: CompressionSpec = CompressionSpec(),
          allow_merged_decode: bool = True,
          capabilities: EngineCapabilities = EngineCapabilities(),
          require_weight_compression: bool = False, require_cache_compression: bool = False) -> Plan:
    """The highest-throughput policy that fits every tier's budget and that the engine can run.

    Args:
        model, hardware, workload: what to run, where, and how long the sequences are.
        usable_fraction: share of each tier's capacity the plan may fill.
        allow_*: whether the search may turn on compression, CPU attention or merged decode
            (`Policy.merge_decode`; False plans decode one micro-batch at a time, as FlexGen does).
        require_*_compression: plan only with that compression on (the user asked for it: the
            plan then prices what will run).
        max_block_size: the most sequences a block needs (`block_grid`: a block holds at most that many,
            or exactly that many in micro-batches of one size, the last short).
        compression: the quantization used when compression is on.
        capabilities: what the engine can run (default: flexlamps' offload engine, which keeps
            the cache and activations off disk and the activations on one tier);
            `EngineCapabilities.unrestricted()` searches FlexGen's whole space.

    Raises:
        InfeasiblePlanError: not even one sequence fits; names the tier and the shortfall.
    """
    started = time.perf_counter()
    budgets = budgets_for(hardware, usable_fraction)
    flags = _flag_sets(allow_weight_compression, allow_cache_compression, allow_cpu_attention,
                       allow_merged_decode, capabilities)
    flags = [f for f in flags if (f[0] or not require_weight_compression) and (f[1] or not require_cache_compression)]
    if not flags:
        raise ValueError("compression is required but not allowed (or the engine cannot run it)")
    placements = fraction_highs(capabilities, model)
    best, num_lps = None, 0
    # a MoE model's experts staged all at once, or streamed two at a time; one at a time only
    # where nothing else fits (`expert_groups`)
    for groups in ((0, STREAMED), (ONE_AT_A_TIME,)) if model.num_experts else ((0,),):
        candidates = _candidates(model, hardware, workload, budgets, flags, placements, compression,
                                 max_block_size, capabilities.int4_in_place_below_rows, groups)
        best, lps = _best_candidate(candidates, budgets, placements)
        num_lps += lps
        if best is not None:
            break
    if best is None:
        raise _infeasible(model, hardware, workload, budgets, compression, flags, placements)
    _, choice, terms, x = best  # priced again with the expert cache's hits at its fractions
    terms = with_expert_hits(choice, model, hardware, workload, x, terms)
    best = (terms.tokens_per_block / total_time(terms, x), choice, terms, x)
    best, lps = _with_cache_room(best, model, hardware, workload, budgets, placements)
    return _make_plan(best, budgets, num_lps + lps, time.perf_counter() - started)


def _with_cache_room(best, model: ModelSpec, hardware: HardwareSpec, workload: WorkloadSpec,
                     budgets: dict[str, float], placements) -> tuple[tuple, int]:
    """`best` (priced with its expert cache's hits), or its choice solved again with room kept free
    in the gpu tier for the cache, where that prices faster; and the LPs solved. The LP gives every
    byte it can to resident weights and prices no hits (a replay of traced routing, not affine in the
    fractions), so the cache would get only what the rows leave: one resident expert saves its share
    of the steps that route to it, a cache slot the reads a sequence repeats step after step. Room
    for k experts is taken off the gpu decode rows' budgets, k on a geometric grid up to the tier,
    and each solution priced with its hits (`cache_room` sizes the cache from the rows, as the
    engine's is what its charges leave). Without traced routing no hits are priced: `best` as is."""
    _, choice, terms, x = best
    if not (model.num_experts and model.routing is not None and model.routing.traces):
        return best, 0
    highs = next(h for h in placements if (x <= h + 1e-9).all())  # the placement `best` was solved in
    # every read of the cached kinds a hit, at the whole budgets: no room kept can price faster
    ideal = dataclasses.replace(choice, cpu_expert_tokens=terms.cpu_expert_tokens, expert_hits=1.0,
                                disk_experts_only=True)
    bounds = [solve_fractions(t, budgets, _bounds(highs)) for t in _branches(build_terms(ideal, model, hardware,
                                                                                          workload))]
    num_lps = len(bounds)
    if min((b.total_s for b in bounds if b is not None), default=math.inf) >= best[2].tokens_per_block / best[0] * (
            1 - _TIE):
        return best, num_lps
    slot = expert_stored_bytes(choice, model, workload)
    branches = _branches(build_terms(choice, model, hardware, workload))
    for slots in _geometric_grid(budgets["gpu_decode"] / slot):
        room = dict(budgets, **{row: budgets[row] - slots * slot for row in CACHE_ROOM_ROWS})
        fastest = None  # the LP's best (solution, terms) with this room, priced with hits below
        for terms in branches:
            solution = solve_fractions(terms, room, _bounds(highs))
            num_lps += 1
            if solution is not None:
                solution, extra_lps = cache_in_whole_layers(solution, terms, room, highs)
                num_lps += extra_lps
            if solution is not None and (fastest is None or solution.total_s < fastest[0].total_s):
                fastest = (solution, terms)
        if fastest is None:  # less room fits nothing more
            break
        x = fastest[0].fractions
        priced = with_expert_hits(choice, model, hardware, workload, x, fastest[1])
        tokens_per_s = priced.tokens_per_block / total_time(priced, x)
        if tokens_per_s > best[0] * (1 + _TIE):
            best = (tokens_per_s, choice, priced, x)
    return best, num_lps


CACHE_ROOM_ROWS = ("gpu_decode", "gpu_head")  # the rows whose slack the expert cache has during decode


def _geometric_grid(high: float) -> list[int]:
    """Whole numbers from 1 to `high` (the last), each about sqrt(2) times the one before."""
    grid = {round(2 ** (i / 2)) for i in range(2 * math.ceil(math.log2(max(high, 1))) + 1)} | {math.floor(high)}
    return sorted(k for k in grid if 1 <= k <= high)


def _bounds(highs: np.ndarray) -> tuple[tuple[float, float], ...]:
    return tuple((0.0, float(high)) for high in highs)


def cache_in_whole_layers(solution, terms, budgets, highs) -> tuple[object, int]:
    """The best solution whose cache split gives each tier whole layers, as the engine places
    the cache (layer by layer), and the LPs solved to find it (None when none fits).

    Each tier boundary of the LP's split is rounded down and up to a layer; the weights and
    activations are solved again around each rounding."""
    if terms.latent is not None:  # pools are sized per layer, not placed in whole layers
        return solution, 0
    layers = terms.num_layers
    gpu_end, cpu_end = solution.fractions[C_GPU] * layers, (1 - solution.fractions[C_DISK]) * layers
    if all(abs(end - round(end)) < 1e-6 for end in (gpu_end, cpu_end)):
        return solution, 0
    best, num_lps = None, 0
    for gpu_layers in {math.floor(gpu_end + 1e-6), math.ceil(gpu_end - 1e-6)}:
        for cached_layers in {math.floor(cpu_end + 1e-6), math.ceil(cpu_end - 1e-6)}:
            split = np.array([gpu_layers, cached_layers - gpu_layers, layers - cached_layers]) / layers
            if split.min() < 0 or (split > highs[C_GPU:C_DISK + 1] + 1e-9).any():
                continue
            bounds = list(_bounds(highs))
            bounds[C_GPU:C_DISK + 1] = [(float(f), float(f)) for f in split]
            candidate = solve_fractions(terms, budgets, bounds)
            num_lps += 1
            if candidate is not None and (best is None or candidate.total_s < best.total_s):
                best = candidate
    return best, num_lps


def _best_candidate(candidates, budgets: dict[str, float], placements) -> tuple[tuple | None, int]:
    """The fastest candidate that fits, as (tokens/s, choice, terms, fractions), or None; and
    how many LPs it took. Candidates are solved best bound first, stopping once no bound beats
    the best found."""
    candidates = sorted(candidates, key=lambda cand: -cand[0])
    too_big: dict[tuple, list[tuple[int, int]]] = {}  # flags -> (gbs, ngb) that did not fit
    # (choice, placement) solved as fast as any of its staging branches can be (its first solved has the highest bound)
    settled = set()
    best, num_lps = None, 0
    for bound, choice, terms, place in candidates:
        if best is not None and bound < best[0] * (1 - _TIE):  # a tie may still win on compute
            break
        if (choice, place) in settled:
            continue
        key = (choice.compress_weight, choice.compress_cache, choice.cpu_attention, choice.merge_decode,
               choice.latent_pools, choice.expert_group, place, terms.staging and terms.staging.capped)
        if any(choice.gpu_batch_size >= gbs and choice.num_gpu_batches >= ngb
               for gbs, ngb in too_big.get(key, ())):
            continue  # memory grows with both knobs, so a larger one cannot fit either
        solution = solve_fractions(terms, budgets, _bounds(placements[place]))
        num_lps += 1
        if solution is not None:
            solution, extra_lps = cache_in_whole_layers(solution, terms, budgets, placements[place])
            num_lps += extra_lps
        if solution is None:
            too_big.setdefault(key, []).append((choice.gpu_batch_size, choice.num_gpu_batches))
            continue
        tokens_per_s = terms.tokens_per_block / solution.total_s
        if tokens_per_s >= bound * (1 - _TIE):
            settled.add((choice, place))
        if best is None or _beats(tokens_per_s, choice, terms, solution.fractions, best):
            best = (tokens_per_s, choice, terms, solution.fractions)
    return best, num_lps


_TIE = 1e-5  # plans this close in throughput are a tie: the LP solver's own noise (HiGHS tolerances)


def _beats(tokens_per_s: float, choice: Choice, terms, x, best) -> bool:
    """Faster than `best`, or as fast with less decode compute: where transfers bound both
    (an I/O-bound decode), the one that computes less (merged decode, fewer calls) leaves the
    most room for what the model does not price (transfers not overlapping compute fully); as
    fast with as much, the one that stages all its routed experts at once (every read started
    together, where streaming holds two)."""
    if tokens_per_s > best[0] * (1 + _TIE):
        return True
    if tokens_per_s < best[0] * (1 - _TIE):
        return False
    comp, best_comp = decode_layer_values(terms, x)["comp"], decode_layer_values(best[2], best[3])["comp"]
    if comp != best_comp:
        return comp < best_comp
    return choice.expert_group == 0 < best[1].expert_group


def _candidates(model, hardware, workload, budgets, flags, placements, compression, max_block_size,
                int4_in_place_below_rows, expert_groups=(0,)):
    """(throughput upper bound, choice, terms, placement index) for every grid point and
    placement that might fit; `int4_in_place_below_rows` is the engine's (`EngineCapabilities`);
    a MoE model's choices once per group size in `expert_groups` (`Policy.expert_group`)."""
    merges = {merge for *_, merge in flags}
    single_batch_merge = True in merges  # one micro-batch: merged and not are the same
    choices = [Choice(gpu_batch_size=gbs, num_gpu_batches=ngb, compress_weight=weight,
                      compress_cache=cache, cpu_attention=cpu_attention, compression=compression,
                      merge_decode=merge, int4_in_place_below_rows=int4_in_place_below_rows)
               for weight, cache, cpu_attention, merge in flags
               for gbs, ngb in block_grid(max_block_size) if ngb > 1 or merge == single_batch_merge]
    if model.arch == "mla":  # the engine's latent cache is stored as it is and attended on the gpu
        choices = [c for c in choices if not (c.compress_cache or c.cpu_attention)]
    if model.index_topk:  # ESS's layout too: per-layer gpu pools over the latent records on the cpu tier
        choices += [dataclasses.replace(c, latent_pools=True) for c in choices
                    if not (c.cpu_attention or c.compress_cache)]
    choices = [dataclasses.replace(c, expert_group=group) for group in expert_groups for c in choices]
    # a MoE choice once per branch of its staged experts' bound (`placement.staging`)
    choices, terms = zip(*[(choice, branch) for choice in choices
                           for branch in _branches(build_terms(choice, model, hardware, workload))])
    pairs = [(i, place) for i in range(len(choices)) for place in range(len(placements))]
    caps_highs = np.array([placements[place] for _, place in pairs])
    fits, highs = memory_implied_highs([terms[i] for i, _ in pairs], budgets, caps_highs)
    bounds = np.full(len(pairs), np.inf)
    if fits.any():
        kept = np.flatnonzero(fits)
        bounds[kept] = time_lower_bounds([terms[pairs[k][0]] for k in kept], highs[kept])
    return [(terms[pairs[k][0]].tokens_per_block / bounds[k], choices[pairs[k][0]],
             terms[pairs[k][0]], pairs[k][1]) for k in np.flatnonzero(np.isfinite(bounds))]


def _branches(terms) -> list:
    """`terms`, or a MoE model's once per branch of its staging (each an upper bound; together exact)."""
    if terms.staging is None:
        return [terms]
    return [dataclasses.replace(terms, staging=branch) for branch in terms.staging.branches()]


def evaluate(policy: Policy, model: ModelSpec, hardware: HardwareSpec, workload: WorkloadSpec,
             *, usable_fraction: float = 0.9) -> Plan:
    """A `Plan` for a given policy, without searching: its predicted times and peak memory.

    The plan's peaks may exceed its budgets (compare `peak_bytes` with `budget_bytes`);
    this is how a hand-set or engine-measured policy is checked against the model.
    """
    choice = Choice.of(policy)
    terms = terms_of_policy(policy, model, hardware, workload)
    x = fractions_of(policy)
    best = (terms.tokens_per_block / total_time(terms, x), choice, terms, x)
    plan = _make_plan(best, budgets_for(hardware, usable_fraction), 0, 0.0)
    return dataclasses.replace(plan, policy=policy)


def _make_plan(best, budgets: dict[str, float], num_lps: int, search_s: float) -> Plan:
    _, choice, terms, x = best
    policy = Policy(
        gpu_batch_size=choice.gpu_batch_size, num_gpu_batches=choice.num_gpu_batches,
        weights=TierSplit.clipped(*x[0:3]), cache=TierSplit.clipped(*x[3:6]),
        activations=TierSplit.clipped(*x[6:9]), compress_weight=choice.compress_weight,
        compress_cache=choice.compress_cache, cpu_attention=choice.cpu_attention,
        compression=choice.compression, merge_decode=choice.merge_decode,
        latent_pools=tuple(terms.latent.envelope.pools(float(x[C_GPU]))) if terms.latent else (),
        cpu_expert_tokens=terms.cpu_expert_tokens, expert_group=choice.expert_group)
    prefill_s = terms.num_layers * prefill_layer_time(terms.prefill, x)
    decode_s = terms.num_layers * terms.num_decode_steps * decode_layer_time(terms, x)
    rows = memory_at(terms, x)
    slack = {name: (budgets[name] - rows[name]) / budgets[name] for name in MEMORY_ROWS}
    return Plan(
        policy=policy, tokens_per_s=terms.tokens_per_block / (prefill_s + decode_s),
        total_s=prefill_s + decode_s, prefill_s=prefill_s, decode_s=decode_s,
        prefill_layer_s={k: a(x) for k, a in terms.prefill.items()},
        decode_layer_s=decode_layer_values(terms, x),
        peak_bytes={"gpu": max(rows["gpu_prefill"], rows["gpu_decode"], rows["gpu_head"]),
                    "cpu": max(rows["cpu_prefill"], rows["cpu_decode"]), "disk": rows["disk"]},
        budget_bytes={"gpu": budgets["gpu_decode"], "cpu": budgets["cpu_decode"],
                      "disk": budgets["disk"]},
        binding_constraint=_binding(slack),
        num_lps_solved=num_lps, search_s=search_s)


def _binding(slack: dict[str, float]) -> str:
    """The memory row that limits the plan, or the one with the least room when none does."""
    row = min(slack, key=slack.get)
    if slack[row] < 0.01:
        return ROW_LABELS[row]
    return f"none ({ROW_LABELS[row]} has the least room, {slack[row]:.0%} free)"


def _infeasible(model, hardware, workload, budgets, compression, flags,
                placements) -> InfeasiblePlanError:
    # the least memory-hungry choice: one sequence, everything the search may turn on
    weight, cache, cpu_attention = (any(f[i] for f in flags) for i in range(3))
    choice = Choice(gpu_batch_size=1, num_gpu_batches=1, compress_weight=weight,
                    compress_cache=cache, cpu_attention=cpu_attention, compression=compression,
                    expert_group=ONE_AT_A_TIME if model.num_experts else 0)
    terms = build_terms(choice, model, hardware, workload)
    excess = min((memory_excess(terms, budgets, _bounds(highs)) for highs in placements),
                 key=lambda rows: sum(rows.values()))
    row = max(excess, key=excess.get)
    tier = row.split("_")[0]
    if tier != "disk":
        room = f"give the {tier} tier more room (--{tier}-mem)"
    elif hardware.disk_bytes <= 1:  # no folder was given: the engine plans with no disk tier
        room = "give the plan a disk tier (--offload-dir DIR; --disk-mem in flexlamps plan)"
    else:
        room = "give the disk tier more room (an --offload-dir with more free space; --disk-mem in flexlamps plan)"
    hints = [room, "shorten the sequences"]
    if not (weight and cache):
        hints.append("allow compression (--compress-weight, --compress-cache)")
    return InfeasiblePlanError(ROW_LABELS[row], max(float(np.ceil(excess[row])), 1.0),
                               budgets[row], hint=", ".join(hints[:-1]) + " or " + hints[-1])
