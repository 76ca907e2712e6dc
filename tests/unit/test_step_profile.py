"""The decode-step profile counts the ops a step dispatches from Python, not the ops they run inside."""

from flexlamps import LLM
from flexlamps.engine.batch.step_profile import profile_decode_step


def test_profile_counts_top_level_ops(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", max_batch_size=2)
    layers = llm.config.num_layers
    p = profile_decode_step(llm.executor, batch=2, prompt_len=9, steps=3)
    calls = {name: n for name, n, _ in p.top_ops}
    assert calls["aten::rms_norm"] == 2 * layers + 1  # two per layer and the final one, not their insides
    assert "aten::pow" not in calls and "aten::mean" not in calls
    assert sum(calls.values()) == p.ops_per_step
    assert 0 < p.in_ops_s and 0 < p.wall_s and p.python_s == max(p.step_s - p.in_ops_s, 0.0)
    assert [s for _, _, s in p.top_ops] == sorted((s for _, _, s in p.top_ops), reverse=True)
