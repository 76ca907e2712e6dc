"""Live tool calls on the augmented engine (tiny random model): a request pauses for its tool and
resumes with the result as a new turn; a hanging, crashing or refused tool becomes the request's
tool result instead of stopping the run; every policy produces the same conversations."""

import functools
import json
import shutil
from dataclasses import dataclass, field

import pytest

from flexlamps.agents.chat import ChatTurns
from flexlamps.agents.run import LiveSettings, run_tasks
from flexlamps.agents.task import ToolCall
from flexlamps.api import LLM
from flexlamps.engine.augmented.run import AgentsConfig
from flexlamps.sched.cost_model import CostModel
from flexlamps.tools.sandbox import Limits, run_program

HANG = Limits(wall_s=1.0, cpu_s=2)  # the hang is cut at 1 s; the others end on their own, however loaded the box
QUICK = Limits(wall_s=120, cpu_s=2)
PROGRAMS = {
    "hang": "import time\ntime.sleep(60)",
    "crash": "import os\nos.abort()",
    "socket": "import socket\nsocket.socket()",
    "escape": "open('/tmp/flexlamps-live-escape', 'w')",
    "ok": "print(6 * 7)",
}


@pytest.fixture(scope="module")
def long_tiny(tiny_llama, tmp_path_factory):
    """The tiny llama with room for 1024 positions (rope needs no weights for them)."""
    folder = tmp_path_factory.mktemp("long_tiny") / "model"
    shutil.copytree(tiny_llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = 1024
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def llm(long_tiny):
    return LLM(str(long_tiny), dtype="float32")


@dataclass
class ScriptedTask:
    """Calls the tools named in `script`, one per segment, then ends."""
    task_id: str
    script: list[str]
    kind: str = "scripted"
    results: list = field(default_factory=list)
    segments: list[str] = field(default_factory=list)

    def messages(self):
        return [{"role": "user", "content": f"task {self.task_id}"}]

    def segment_done(self, text):
        return False

    def end_segment(self, text):
        self.segments.append(text)
        step = len(self.results)
        if step == len(self.script):
            return None
        name = self.script[step]
        return ToolCall(name, functools.partial(run_program, PROGRAMS[name], HANG if name == "hang" else QUICK))

    def tool_turn(self, call, result, can_continue):
        self.results.append((call.name, result.status, result.seconds))
        return "tool", result.text(80)

    def record(self):
        return {"task_id": self.task_id, "results": self.results}


def _tasks():
    return [ScriptedTask("a", ["hang", "ok"]), ScriptedTask("b", ["crash", "socket", "ok"]),
            ScriptedTask("c", ["ok", "escape"]), ScriptedTask("d", ["ok"]), ScriptedTask("e", [])]


def _config(llm, gpu_blocks=100, cpu_blocks=48, block=8):
    per_block = block * llm.config.kv_bytes_per_token(4)
    return AgentsConfig(gpu_kv_bytes=gpu_blocks * per_block, cpu_swap_bytes=cpu_blocks * per_block,
                        block_size=block, max_num_seqs=4, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def cost(llm):
    return CostModel(overhead_s=0.02, weights_read_s=0.0, prefill_per_token_s=1e-4, decode_per_seq_s=1e-3,
                     kv_read_per_token_s=1e-6, swap_bytes_per_s=1e9,
                     kv_bytes_per_token=llm.config.kv_bytes_per_token(4),
                     gpu_kv_tokens=100 * 8, cpu_swap_tokens=48 * 8, max_model_len=600)


SETTINGS = LiveSettings(max_new_tokens=6, max_context=600, workers=2, first_call_s=0.2)


@pytest.fixture(scope="module")
def runs(llm, cost):
    return {p: run_tasks(llm.executor, llm.tokenizer, _tasks(), p, _config(llm), cost, SETTINGS, check=True)
            for p in ("fcfs", "infercept", "lamps")}


def test_bad_tools_become_results_and_requests_resume(runs):
    run = runs["lamps"]
    by_id = {t.task_id: t for t in run.tasks}
    assert [s for _, s, _ in by_id["a"].results] == ["timeout", "ok"]
    hang_seconds = by_id["a"].results[0][2]
    assert 0.9 < hang_seconds < 30  # cut at its 1 s limit, long before its 60 s sleep
    assert [s for _, s, _ in by_id["b"].results] == ["killed", "error", "ok"]
    assert [s for _, s, _ in by_id["c"].results] == ["ok", "error"]
    # each request generated once more after every call: the run went on past each bad tool
    assert [len(by_id[t].segments) for t in "abcde"] == [3, 4, 3, 2, 1]
    records = {r.request_id: r for r in run.result.records}
    assert records["a"].num_calls == 2 and records["a"].api_seconds >= hang_seconds
    assert records["a"].e2e >= hang_seconds  # the request waited for its tool
    assert records["e"].num_calls == 0


def test_tool_results_are_turns_in_the_context(runs, llm):
    run = runs["lamps"]
    text = llm.tokenizer.decode(run.result.tokens["a"])
    assert "ran past its time limit" in text and "42" in text
    text = llm.tokenizer.decode(run.result.tokens["b"])
    assert "killed" in text and "network access" in text
    assert "outside the sandbox" in llm.tokenizer.decode(run.result.tokens["c"])
    assert text.count("tool: ") == 3  # the tiny template's tool turns


def test_every_policy_gives_the_same_conversations(runs):
    tokens = {p: r.result.tokens for p, r in runs.items()}
    assert tokens["fcfs"] == tokens["infercept"] == tokens["lamps"]
    assert runs["fcfs"].result.stats.strategies["discard"] > 0  # vLLM discards on every call
    assert sum(runs["lamps"].result.stats.strategies.values()) == 8  # one per call


def test_alone_equals_batched(llm, cost, runs):
    """Each task run by itself gives the conversation it had among the others."""
    for task in _tasks()[:2]:
        alone = run_tasks(llm.executor, llm.tokenizer, [task], "fcfs", _config(llm), cost, SETTINGS)
        assert alone.result.tokens[task.task_id] == runs["lamps"].result.tokens[task.task_id]


def test_the_predictor_learns_call_durations_per_tool(runs):
    """Durations are measured as the calls happen and kept per tool (the scheduler's api_time)."""
    predictor = runs["lamps"].predictor
    hang, ok = predictor.api_time("hang", None), predictor.api_time("ok", None)
    assert hang >= 0.9  # the hang ran to its 1 s limit
    assert ok != hang and ok != SETTINGS.first_call_s  # each tool's own (which is faster is the load's to say)
    assert predictor.api_time("never-called", None) == SETTINGS.first_call_s


def test_chat_turns_continue_the_template(llm):
    turns = ChatTurns(llm.tokenizer)
    assert turns.close == "\n"
    assert turns.turn_text("tool", "42") == "\ntool: 42\nassistant:"
    eos = llm.tokenizer.eos_token_ids[0]
    assert turns.turn_text("user", "hi", after_token=eos) == "\nuser: hi\nassistant:"
    ids = turns.turn_ids("tool", "x" * 500, None, max_tokens=40)
    assert len(ids) <= 40 and llm.tokenizer.decode(ids).endswith("xx\nassistant:")
    with pytest.raises(ValueError, match="no room"):
        turns.turn_ids("tool", "x" * 500, None, max_tokens=3)


def test_a_prompt_too_long_for_the_context_is_refused(llm, cost):
    task = ScriptedTask("long", [])
    with pytest.raises(ValueError, match="raise the context cap"):
        run_tasks(llm.executor, llm.tokenizer, [task], "lamps", _config(llm), cost,
                  LiveSettings(max_new_tokens=6, max_context=8))


def test_llm_run_agents_with_a_tools_file(llm, cost, tmp_path):
    module = tmp_path / "tools.py"
    module.write_text('def add(a: int, b: int):\n    """Add two integers."""\n    return a + b\n')
    run = llm.run_agents(["add 2 and 3", "add 4 and 5"], str(module), scheduler="lamps", max_new_tokens=6,
                         max_context=1000, cost=cost, check=True)
    assert [t.task_id for t in run.tasks] == ["0", "1"] and len(run.result.records) == 2
    assert all(t.answer is not None for t in run.tasks)  # the random model calls nothing: its text is the answer
    with pytest.raises(ValueError, match="need `tools`"):
        llm.run_agents(["add 2 and 3"])
    with pytest.raises(ValueError, match="defines no tool"):
        (tmp_path / "empty.py").write_text("X = 1\n")
        llm.run_agents(["hi"], str(tmp_path / "empty.py"))


def test_offloaded_engine_gives_the_same_conversations(long_tiny, cost, runs, tmp_path):
    """Weights over gpu / cpu / disk, the KV pool on the gpu tier and swaps on the cpu tier: the
    same conversations as in memory, swapped caches included."""
    from tests.integration.test_agents_offloaded import OFFLOADED

    off = LLM(str(long_tiny), dtype="float32", gpu_mem=4 << 20, cpu_mem=4 << 20, offload_dir=str(tmp_path),
              policy=OFFLOADED)
    try:
        assert {off.executor.store.tier_of(n) for n in off.executor.tiers} == {"gpu", "cpu", "disk"}
        for policy in ("infercept", "lamps"):
            run = run_tasks(off.executor, off.tokenizer, _tasks(), policy, _config(off), cost, SETTINGS, check=True)
            assert run.result.tokens == runs[policy].result.tokens
        assert run.result.tier_use["cpu"].peak_bytes <= 4 << 20
    finally:
        off.close()
    assert runs["lamps"].result.swapped_out_bytes > 0  # lamps swapped some caches to the cpu tier
