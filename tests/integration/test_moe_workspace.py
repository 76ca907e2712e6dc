"""A MoE layer's prompt transients stay within the compute workspace it is charged
(`placement.cost_memory.workspace_bytes`, which the planner prices and the sweep charges): the
bytes torch allocates while one micro-batch runs through a layer, counted op by op (the profiler's
allocation events) from the layer's start, peak at or under the charge. The routed experts'
gathers, their gate / up / down outputs, the weighted terms and the routed sum are what the
MoE FFN adds to a dense layer's; the allocator's own keeping (glibc's free heap) is the sweep's
heap policy (`sweep.trims_heap_after`), not this charge."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from flexlamps.engine.executors import sweep as sweep_module
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from tests.checkpoints import make_checkpoint

ROWS, TOKENS = 16, 64  # a prompt micro-batch of many rows: 1024 tokens over a handful of experts
ON_CPU = TierSplit(gpu=0.0, cpu=1.0, disk=0.0)
# gpt-oss's attention with sinks runs the exact fp32 path, whose scratch the workspace counts
# (`placement.attention_scratch`; before it, ~6x the charge on this checkpoint)
KINDS = ["qwen3_moe", "glm4_moe", "olmoe", "mixtral_many_experts", "qwen2_moe_many_experts", "gpt_oss"]


def _layer_peaks(ex, steps: list[Step]) -> list[tuple[int, int]]:
    """(allocation peak, charged workspace) in bytes of every layer step of one sweep."""
    charged, layer_step = [], sweep_module.Sweep._layer_step

    def marked(self, j, w, step, *rest):
        with record_function(f"layer_step_{len(charged)}"):
            ws = layer_step(self, j, w, step, *rest)
        charged.append(ws)
        return ws

    sweep_module.Sweep._layer_step = marked
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            ex.forward_steps(ex.new_cache(ROWS, TOKENS), steps)
    finally:
        sweep_module.Sweep._layer_step = layer_step
    events = prof.profiler.kineto_results.events()
    spans = sorted((e.start_ns(), e.end_ns()) for e in events if e.name().startswith("layer_step_"))
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    peaks = []
    for start, end in spans:
        live = peak = 0
        for _, nbytes in ((t, n) for t, n in memory if start <= t <= end):
            live += nbytes
            peak = max(peak, live)
        peaks.append(peak)
    return list(zip(peaks, charged))


@pytest.mark.parametrize("kind", KINDS)
def test_a_moe_prompt_layers_transients_fit_its_charged_workspace(kind, tmp_path):
    reader = open_checkpoint(make_checkpoint(tmp_path / kind, kind))
    policy = Policy(gpu_batch_size=ROWS, num_gpu_batches=1, weights=ON_CPU, cache=ON_CPU, activations=ON_CPU)
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config), gpu_mem=1 << 30, cpu_mem=1 << 30,
                         offload_dir=tmp_path / "off", dtype=torch.bfloat16)
    ids = torch.randint(2, reader.config.vocab_size, (ROWS, TOKENS), generator=torch.Generator().manual_seed(0))
    steps = [Step(ids, torch.arange(TOKENS).expand(ROWS, TOKENS), torch.arange(ROWS))]
    peaks = _layer_peaks(ex, steps)
    ex.close()
    assert len(peaks) == reader.config.num_layers
    assert all(0 < peak <= charged for peak, charged in peaks), peaks
