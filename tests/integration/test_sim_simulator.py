import json
import subprocess
import sys

import pytest

import flexlamps.sim.simulator as simulator_mod
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.scheduler import SchedulerConfig
from flexlamps.sim.run import run_policy
from flexlamps.sched.records import RequestRecord
from flexlamps.sim.synthetic import synthetic_specs


def tight():
    return SchedulerConfig(num_gpu_blocks=96, num_cpu_blocks=16, block_size=8, max_num_seqs=32,
                           max_num_batched_tokens=512)


def test_fast_forward_matches_step_by_step(monkeypatch):
    specs = synthetic_specs(n=60, qps=3.0, seed=2)
    fast = run_policy(specs, "infercept", 3.0, config=tight())
    monkeypatch.setattr(simulator_mod, "MAX_FAST_FORWARD", 1)
    slow = run_policy(specs, "infercept", 3.0, config=tight())
    assert fast.simulator.stats.schedule_calls < slow.simulator.stats.schedule_calls
    assert fast.simulator.stats.decode_tokens == slow.simulator.stats.decode_tokens
    assert fast.summary.e2e_mean == pytest.approx(slow.summary.e2e_mean, rel=0.02)
    assert fast.summary.ttft_mean == pytest.approx(slow.summary.ttft_mean, rel=0.05)


def test_every_output_token_is_computed_once_per_sample():
    specs = synthetic_specs(n=40, qps=4.0, seed=9)
    res = run_policy(specs, "lamps", 4.0, config=tight())
    st = res.simulator.stats
    total_out = sum(s.output_tokens for s in specs)
    samples_from_prefill = sum(1 + sum(1 for seg in s.segments if seg.api_type) for s in specs)
    # each segment's first token comes from a prefill step; the rest from decode steps
    assert st.decode_tokens == total_out - samples_from_prefill
    assert st.prefill_tokens >= sum(s.prompt_tokens for s in specs)
    assert res.summary.num_requests == len(specs)


def test_metrics_definitions():
    specs = synthetic_specs(n=30, qps=1.0, seed=4)
    res = run_policy(specs, "infercept", 1.0, config=tight())
    for r in res.records:
        assert r.normalized == pytest.approx((r.e2e - r.api_seconds) / r.output_tokens)
        assert r.e2e >= r.api_seconds  # a request cannot finish before its calls return
    s = res.summary
    assert s.e2e_p50 <= s.e2e_p99 and s.ttft_mean > 0 and s.throughput_tps > 0


def test_lamps_beats_fcfs_under_memory_pressure():
    specs = synthetic_specs(n=150, qps=12.0, seed=11, max_output=60)
    cfg = SchedulerConfig(num_gpu_blocks=64, num_cpu_blocks=16, block_size=8, max_num_seqs=32,
                          max_num_batched_tokens=512)
    e2e = {p: run_policy(specs, p, 12.0, config=cfg).summary.e2e_mean for p in ("fcfs", "infercept", "lamps")}
    assert e2e["lamps"] < e2e["fcfs"]
    assert e2e["lamps"] <= e2e["infercept"] * 1.02


def test_cost_model_json_round_trip_and_decode_run(tmp_path):
    cost = CostModel.gptj6b_a100()
    assert cost.kv_bytes_per_token == 2 * 28 * 4096 * 2
    assert 40_000 < cost.gpu_kv_tokens < 60_000
    path = tmp_path / "cost.json"
    cost.save(str(path))
    assert CostModel.load(str(path)) == cost
    steps = [cost.step_time(0, 8, 1000 + 8 * j) for j in range(5)]
    assert cost.decode_run_time(8, 1000, 5) == pytest.approx(sum(steps))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**cost.to_json(), "typo_s": 1}))
    with pytest.raises(ValueError, match="typo_s"):
        CostModel.load(str(bad))


def test_sched_and_sim_do_not_import_torch():
    code = ("import sys, flexlamps.sched, flexlamps.sim.run, flexlamps.workloads.trace, flexlamps.workloads.tokenized, "
            "flexlamps.commands.simulate; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_waiting_time_is_accounted():
    from flexlamps.sched.request import RequestSpec, Segment
    # a 64-token gpu tier holds one of these 50-token requests at a time: the second waits in
    # the queue exactly until the first one finishes
    specs = [RequestSpec(f"r{i}", 40, (Segment(10),), arrival_time=0.0) for i in range(2)]
    cfg = SchedulerConfig(num_gpu_blocks=8, num_cpu_blocks=0, block_size=8, max_num_seqs=4,
                          max_num_batched_tokens=512)
    res = run_policy(specs, "infercept", 1.0, config=cfg)
    first = min(r.finish for r in res.records)
    assert res.simulator.stats.waiting_s == pytest.approx(first)
    assert max(r.ttft for r in res.records) >= first


def _record(i, arrival, e2e, tokens=10):
    return RequestRecord(f"r{i}", "qa", "c", arrival, arrival + 0.1, arrival + e2e, tokens, 0.0, 0)


def test_steady_state_excludes_warmup_cooldown_and_the_drain():
    from flexlamps.sim.steady import steady_state

    # 1 req/s over [0, 99], each 2 s long: stable, achieved = offered
    flat = [_record(i, float(i), 2.0) for i in range(100)]
    st = steady_state(flat, "p", 1.0, warmup=0.1, cooldown=0.2)
    assert st.span == pytest.approx((9.9, 79.2)) and st.measured == 70  # arrivals 10..79
    assert st.offered_rps == pytest.approx(70 / 69.3) and st.achieved_rps == pytest.approx(st.offered_rps)
    assert st.growth == pytest.approx(1.0) and st.stable
    # the drain does not count: completions after the last arrival are outside the span
    assert st.summary.throughput_rps == pytest.approx(st.achieved_rps)
    # a queue that grows: latency rises with the time the system has run -> unstable
    growing = [_record(i, float(i), 2.0 + 0.5 * i) for i in range(100)]
    st = steady_state(growing, "p", 1.0)
    assert st.growth > 2 and not st.stable
    # longer API calls later on are not the server's doing: time inside calls is left out
    slow_calls = [_record(i, float(i), 2.0 + 0.5 * i) for i in range(100)]
    for r in slow_calls:
        r.api_seconds = r.e2e - 2.0
    st = steady_state(slow_calls, "p", 1.0)
    assert st.growth == pytest.approx(1.0) and st.stable
    with pytest.raises(ValueError, match="fractions"):
        steady_state(flat, "p", 1.0, warmup=0.6, cooldown=0.5)
