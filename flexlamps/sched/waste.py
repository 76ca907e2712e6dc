"""Memory waste of each interception strategy (INFERCEPT) and the memory a request holds over
time (LAMPS). Units: bytes x seconds (M = KV bytes per token). Pure arithmetic, no state.

INFERCEPT (Abhyankar et al., ICML'24, arXiv 2402.01869 v2, Sec. 3.2-4.3, Eqs. 1-5):

    WasteDiscard_i  = T_fwd(C_i) * C_i * M + T_fwd(C_i) * C_other * M          (1)
    WastePreserve_i = T_INT_i * C_i * M                                          (2)
    WasteSwap_i     = 2 * T_swap(C_i) * C_batch * M                              (3)
    WasteChunkD_i   = T_fwd(C_i) * C_i * M / 2 + n * T_fwd(C_i / n) * C_other * M   (4)
    Waste_i         = min(WastePreserve_i, WasteChunkD_i)                        (5)

C_i: the intercepted request's context; C_other: the context of the other running requests;
C_batch = C_i + C_other; n: the chunks a discarded context is recomputed in. Recomputation
is chunked (Sec. 4.2): each iteration carries at most c_h = S - running tokens recompute
tokens beside the decode batch, so the cache grows from 0 to C_i and each chunk stalls the
batch only by its own forward time.

The authors' code (WukLab/InferCept, vllm/core/scheduler_v2.py, `discard_waste`) evaluates
Eq. 4 chunk by chunk: `infercept_discard_waste`, which `wastes` and the policies use (with
one chunk it is Eq. 1, T_fwd priced at its slope). Eqs. 1-4 are also kept as written, with
worked-number tests. Units: the papers' bytes x seconds (times M); the policies compare
token x seconds (M = 1), as the code does.
"""

from __future__ import annotations

from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.request import Strategy


def waste_preserve(c_i: int, t_int: float, m: float) -> float:
    """Eq. 2: the cache idles on the gpu for the whole call."""
    return t_int * c_i * m


def waste_discard(c_i: int, c_other: int, t_fwd: float, m: float) -> float:
    """Eq. 1: an unchunked recomputation holds C_i and stalls the rest of the batch."""
    return t_fwd * c_i * m + t_fwd * c_other * m


def waste_swap(c_i: int, c_other: int, t_swap: float, m: float) -> float:
    """Eq. 3: an unpipelined swap out and back in stalls the whole batch twice."""
    return 2 * t_swap * (c_i + c_other) * m


def waste_chunk_discard(c_i: int, c_other: int, t_fwd_all: float, t_fwd_chunk: float,
                        num_chunks: int, m: float) -> float:
    """Eq. 4: a recomputation in `num_chunks` chunks; `t_fwd_all` = T_fwd(C_i),
    `t_fwd_chunk` = T_fwd(C_i / n), the time one chunk adds to its iteration."""
    return t_fwd_all * c_i * m / 2 + num_chunks * t_fwd_chunk * c_other * m


def infercept_discard_waste(c_i: int, c_other: int, chunk_tokens: int, iteration_s: float,
                            per_token_s: float, m: float = 1.0) -> float:
    """Eq. 4 as INFERCEPT's code evaluates it (WukLab/InferCept, vllm/core/scheduler_v2.py,
    `discard_waste`): the context is recomputed `chunk_tokens` (c_h) at a time beside the
    running decodes, n = ceil(C_i / c_h) - 1 full chunks, then the remainder C_i mod c_h.

    - own term: after the k-th full chunk the request holds k * c_h tokens for one full
      iteration (`iteration_s`, the forward of the whole token budget): f_s * c_h * n(n+1)/2;
    - stall term: each full chunk adds its slope time (`per_token_s` * c_h, no fixed part) to
      an iteration the other C_other tokens wait through: n * a * c_h * C_other;
    - the last partial chunk stalls the others and itself: a * last * (C_other + last).

    With one chunk (C_i < c_h) it is Eq. 1 with T_fwd(C_i) priced at its slope. Two quirks of
    the code are kept: a context that is an exact multiple of c_h loses its last chunk, and
    the last chunk's own term leaves out the n * c_h tokens already rebuilt."""
    c_h = max(1, chunk_tokens)
    n = max(-(-c_i // c_h) - 1, 0)
    own = iteration_s * (1 + n) * n / 2 * c_h
    stall = per_token_s * c_h * n * c_other
    last = c_i % c_h
    tail = per_token_s * last * (c_other + last)
    return (own + stall + tail) * m


def chunk_discard_waste(c_i: int, c_other: int, chunk_tokens: int, cost: CostModel,
                        budget_tokens: int | None = None) -> float:
    """Eq. 4 priced with `cost` the way INFERCEPT's code does (`infercept_discard_waste`):
    chunks of `chunk_tokens`, a full iteration of `budget_tokens` (default: the chunk)."""
    full = cost.compute_time(budget_tokens or chunk_tokens, 0, 0)
    slope = cost.prefill_per_token_s + cost.kv_read_per_token_s
    return infercept_discard_waste(c_i, c_other, chunk_tokens, full, slope, cost.kv_bytes_per_token)


def wastes(c_i: int, c_other: int, t_int: float, cost: CostModel,
           chunk_tokens: int, budget_tokens: int | None = None) -> dict[Strategy, float]:
    """What each strategy would waste for one interception: preserve (Eq. 2), discard as the
    engine does it, chunked (Eq. 4 as INFERCEPT's code prices it), and an unpipelined swap
    (Eq. 3). `c_other` is the context of the *other* running requests (C_batch - C_i)."""
    m, held = cost.kv_bytes_per_token, c_i + cost.state_tokens  # a hybrid model's state is held and moved too
    return {
        Strategy.PRESERVE: waste_preserve(held, t_int, m),
        Strategy.DISCARD: chunk_discard_waste(c_i, c_other, chunk_tokens, cost, budget_tokens),
        Strategy.SWAP: waste_swap(held, c_other, cost.swap_time(held), m),
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

    LAMPS (Shahout et al., arXiv 2410.18248, Sec. 4; mars-repository/mars-codebase,
    vllm/core/policy.py, `V2.get_priority`) ranks by the area under the request's memory
    curve: decoding `output` tokens from `context` holds context + t tokens at step t, an area
    of (context * output + output^2 / 2) * step_s; then, for the call, with C = context +
    output:
    - preserve: C is held for the whole call, C * api_time;
    - swap: the cache drains out and fills back in, a triangle each way, C * T_swap(C);
    - discard: nothing is held during the call; the chunked recomputation rebuilds the cache
      from 0 to C, C * T_fwd(C) / 2 (Eq. 4's own term).
    A hybrid model's recurrent state (`cost.state_tokens`) is constant memory on top of the
    context while the request holds a cache: it adds to what is held, moved and rebuilt alike.
    """
    state = cost.state_tokens
    area = ((context + state) * output + output * output / 2) * step_s
    if not api_time or strategy is None:
        return area
    c = context + output
    if strategy is Strategy.PRESERVE:
        return area + (c + state) * api_time
    if strategy is Strategy.SWAP:
        return area + (c + state) * cost.swap_time(int(c + state))
    return area + (c + state) * cost.prefill_time(int(c)) / 2
