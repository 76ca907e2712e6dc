"""The mixture-of-experts FFN: a router picks `num_experts_per_token` routed experts per token
and weights their outputs; always-on shared experts are added. Each router kind
(`moe_config.ROUTERS`) computes exactly what transformers' router of its families does (the
dtype of its logits included: fp32 for DeepSeek's and GLM's, the compute dtype otherwise).

Weights, by local name in the layer: `router` (E, hidden) and `router_bias` (E,); expert e's
`experts.{e}.gate_proj` / `up_proj` / `down_proj` (and `gate_bias` / `up_bias` / `down_bias`
for gpt-oss); the shared experts' `shared_gate_proj` / `shared_up_proj` / `shared_down_proj`
and Qwen2-MoE's `shared_expert_gate` (1, hidden). Experts stay separate tensors so each can
live on its own tier; each runs once per step on the tokens that chose it, in expert order,
as transformers' loop does, on the device its weights are on.
"""

from __future__ import annotations

import functools

import torch

from flexlamps.kernels import half_gemv, loader
from flexlamps.models.blocks.activation import sigmoid, silu
from flexlamps.models.blocks.dense_gemm import fast_dense_gemm
from flexlamps.models.blocks.linear import linear, unpack
from flexlamps.models.blocks.row_products import rows_product
from flexlamps.models.blocks.weight_kind import Phase, phase_of
from flexlamps.models.moe_config import FP32_ROUTERS, MoEConfig


def _mask_groups(scores: torch.Tensor, group_scores: torch.Tensor, cfg: MoEConfig, fill: float) -> torch.Tensor:
    """`scores` (N, E) with the experts outside each token's `topk_groups` best groups set to `fill`."""
    best_groups = group_scores.topk(cfg.topk_groups, dim=-1, sorted=False).indices
    group_mask = torch.zeros_like(group_scores).scatter_(1, best_groups, 1.0)
    per_group = cfg.num_experts // cfg.num_groups
    expert_mask = group_mask.unsqueeze(-1).expand(-1, -1, per_group).reshape(-1, cfg.num_experts)
    return scores.masked_fill(expert_mask == 0, fill)


def _sigmoid_grouped(logits: torch.Tensor, bias: torch.Tensor, cfg: MoEConfig):
    """DeepSeek-V3 / GLM-4.5: sigmoid scores; groups by the sum of their two best biased scores;
    the bias picks, the unbiased scores weigh (renormalized when `norm_topk_prob`)."""
    scores = sigmoid(logits)  # row-independent (activation.py); torch's moves a row with the row count
    choice = scores + bias.float()
    per_group = cfg.num_experts // cfg.num_groups
    group_scores = choice.view(-1, cfg.num_groups, per_group).topk(2, dim=-1).values.sum(-1)  # (N, G)
    choice = _mask_groups(choice, group_scores, cfg, float("-inf"))
    indices = choice.topk(cfg.num_experts_per_token, dim=-1, sorted=False).indices
    weights = scores.gather(1, indices)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights, indices


