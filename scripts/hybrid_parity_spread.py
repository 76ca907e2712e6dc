"""How far float32 runs of a hybrid (gated DeltaNet) model are from each other and from float64,
over many tiny random checkpoints: ours, transformers' cached decode (its `generate` path: the prompt
in one forward, then one token a step), transformers' forward over the whole sequence, and that
forward in float64 (tests/hybrid_reference.py).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/hybrid_parity_spread.py --seeds 3,7,11,13,17,19,23,29

Each row: the max |logit difference| over the prompt and every greedy step (2 rows of a 12-token
prompt, 16 steps; tests/family_models.py), for each pair. The summary counts the checkpoints where
a pair is over --bar: how often transformers' two float32 paths disagree with each other by more
than the bar is what any other float32 implementation can be expected to miss it by.
--init-std: the weights' spread (0.2: the tests' checkpoints, where float32 rounding is amplified
~50x at some tokens; 0.02: transformers' own initializer_range).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' checkpoint builders

PAIRS = ("ours-decode", "ours-whole", "decode-whole", "ours-f64", "decode-f64", "whole-f64")
HELD_OUT = dict(hidden_size=80, intermediate_size=112, num_attention_heads=5, num_key_value_heads=1, head_dim=16)


def _make(folder: Path, kind: str, seed: int, init_std: float, held_out: bool) -> Path:
    from tests.checkpoints import make_checkpoint

    return make_checkpoint(folder, kind, seed, init_std=init_std, **(HELD_OUT if held_out else {}))


def gaps(folder: Path, seed: int) -> dict[str, float]:
    """Max |logit difference| of each pair in PAIRS on one checkpoint."""
    import transformers

    from flexlamps.engine.executors.in_memory import InMemoryExecutor
    from flexlamps.models.loading.checkpoint import read_all
    from flexlamps.models.loading.registry import open_checkpoint
    from tests.family_models import our_run, prompt_ids, reference_run
    from tests.hybrid_reference import float64_logits

    reader = open_checkpoint(folder)
    ids = prompt_ids(reader.config.vocab_size, seed=seed)
    decode, tokens = reference_run(folder, ids)
    ours = our_run(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32), ids, tokens)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    sequence = torch.cat([ids, *tokens], dim=1)
    with torch.no_grad():
        whole = ref(sequence).logits.double()
    runs = {"ours": torch.cat(ours, 1).double(), "decode": torch.cat(decode, 1).double(), "whole": whole,
            "f64": float64_logits(ref, sequence)}
    return {pair: (runs[pair.split("-")[0]] - runs[pair.split("-")[1]]).abs().max().item() for pair in PAIRS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="qwen3_next,qwen3_next_wide,qwen3_5_text,qwen3_5_text_wide")
    ap.add_argument("--seeds", default="3,7")
    ap.add_argument("--init-std", type=float, default=0.2)
    ap.add_argument("--widths", choices=["held-out", "tests"], default="held-out",
                    help="held-out: hidden 80 (tests/integration/test_held_out_parity.py); tests: tests/checkpoints.py")
    ap.add_argument("--bar", type=float, default=1e-4)
    a = ap.parse_args()
    torch.manual_seed(0)
    over = {pair: 0 for pair in PAIRS}
    worst = {pair: 0.0 for pair in PAIRS}
    cases = [(kind, int(seed)) for kind in a.kinds.split(",") for seed in a.seeds.split(",")]
    print("checkpoint".ljust(28) + "".join(p.rjust(14) for p in PAIRS))
    with tempfile.TemporaryDirectory() as tmp:
        for kind, seed in cases:
            folder = _make(Path(tmp) / f"{kind}_{seed}", kind, seed, a.init_std, a.widths == "held-out")
            row = gaps(folder, seed)
            print(f"{kind} seed {seed}".ljust(28) + "".join(f"{row[p]:14.2e}" for p in PAIRS), flush=True)
            for pair in PAIRS:
                over[pair] += row[pair] > a.bar
                worst[pair] = max(worst[pair], row[pair])
    print(f"over {a.bar:g} (of {len(cases)})".ljust(28) + "".join(f"{over[p]:14d}" for p in PAIRS))
    print("max".ljust(28) + "".join(f"{worst[p]:14.2e}" for p in PAIRS))


if __name__ == "__main__":
    main()
