"""The uninterrupted generation of an augmented request, to check the engine against.

One request alone in a dense cache, greedy: decode each segment's tokens, append the call's
returned tokens, go on; no pause, no swap, no recompute. The augmented engine must produce
exactly this token sequence whatever its policy did with the cache during the calls.
"""

from __future__ import annotations

import torch

from flexlamps.engine.augmented.workload import TokenizedRequest, total_tokens


def uninterrupted_tokens(executor, request: TokenizedRequest) -> list[int]:
    """Prompt, sampled and returned tokens of `request`, in order (greedy)."""
    cache = executor.new_cache(1, total_tokens(request.spec) + 1)
    tokens, computed = list(request.prompt_ids), 0
    slots = torch.zeros(1, dtype=torch.long, device=executor.device)
    for seg, returned in zip(request.spec.segments, request.returned_ids):
        for _ in range(seg.completion_tokens):
            chunk = tokens[computed:]
            ids = torch.tensor([chunk], device=executor.device)
            pos = torch.arange(computed, len(tokens), device=executor.device)[None]
            last = torch.tensor([len(chunk) - 1], device=executor.device)
            logits = executor.forward(cache, ids, pos, slots, last)
            computed = len(tokens)
            tokens.append(int(logits[0, 0].argmax()))
        tokens.extend(returned)
    return tokens
