"""One recipe for the tiny random checkpoints every test builder saves (tests/conftest.py,
family_models.py, moe_models.py, deepseek_models.py, hybrid_models.py): a tiny tokenizer, a
model built by transformers from its own config class, its weights widened, saved in Hugging
Face format."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tests.conftest import save_tiny_tokenizer

# buffers drawn with the weights: DeepSeek-V3 / GLM-4.5's routing bias (zeros would leave the
# sigmoid router's correction untested)
WIDENED_BUFFERS = ("e_score_correction_bias",)


def save_random_checkpoint(folder: Path, make_config: Callable[[dict], object], *, seed: int = 0,
                           dtype: str = "float32", init_std: float = 0.2, keep: tuple[str, ...] = ()) -> Path:
    """Save into `folder` a tiny tokenizer and a random model of `make_config(ids)` (a transformers
    config; `ids`: vocab_size, bos_token_id and eos_token_id of the tokenizer, to spread into it).
    Every parameter but those whose names end in `keep`, and the WIDENED_BUFFERS, is drawn from
    N(0, init_std) after `torch.manual_seed(seed)` (transformers' init is too small for logits to
    differ and routing to matter); the model is saved in `dtype`."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    ids = dict(vocab_size=save_tiny_tokenizer(folder), bos_token_id=0, eos_token_id=1)
    cfg = make_config(ids)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(keep):
                p.normal_(0.0, init_std)
        for name, b in model.named_buffers():
            if name.endswith(WIDENED_BUFFERS):
                b.normal_(0.0, init_std)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    return folder
