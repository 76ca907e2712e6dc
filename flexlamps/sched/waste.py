"""Memory waste of each interception strategy (INFERCEPT, ICML'24, Sec. 4) and the memory a
request holds over time (LAMPS). Units: bytes x seconds (M = KV bytes per token).

    WastePreserve_i = T_INT_i * C_i * M                     cache idles on the gpu for the call
    WasteDiscard_i  = T_fwd(C_i) * C_i * M                  the recomputed cache is rebuilt ...
                    + T_fwd(C_i) * C_other * M              ... while the rest of the batch waits
    WasteSwap_i     = 2 * T_swap(C_i) * C_batch * M         out and back in, stalling the batch

C_i: the intercepted request's context; C_other: the context of the other running requests;
C_batch = C_i + C_other. Swaps that fit in the per-iteration swap budget are hidden behind
compute (INFERCEPT's pipelined swap) and waste nothing.
"""

from __future__ import annotations

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.request import Strategy


def waste_preserve(c_i: int, t_int: float, m: float) -> float:
    return t_int * c_i * m


def waste_discard(c_i: int, c_other: int, t_fwd: float, m: float) -> float:
    return t_fwd * c_i * m + t_fwd * c_other * m


def waste_swap(c_i: int, c_other: int, t_swap: float, m: float) -> float:
    return 2 * t_swap * (c_i + c_other) * m


def wastes(c_i: int, c_other: int, t_int: float, cost: CostModel) -> dict[Strategy, float]:
    m = cost.kv_bytes_per_token
    return {
        Strategy.PRESERVE: waste_preserve(c_i, t_int, m),
        Strategy.DISCARD: waste_discard(c_i, c_other, cost.prefill_time(c_i), m),
        Strategy.SWAP: waste_swap(c_i, c_other, cost.swap_time(c_i), m),
    }


def memory_over_time(
    context: int,
    output: float,
    api_time: float | None,
    strategy: Strategy | None,
    step_s: float,
    cost: CostModel,
) -> float:
    """Token x seconds a request holds on the gpu until its next call returns (LAMPS's rank).

    Decoding `output` tokens from `context` holds context + t tokens at step t: the area is
    (context * output + output^2 / 2) * step_s. During a call of `api_time` seconds the cache
    is held (preserve), moved out and back (swap: the context is held for both transfers), or
    dropped and rebuilt (discard: the context is held while it is recomputed).
    """
    area = (context * output + output * output / 2) * step_s
    if not api_time or strategy is None:
        return area
    c = context + output
    if strategy is Strategy.PRESERVE:
        return area + c * api_time
    if strategy is Strategy.SWAP:
        return area + c * 2 * cost.swap_time(int(c))
    return area + c * cost.prefill_time(int(c))
