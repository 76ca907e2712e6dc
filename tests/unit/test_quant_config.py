"""QuantConfig: validation, JSON round trip, torch-free import, import boundaries."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
import torch

from quant import KV_CACHE_DEFAULT, WEIGHT_DEFAULT, QTensor, QuantConfig, quantize
from tests.conftest import REPO

ROOT = REPO


def test_json_round_trip():
    cfg = QuantConfig(bits=8, group_size=32, group_dim=-1, symmetric=True)
    assert QuantConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("kwargs, match", [({"bits": 3}, "bits=3"), ({"group_size": 0}, "group_size=0")])
def test_invalid_configs_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QuantConfig(**kwargs)


def test_unknown_json_field_is_named():
    with pytest.raises(ValueError, match="groupsize"):
        QuantConfig.from_json('{"groupsize": 64}')


def test_group_dim_out_of_range_is_named():
    with pytest.raises(ValueError, match="group_dim=2"):
        quantize(torch.zeros(4, 4), QuantConfig(group_dim=2))


def test_defaults_follow_flexgen():
    assert (WEIGHT_DEFAULT.bits, WEIGHT_DEFAULT.group_size, WEIGHT_DEFAULT.group_dim) == (4, 64, 0)
    assert KV_CACHE_DEFAULT.resolve_dim(4) == 3 and not KV_CACHE_DEFAULT.symmetric


def test_fp16_weight_is_4_5_bits_per_element():
    # 4-bit codes + fp16 scale + fp16 min per 64 elements = 4.5 bits = 0.28125x fp16
    assert WEIGHT_DEFAULT.packed_nbytes((576, 1536), "float16") / (576 * 1536 * 2) == pytest.approx(0.28125)


@pytest.mark.parametrize("param_bits", [16, 8])
def test_qtensor_safetensors_round_trip(tmp_path, param_bits):
    from safetensors.torch import load_file, save_file

    x = torch.randn(65, 9, dtype=torch.bfloat16)
    qt = quantize(x, QuantConfig(group_dim=0, param_bits=param_bits))
    save_file(qt.to_tensors(prefix="w."), tmp_path / "q.safetensors")
    back = QTensor.from_tensors(load_file(tmp_path / "q.safetensors"), prefix="w.")
    assert back.shape == qt.shape and back.dtype == qt.dtype and back.config == qt.config
    assert torch.equal(back.dequantize(), qt.dequantize())
    with pytest.raises(KeyError, match="codes"):
        QTensor.from_tensors({}, prefix="w.")


def test_qtensor_to_device_keeps_it_compressed():
    for config in (QuantConfig(), QuantConfig(param_bits=8)):
        qt = quantize(torch.randn(64, 4), config)
        moved = qt.to("cpu")
        assert isinstance(moved, QTensor) and moved.nbytes == qt.nbytes
        assert torch.equal(moved.dequantize(), qt.dequantize())


def test_import_quant_config_does_not_import_torch():
    code = "import quant, quant.config, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_quant_imports_nothing_from_flexlamps_offload_placement():
    forbidden = {"flexlamps", "offload", "placement"}
    for path in (ROOT / "quant").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"
