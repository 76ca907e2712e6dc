"""`placement.TensorTable`, the per-tensor table a family builds from its weight list: it holds every
weight once, and its sums are the sizes `ModelSpec` derives from shape numbers, on every family the
tests make (the tensors ModelSpec's arithmetic does not count named)."""

import dataclasses

import pytest

from flexlamps.models.config import ModelConfig
from flexlamps.models.description import model_spec, stored_bytes, tensor_table
from flexlamps.models.weight_specs import weight_specs
from placement import ModelSpec
from placement.tensor_table import TensorRow, TensorTable
from quant.fp8_layout import fp8_weight_bytes
from tests.checkpoints import DENSE_DEFAULTS, GROUPS, checkpoint_fields

# tensors ModelSpec's shape arithmetic leaves out: LLaMA's mlp_bias, Gemma's norms after each block
NOT_IN_MODEL_SPEC = {"gate_bias", "up_bias", "down_bias", "post_attn_norm", "post_mlp_norm"}
FP8 = {"quant_method": "fp8", "weight_block_size": [16, 32]}  # tiles the tiny matrices do not divide


def _hf(fields: dict) -> dict:
    """The config.json transformers writes for these fields."""
    import transformers

    fields = {"vocab_size": 320, **fields}
    return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields).to_dict()


def _own_fields(kind: str) -> dict:
    """A kind's fields less the dense checkpoints' defaults (transformers' class defaults then apply)."""
    return {k: v for k, v in checkpoint_fields(kind).items() if k not in DENSE_DEFAULTS or DENSE_DEFAULTS[k] != v}


CASES = {kind: _own_fields(kind) for group in ("family", "moe", "deepseek", "hybrid") for kind in GROUPS[group]}


def _config(kind: str, **extra) -> ModelConfig:
    hf = _hf(CASES[kind])
    if kind.endswith("_mxfp4"):
        hf["quantization_config"] = {"quant_method": "mxfp4"}
    return ModelConfig.from_hf({**hf, **extra})


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_table_holds_every_weight_once_at_its_stored_bytes(kind):
    cfg = _config(kind)
    table, specs = tensor_table(cfg), weight_specs(cfg)
    assert sum(r.instances for r in table.rows) == len(specs)
    assert table.total_params() == sum(s.numel for s in specs)
    assert table.total_bytes() == sum(stored_bytes(cfg, s) for s in specs)
    for i in range(cfg.num_layers):
        assert table.layer_params(i) == sum(s.numel for s in specs if s.layer == i)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_tables_sums_are_the_model_specs_sizes(kind):
    cfg = _config(kind)
    spec, table = model_spec(cfg), tensor_table(cfg)
    missed = sum(r.numel * r.instances for r in table.rows if r.name in NOT_IN_MODEL_SPEC)
    assert missed == 0 or kind in ("llama_bias", "gemma2", "gemma3_text")
    assert table.model_bytes() == spec.embedding_bytes()
    assert table.layers_params() - missed == pytest.approx(cfg.num_layers * spec.layer_param_count(), abs=1e-6)
    assert table.total_bytes() - missed * spec.dtype_bytes == pytest.approx(spec.total_weight_bytes(), abs=1e-6)
    active = sum(table.layer_active_params(i) for i in range(cfg.num_layers)) - missed
    assert active == pytest.approx(cfg.num_layers * spec.layer_param_count(active_only=True), abs=1e-6)


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
    assert tensor_table(cfg).layer_flops_per_token(0) == sum(
        2 * s.numel * (moe.num_experts_per_token / moe.num_experts if ".experts." in s.name else 1)
        for s in weight_specs(cfg) if s.layer == 0 and s.role in ("linear", "router"))


def test_the_table_rides_on_the_model_spec_through_json():
    spec = model_spec(_config("deepseek_v32"))
    assert spec.tensors is not None and ModelSpec.from_json(spec.to_json()) == spec


def test_a_row_refuses_an_unknown_kind_and_a_layer_the_model_lacks():
    with pytest.raises(ValueError, match="kind must be one of"):
        TensorRow(name="w", shape=(2, 2), kind="matrix", stored_bytes=8)
    row = TensorRow(name="w", shape=(2, 2), kind="linear", layers=(3,), stored_bytes=8)
    with pytest.raises(ValueError, match="names layers"):
        TensorTable(num_layers=2, rows=(row,))
    assert dataclasses.replace(row, layers=(0, 1)).instances == 2
