"""gpt-oss with its experts in MXFP4, as released: they stay 4-bit in memory, on every offload
tier and on disk, and compute what transformers computes from the same codes."""

import torch

from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from quant.mxfp4 import Mxfp4Weight
from tests.checkpoints import make_checkpoint

GiB = 2**30
ON_DISK = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=TierSplit(gpu=0.2, cpu=0.2, disk=0.6),
                 cache=TierSplit(gpu=1, cpu=0, disk=0), activations=TierSplit(gpu=1, cpu=0, disk=0))


def test_mxfp4_experts_stay_four_bit_in_memory_and_on_disk(tmp_path):
    import transformers
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    folder = make_checkpoint(tmp_path / "gpt_oss", "gpt_oss_mxfp4")
    reader = open_checkpoint(folder)
    weights = read_all(reader, torch.float32)
    experts = {n: w for n, w in weights.items() if ".experts." in n and n.endswith("_proj")}
    assert experts and all(isinstance(w, Mxfp4Weight) for w in experts.values())
    # the codes dequantize to the very weights transformers runs (its CPU load dequantizes them)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    gate_up = ref.model.layers[1].mlp.experts.gate_up_proj.data  # (E, hidden, 2 * width)
    assert torch.equal(experts["layers.1.experts.2.gate_proj"].dequantize(), gate_up[2, :, 0::2].T)
    assert torch.equal(experts["layers.1.experts.2.up_proj"].dequantize(), gate_up[2, :, 1::2].T)
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        blocks, scales = (f.get_tensor(f"model.layers.1.mlp.experts.down_proj_{s}") for s in ("blocks", "scales"))
    assert torch.equal(experts["layers.1.experts.4.down_proj"].dequantize(),
                       convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)[4].T)
    off = OffloadExecutor(reader, ON_DISK, model_spec=model_spec(reader.config),
                          gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    try:
        on_disk = [n for n in experts if off.tiers[n] == "disk"]
        assert on_disk
        import json

        index = json.loads(next((tmp_path / "off").rglob("index.json")).read_text())
        for name in on_disk:  # codes and scales on disk, no dense copy
            rows, cols = experts[name].shape
            assert index[f"{name}::mxfp4.codes"] == {"dtype": "uint8", "shape": [rows, cols // 2]}
            assert index[f"{name}::mxfp4.scales"] == {"dtype": "uint8", "shape": [rows, cols // 32]}
            assert name not in index
        fetched, staged = off.store.fetch(on_disk[:1])
        assert isinstance(fetched[on_disk[0]], Mxfp4Weight)
        off.store.release(staged)
    finally:
        off.close()
