"""The planner's ModelSpec of each MoE family (built from our model description) counts the
parameters transformers allocates: experts, shared experts and their gate, routers and biases."""

import pytest

from tests.checkpoints import GROUPS, checkpoint_fields


def _hf_config(kind: str, wide: bool) -> tuple[dict, object]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = checkpoint_fields(kind, wide)
    cfg = transformers.AutoConfig.for_model(fields.pop("model_type"), vocab_size=320, bos_token_id=0, eos_token_id=1,
                                            **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return cfg.to_dict(), model


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("kind", sorted(GROUPS["moe"]))
def test_moe_parameter_counts_match_transformers(kind, wide):
    from tests.described import described
    from flexlamps.models.config import ModelConfig
    from flexlamps.models.weight_specs import weight_specs

    hf, model = _hf_config(kind, wide)
    saved = set(model.state_dict())  # tied weights once; persistent buffers (score bias) are tensors
    total = sum(p.numel() for p in model.parameters())
    total += sum(b.numel() for name, b in model.named_buffers() if name in saved)
    spec = described(hf)[1]
    assert spec.num_experts > 0
    assert spec.total_weight_bytes() / spec.dtype_bytes == pytest.approx(total, abs=0.5)
    # the engine's own weight list holds the same parameters
    assert sum(s.numel for s in weight_specs(ModelConfig.from_hf(hf))) == total
