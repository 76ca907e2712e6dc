"""`placement.TensorTable`, the per-tensor table a family builds from its weight list: it holds every
weight once, at the bytes its checkpoint stores, and `ModelSpec`'s sizes (its sums) are the tensors
transformers allocates, on every family the tests make."""

import dataclasses

import pytest

from flexlamps.models.config import ModelConfig
from flexlamps.models.description import model_spec, stored_bytes, tensor_table
from flexlamps.models.families import family_for
from flexlamps.models.weight_specs import weight_specs
from placement import ModelSpec
from placement.tensor_table import TensorRow, TensorTable
from quant.fp8_layout import fp8_weight_bytes
from tests.checkpoints import CHECKPOINTS, checkpoint_fields

FP8 = {"quant_method": "fp8", "weight_block_size": [16, 32]}  # tiles the tiny matrices do not divide


def _hf(kind: str) -> dict:
    """The config.json transformers writes for `kind`'s fields."""
    import transformers

    fields = {**checkpoint_fields(kind), "vocab_size": 320, "pad_token_id": None}
    return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields).to_dict()


CASES = sorted(CHECKPOINTS)


def _config(kind: str, **extra) -> ModelConfig:
    hf = _hf(kind)
    if kind.endswith("_mxfp4"):
        hf["quantization_config"] = {"quant_method": "mxfp4"}
    return ModelConfig.from_hf({**hf, **extra})


@pytest.mark.parametrize("kind", CASES)
def test_the_table_holds_every_weight_once_at_its_stored_bytes(kind):
    cfg = _config(kind)
    table, specs = tensor_table(cfg), weight_specs(cfg)
    assert sum(r.instances for r in table.rows) == len(specs)
    assert table.total_params() == sum(s.numel for s in specs)
    assert table.total_bytes() == sum(stored_bytes(cfg, s) for s in specs)
    for i in range(cfg.num_layers):
        assert table.layer_params(i) == sum(s.numel for s in specs if s.layer == i)


@pytest.mark.parametrize("kind", CASES)
def test_the_model_specs_sizes_are_the_tensors_transformers_allocates(kind):
    """What the planner sizes (ModelSpec, summing the table) is every parameter and persistent
    buffer of transformers' model of that config (on the meta device), tied weights once."""
    torch = pytest.importorskip("torch")
    import transformers

    spec = model_spec(_config(kind))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**_hf(kind)))
    saved = set(model.state_dict())
    real = sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for name, b in model.named_buffers() if name in saved)
    if kind.endswith("_mxfp4"):  # the same tensors, the experts' matrices stored 4-bit
        assert spec.tensors.total_params() == real
    else:
        assert spec.total_weight_bytes() == real * spec.dtype_bytes
    in_layers = sum(t.numel() for name, t in model.state_dict().items() if ".layers." in name)
    assert spec.layer_param_count() * spec.num_layers == in_layers


@pytest.mark.parametrize("kind", CASES)
def test_one_arch_vocabulary_the_familys_forward(kind):
    cfg = _config(kind)
    assert cfg.arch == family_for(cfg.model_type).forward == model_spec(cfg).arch


def test_an_fp8_checkpoints_matrices_take_their_codes_and_tile_scales():
    cfg = _config("deepseek_v3", quantization_config=FP8)
    table, dense = tensor_table(cfg), tensor_table(_config("deepseek_v3"))
    assert cfg.storage.fp8_block == (16, 32) and table.total_params() == dense.total_params()
    for row in table.rows:
        fp8 = row.layers and row.kind in ("linear", "absorbed") and len(row.shape) == 2
        expected = fp8_weight_bytes(*row.shape, (16, 32)) if fp8 else row.numel * 2  # bf16: the stored dtype
        assert row.stored_bytes == expected, row.name


def test_a_layers_routed_experts_share_one_row_and_a_token_multiplies_k_of_them():
    cfg = _config("qwen3_moe")
    moe = cfg.moe
    routed = [r for r in tensor_table(cfg).rows if r.routed]
    assert {r.name for r in routed} == {"experts.gate_proj", "experts.up_proj", "experts.down_proj"}
    assert all(r.copies == moe.num_experts and r.active == moe.num_experts_per_token for r in routed)
    layer = routed[0].layers[0]
    assert tensor_table(cfg).layer_flops_per_token(layer) == sum(  # norms' and biases' work counted alike
        2 * s.numel * (moe.num_experts_per_token / moe.num_experts if ".experts." in s.name else 1)
        for s in weight_specs(cfg) if s.layer == layer)


def test_the_table_rides_on_the_model_spec_through_json_and_a_new_dtype():
    spec = model_spec(_config("deepseek_v32"))
    assert ModelSpec.from_json(spec.to_json()) == spec
    wide = dataclasses.replace(spec, dtype="fp32")  # bf16 stored: every tensor twice the bytes
    assert wide.tensors.dtype == "fp32" and wide.total_weight_bytes() == 2 * spec.total_weight_bytes()
    fp8 = model_spec(_config("deepseek_v3", quantization_config=FP8))
    fp8_matrices = sum(r.stored_bytes * r.instances for r in fp8.tensors.rows if r.encoding == "fp8")
    assert dataclasses.replace(fp8, dtype="fp32").total_weight_bytes() == 2 * fp8.total_weight_bytes() - fp8_matrices


def test_a_row_refuses_an_unknown_kind_and_a_layer_the_model_lacks():
    with pytest.raises(ValueError, match="kind must be one of"):
        TensorRow(name="w", shape=(2, 2), kind="matrix", stored_bytes=8)
    row = TensorRow(name="w", shape=(2, 2), kind="linear", layers=(3,), stored_bytes=8)
    with pytest.raises(ValueError, match="names layers"):
        TensorTable(num_layers=2, dtype="bf16", rows=(row,))
    assert dataclasses.replace(row, layers=(0, 1)).instances == 2