def _softmax_deepseek_v2(logits: torch.Tensor, cfg: MoEConfig):
    """DeepSeek-V2's `greedy` and `group_limited_greedy` (groups by their best score; the
    experts of other groups score 0); never renormalized."""
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    if cfg.router == "softmax_group_limited":
        group_scores = scores.view(-1, cfg.num_groups, cfg.num_experts // cfg.num_groups).max(dim=-1).values
        scores = _mask_groups(scores, group_scores, cfg, 0.0)
    return scores.topk(cfg.num_experts_per_token, dim=-1, sorted=False)


def route(x: torch.Tensor, w: dict[str, torch.Tensor], cfg: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, hidden) -> (weights (N, k), expert indices (N, k)), scaled by `routed_scaling_factor`."""
    k = cfg.num_experts_per_token
    if cfg.router in FP32_ROUTERS:
        # NOTE(invariance): our linear, not F.linear: MKL's fp32 GEMV for one row sums in another order
        logits = linear(x.float(), unpack(w["router"]).float())
        if cfg.router == "sigmoid_grouped":
            weights, indices = _sigmoid_grouped(logits, w["router_bias"], cfg)
        else:
            weights, indices = _softmax_deepseek_v2(logits, cfg)
    elif cfg.router == "softmax_topk":  # Mixtral, Qwen-MoE, OLMoE
        probs = linear(x, w["router"]).softmax(dim=-1, dtype=torch.float32)
        weights, indices = probs.topk(k, dim=-1)
        if cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    else:  # topk_softmax, gpt-oss: the top k logits, softmax over those
        top, indices = linear(x, w["router"], w["router_bias"]).topk(k, dim=-1)
        weights = top.softmax(dim=1, dtype=top.dtype)
    if cfg.routed_scaling_factor != 1.0:
        weights = weights * cfg.routed_scaling_factor
    return weights, indices


def swiglu(x: torch.Tensor, gate, up, down, product=linear) -> torch.Tensor:
    return product(silu(product(x, gate), inplace=True) * product(x, up), down)


def clamped_swiglu(x: torch.Tensor, w: dict[str, torch.Tensor], pre: str, cfg: MoEConfig,
                   phase: Phase | None = None) -> torch.Tensor:
    """gpt-oss's expert: gate clamped above at `limit`, up to +-limit, `(up + 1) * gate * sigmoid(alpha * gate)`.
    `phase`: the tokens' (an expert's gathered tokens are 2-d: their shape does not say it)."""
    gate = linear(x, w[pre + "gate_proj"], w[pre + "gate_bias"], phase=phase).clamp(min=None, max=cfg.swiglu_limit)
    up = linear(x, w[pre + "up_proj"], w[pre + "up_bias"], phase=phase).clamp(min=-cfg.swiglu_limit,
                                                                             max=cfg.swiglu_limit)
    glu = gate * sigmoid(gate * cfg.swiglu_alpha)
    return linear((up + 1) * glu, w[pre + "down_proj"], w[pre + "down_bias"], phase=phase)


def expert_linear(x: torch.Tensor, w, phase: Phase) -> torch.Tensor:
    """x (m, in) @ w (out, in).T for a routed expert's m tokens in `phase`. A prompt's tokens on a
    plain 16-bit matrix, on a CPU without a fast 16-bit GEMM (AVX2), multiply in fp32 and round
    once (`row_products.rows_product`, rows padded so a row's bits do not depend on m): torch's bf16 GEMM
    there takes each row alone, 2.5-4x slower at 16-64 rows (768x2048 experts, 1 thread, Zen 2).
    Decode keeps the dense kind's (converting the matrix costs 4-6x its one-row product). Else
    `linear` in `phase`, not the one x's 2-d shape says (a prompt's 4-bit experts take the prompt kernel)."""
    if (phase is Phase.DECODE or x.device.type != "cpu" or x.dtype == torch.float32
            or type(w) is not torch.Tensor or w.is_mkldnn or fast_dense_gemm(x)):
        return linear(x, w, phase=phase)
    return rows_product(x, w.t())


def _expert(x: torch.Tensor, w: dict[str, torch.Tensor], e: int, cfg: MoEConfig, phase: Phase) -> torch.Tensor:
    """Expert e on its tokens x (in `phase`), computed where its weights are (an offloaded expert
    handed over in host memory runs on the CPU: its tokens go there and its output comes back)."""
    pre = f"experts.{e}."
    where = getattr(w[pre + "down_proj"], "device", x.device)  # an Int4Twin is always on the CPU
    if where != x.device:
        return _expert(x.to(where), w, e, cfg, phase).to(x.device)
    if cfg.experts == "clamped_swiglu":
        return clamped_swiglu(x, w, pre, cfg, phase)
    return swiglu(x, w[pre + "gate_proj"], w[pre + "up_proj"], w[pre + "down_proj"],
                  functools.partial(expert_linear, phase=phase))


def routed_picks(w, indices: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """The experts `indices` (N, k) route to, in order, each with its picks' flat (token * k +
    slot) positions, in token order: one stable sort for all experts (MoE-Gen's grouping), not a
    scan of `indices` per expert. `w` is told, with each expert's token count, where it takes the
    hint (`routed_to`: weights that load on demand fetch them together, a profile counts them); a
    dict needs none."""
    flat = indices.reshape(-1)
    order = flat.argsort(stable=True)  # by expert; within one, by token (the picks' flat order)
    experts, counts = flat.unique(return_counts=True)
    experts, counts = experts.tolist(), counts.tolist()
    routed_to = getattr(w, "routed_to", None)
    if routed_to is not None:
        routed_to(dict(zip(experts, counts)))
    return list(zip(experts, order.split(counts)))


def _fused_experts(x: torch.Tensor, cfg: MoEConfig, phase: Phase):
    """The native kernel for SwiGLU experts on x in `phase`, or None (`expert_linear`'s products run):
    decode's (`kernels.half_gemv`) and, on a CPU without a fast 16-bit GEMM, a prompt's
    (`kernels.half_gemm`: all an expert's tokens in one call, its weights converted once)."""
    if cfg.experts == "clamped_swiglu" or x.device.type != "cpu" or x.dtype not in half_gemv.DTYPES:
        return None
    if phase is Phase.DECODE:
        return decode_expert_kernel()
    return None if fast_dense_gemm(x) else prompt_expert_kernel()


def decode_expert_kernel() -> half_gemv.HalfGemv | None:
    """This process's 16-bit decode kernel (`kernels.half_gemv`), None where it does not load."""
    return loader.chosen().get("half_gemv")


def prompt_expert_kernel():
    """This process's 16-bit prompt kernel (`kernels.half_gemm`), None where it does not load."""
    return loader.chosen().get("half_gemm")


def routed_sum(w, flat: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, cfg: MoEConfig,
               phase: Phase) -> torch.Tensor:
    """The routed experts' weighted outputs summed per token, each expert once on the tokens that
    chose it; a token's sum is rounded to the dtype after each expert, in expert order. (The machine
    profile times this, `hardware.expert_probes`: the planner's expert rates are what it runs at.)

    A decode step computes first the experts whose weights are here (`w.ready_first`, weights read
    on demand: those still being read wait their turn), so their work overlaps the reads: one
    computed ahead of an expert before it keeps its own rounded terms (`_ExpertTerms`), added at its
    turn, so the sums are the same bits in any order."""
    out = torch.zeros_like(flat)
    done = getattr(w, "expert_done", None)  # weights that stream experts take each back once used
    kernel = _fused_experts(flat, cfg, phase)
    pick_weights = weights.reshape(-1).float().contiguous()
    picks = dict(routed_picks(w, indices))
    ready_first = getattr(w, "ready_first", None) if phase is Phase.DECODE else None
    if ready_first is not None and hasattr(w, "routed_inputs"):  # the next layer's reads may start now
        w.routed_inputs(flat)
    terms = _ExpertTerms(out, list(picks), indices.shape[1])
    for expert in (ready_first(list(picks)) if ready_first is not None else picks):
        pre = f"experts.{expert}."
        mats = (w[pre + "gate_proj"], w[pre + "up_proj"], w[pre + "down_proj"]) if kernel is not None else ()
        fused = kernel is not None and kernel.takes_expert(flat, *mats)
        x, pick, slots, pick_w, target = terms.target(expert, flat, picks[expert], pick_weights)
        if fused:  # the same roundings in one call
            kernel.expert_swiglu(x, *mats, pick, slots, pick_w, target)
        else:
            token_idx = pick // slots
            y = _expert(x[token_idx], w, expert, cfg, phase)
            target.index_add_(0, token_idx, (y * pick_w[pick, None]).to(target.dtype))
        terms.computed(expert)
        if done is not None:
            done(expert)
    return out


class _ExpertTerms:
    """Where each expert's weighted terms go as `routed_sum` computes experts in any order: into
    `out` when every expert before it (in `order`) is added, else into its own zeroed rows, one per
    token that picked it, added into `out` (one rounding each, as the in-order add) at its turn.
    `out` is never -0 (it starts +0; x + -x rounds to +0), so a term's +-0 adds the same either way."""

    def __init__(self, out: torch.Tensor, order: list[int], slots: int):
        self.out, self.order, self.slots = out, order, slots
        self.added = 0  # order[:added] are in out
        self.ahead: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # expert -> (its token rows, its terms)

    def target(self, expert: int, flat: torch.Tensor, pick: torch.Tensor, pick_weights: torch.Tensor):
        """(token rows, their picks, slots, the picks' weights, rows to add into) for computing
        `expert`'s terms now: the layer's, or its picks' own (one slot a row)."""
        if self.order[self.added] == expert:
            return flat, pick, self.slots, pick_weights, self.out
        token_idx = pick // self.slots
        rows = torch.zeros((len(pick), flat.shape[1]), dtype=flat.dtype)
        self.ahead[expert] = (token_idx, rows)
        return flat[token_idx], torch.arange(len(pick)), 1, pick_weights[pick], rows

    def computed(self, expert: int) -> None:
        if self.order[self.added] == expert:
            self.added += 1
        while self.added < len(self.order) and self.order[self.added] in self.ahead:
            token_idx, rows = self.ahead.pop(self.order[self.added])
            self.out.index_add_(0, token_idx, rows)
            self.added += 1


def moe_ffn(w: dict[str, torch.Tensor], x: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    """The MoE FFN of one layer on x (n, T, hidden)."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])  # (N, hidden)
    weights, indices = route(flat, w, cfg)
    out = routed_sum(w, flat, weights, indices, cfg, phase_of(x))
    out = out.view(shape)
    if cfg.has_shared:
        shared = swiglu(x, w["shared_gate_proj"], w["shared_up_proj"], w["shared_down_proj"])
        if cfg.shared_expert_gate:
            shared = sigmoid(linear(x, w["shared_expert_gate"])) * shared
        out = out + shared
    return out
