"""`flexlamps helm` with generate's engine options: an offloaded evaluation gives the same
per-instance results as the in-memory one (tiny model with a fixed policy; SmolLM2 planned
for the scoring workload under a budget far below its size, marked slow)."""

import json

import pytest
from click.testing import CliRunner

import flexlamps.commands.helm as helm_cmd

ROWS = [
    {"id": "a", "context": "the quick brown fox", "choices": ["jumps over the lazy dog", "is a number", "!"], "gold": 0},
    {"id": "b", "context": "numbers 0 1 2", "choices": ["3 4 5", "hello world"], "gold": 0},
    {"id": "c", "context": "Once upon a time there was", "choices": ["a model", "a tiny tokenizer", "9"], "gold": 0},
]


def _run(out, *args):
    res = CliRunner().invoke(helm_cmd.command, ["--suite", "s", "--output-path", str(out), *args],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


def _per_instance(run_dir):
    states = json.loads((run_dir / "scenario_state.json").read_text())["request_states"]
    return {(s["instance"]["id"], s["reference_index"]): s["result"]["completions"][0]["logprob"] for s in states}


def _compare(tmp_path, model, offload_args, abs_tol):
    f = tmp_path / "mine.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    exact = ("--dtype", "float32")  # the float reference, which the offload engine must equal
    _run(tmp_path / "mem", "--model", model, "--scenario-file", str(f), "--threads", "1", *exact)
    res = _run(tmp_path / "off", "--model", model, "--scenario-file", str(f), "--threads", "1", *exact, *offload_args)
    name = next((tmp_path / "mem" / "runs" / "s").glob("file:*")).name
    mem, off = (_per_instance(tmp_path / d / "runs" / "s" / name) for d in ("mem", "off"))
    assert mem.keys() == off.keys() and len(mem) == 8
    assert [off[k] for k in mem] == pytest.approx([mem[k] for k in mem], abs=abs_tol)
    picks = [json.loads((tmp_path / d / "runs" / "s" / name / "per_instance_stats.json").read_text()) for d in ("mem", "off")]
    pred = lambda per: {p["instance_id"]: [s["sum"] for s in p["stats"] if s["name"]["name"] == "predicted_index"]  # noqa: E731
                        for p in per}
    assert pred(picks[0]) == pred(picks[1])
    return res


def test_tiny_offloaded_to_disk_equals_in_memory(tmp_path, tiny_llama):
    from placement import Policy, TierSplit

    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, weights=TierSplit(gpu=0.2, cpu=0.3, disk=0.5),
                    cache=TierSplit(gpu=0, cpu=1, disk=0), activations=TierSplit(gpu=1, cpu=0, disk=0))
    pfile = tmp_path / "policy.json"
    pfile.write_text(policy.to_json())
    res = _compare(tmp_path, str(tiny_llama), ["--gpu-mem", "4MiB", "--cpu-mem", "64MiB", "--offload-dir",
                                               str(tmp_path / "offload"), "--policy", str(pfile)], 1e-4)
    assert any((tmp_path / "offload").iterdir())  # weights really went to the disk tier
    # the placement it ran is shown, as `generate` shows it
    assert "policy: block 2 x 2 | weights gpu 20% / cpu 30% / disk 50% | cache gpu 0% / cpu 100%" in res.output


@pytest.mark.slow
def test_smollm2_bigger_than_the_budget_equals_in_memory(tmp_path, smollm2_path):
    res = _compare(tmp_path, "smollm2-135m", ["--gpu-mem", "64MiB", "--cpu-mem", "256MiB", "--offload-dir",
                                              str(tmp_path / "offload")], 1e-3)
    assert "policy: block " in res.output and "predicted " in res.output  # planned for the scoring workload
