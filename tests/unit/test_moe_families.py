"""The MoE families read every config option transformers defines (or know it inert), and refuse
the ones they do not run by name, alike for generate and plan."""

import pytest

from flexlamps.models.config import ModelConfig, UnsupportedModelError
from tests.described import described
from flexlamps.models.families import family_for

MOE_CLASSES = {"mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig", "qwen3_moe": "Qwen3MoeConfig",
               "olmoe": "OlmoeConfig", "glm4_moe": "Glm4MoeConfig", "gpt_oss": "GptOssConfig"}


@pytest.mark.parametrize("model_type", sorted(MOE_CLASSES))
def test_every_config_field_transformers_defines_is_read_or_known_inert(model_type):
    import dataclasses

    transformers = pytest.importorskip("transformers")
    from flexlamps.models.families.hf_fields import INERT_FIELDS

    fields = {f.name for f in dataclasses.fields(getattr(transformers, MOE_CLASSES[model_type]))}
    assert fields - family_for(model_type).reads - INERT_FIELDS == set()


@pytest.mark.parametrize("model_type,field,value", [
    ("olmoe", "clip_qkv", 8.0), ("deepseek_v2", "topk_method", "noaux_tc"), ("deepseek_v2", "norm_topk_prob", True)])
def test_options_we_do_not_run_are_refused_alike_by_generate_and_plan(model_type, field, value):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoConfig.for_model(model_type, **{field: value}).to_dict()
    with pytest.raises(UnsupportedModelError, match=field) as by_generate:
        ModelConfig.from_hf(hf)
    with pytest.raises(UnsupportedModelError) as by_plan:
        described(hf)[1]
    assert str(by_generate.value) == str(by_plan.value)
