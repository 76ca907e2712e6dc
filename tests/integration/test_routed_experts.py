"""A MoE model mostly on disk reads only the experts its tokens route to, and runs exactly as in
memory; experts read off disk stay in the gpu tier's free room (the hot set) until it is needed."""

import pytest
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit
from tests.checkpoints import make_checkpoint

ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
MOSTLY_DISK = Policy(gpu_batch_size=1, num_gpu_batches=1, weights=TierSplit(gpu=0.05, cpu=0.05, disk=0.9),
                     cache=ON_GPU, activations=ON_GPU)
PROMPT_LEN, DECODE_STEPS = 6, 12


# every MoE family, 32 experts of which each token picks 2, in every layer
MANY_EXPERTS_OF = {"deepseek_v3": "deepseek_v3_many_experts", "mixtral": "mixtral_many_experts",
                   "qwen2_moe": "qwen2_moe_many_experts"}


@pytest.fixture(scope="module", params=list(MANY_EXPERTS_OF))
def family_reader(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("moe") / request.param
    return open_checkpoint(make_checkpoint(folder, MANY_EXPERTS_OF[request.param]))


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    return open_checkpoint(make_checkpoint(tmp_path_factory.mktemp("moe") / "deepseek", MANY_EXPERTS_OF["deepseek_v3"]))


def _read_bytes() -> int:
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


def _greedy(ex, reads: list | None = None, forced: list[int] | None = None) -> tuple[list[int], list[torch.Tensor]]:
    """One prompt's prefill, then DECODE_STEPS greedy steps at batch 1 (or steps fed the tokens
    `forced`): the tokens, the logits, and (into `reads`) the bytes read by each decode step."""
    ids = torch.randint(2, ex.cfg.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(3))
    cache = ex.new_cache(1, PROMPT_LEN + DECODE_STEPS)
    out = ex.forward_steps(cache, [Step(ids, torch.arange(PROMPT_LEN)[None], torch.tensor([0]))])[0]
    logits, tokens = [out[:, -1]], []
    for pos in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
        tokens.append(forced[pos - PROMPT_LEN] if forced else int(out[0, -1].argmax()))
        before = _read_bytes()
        out = ex.forward_steps(cache, [Step(torch.tensor([[tokens[-1]]]), torch.tensor([[pos]]), torch.tensor([0]))])[0]
        if reads is not None:
            reads.append(_read_bytes() - before)
        logits.append(out[:, -1])
    return tokens, logits


def _executor(reader, tmp_path, order: str, gpu_mem: int) -> OffloadExecutor:
    return OffloadExecutor(reader, MOSTLY_DISK, model_spec=model_spec(reader.config),
                           gpu_mem=gpu_mem, cpu_mem=1 << 30, offload_dir=tmp_path / "off",
                           dtype=torch.float32, expert_cache=order)


def _disk_bytes(ex) -> int:
    return sum(ex.weights.stored[name] for name, tier in ex.tiers.items() if tier == "disk")


def test_a_decode_step_reads_only_the_routed_experts(family_reader, tmp_path):
    """Every MoE family: without the hot set, a decode step at batch 1 reads its two experts
    per layer and the rest of the disk-resident weights (attention, router, head rows): at most
    0.3x what is on disk; the tokens equal the in-memory run's."""
    reader = family_reader
    expected_tokens, expected_logits = _greedy(InMemoryExecutor(reader.config, read_all(reader, torch.float32),
                                                                torch.float32))
    ex = _executor(reader, tmp_path, "off", 1 << 30)
    reads = []
    try:
        tokens, logits = _greedy(ex, reads)
    finally:
        ex.close()
    assert tokens == expected_tokens
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(logits, expected_logits))
    disk = _disk_bytes(ex)
    assert disk > 0.8 * sum(ex.weights.stored.values())
    per_step = sum(reads) / len(reads) / disk
    assert per_step <= 0.3, per_step  # top-2 of 32 experts, plus the attention and the head


def test_routed_experts_are_read_on_io_threads_while_the_forward_computes(reader, tmp_path):
    """The disk-resident experts a router picks are read on the store's I/O threads (the forward
    computes the first while later ones are read), and the logits equal the in-memory run's."""
    import threading

    expected = _greedy(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32))[1]
    ex = _executor(reader, tmp_path, "off", 1 << 30)
    experts = {name for layer in ex.experts.values() for names in layer.values() for name in names}
    threads = []
    fetch = ex.store.fetch
    ex.store.fetch = lambda names: (threads.append(threading.current_thread().name)
                                    if experts.intersection(names) else None) or fetch(names)
    try:
        logits = _greedy(ex)[1]
    finally:
        ex.close()
    assert threads and all(name.startswith("flexlamps-io") for name in threads), set(threads)
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(logits, expected))


def test_a_forward_that_raises_mid_layer_leaves_no_expert_staged(reader, tmp_path, monkeypatch):
    """An expert's computation raising while later experts are still being read: the step raises,
    every staged read is waited for and given back (the gpu tier holds what it held before), and
    the next step runs as in memory."""
    from flexlamps.models.blocks import moe

    ex = _executor(reader, tmp_path, "off", 1 << 30)
    ids = torch.randint(2, ex.cfg.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(3))
    step = Step(ids, torch.arange(PROMPT_LEN)[None], torch.tensor([0]))
    plain = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    expected = plain.forward_steps(plain.new_cache(1, PROMPT_LEN), [step])[0]
    cache = ex.new_cache(1, PROMPT_LEN)
    before = ex.budgets["gpu"].used_bytes  # the weights and the cache
    real, calls = moe._expert, []

    def failing(x, w, e, cfg, phase):
        calls.append(e)
        if len(calls) == 2:
            raise RuntimeError("expert failed")
        return real(x, w, e, cfg, phase)
    monkeypatch.setattr(moe, "_expert", failing)
    try:
        with pytest.raises(RuntimeError, match="expert failed"):
            ex.forward_steps(cache, [step])
        assert ex.budgets["gpu"].used_bytes == before
        monkeypatch.setattr(moe, "_expert", real)
        got = ex.forward_steps(ex.new_cache(1, PROMPT_LEN), [step])[0]
    finally:
        ex.close()
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("order", ["cyclic", "lru", "frequency"])
def test_the_hot_set_serves_repeat_experts_from_free_room(reader, tmp_path, order):
    """With room for a few experts beyond what a step needs, some reads hit and others evict;
    the cached bytes give way to what the run needs, and the logits stay the same."""
    forced = torch.randint(2, reader.config.vocab_size, (DECODE_STEPS,), generator=torch.Generator().manual_seed(4))
    expected = _greedy(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32),
                       forced=forced.tolist())[1]
    probe = _executor(reader, tmp_path / "probe", "off", 1 << 30)
    one_expert = max(sum(probe.weights.stored[n] for n in names) for names in probe.experts[0].values())
    _greedy(probe, forced=forced.tolist())
    gpu_mem = probe.budgets["gpu"].peak_bytes + 6 * one_expert  # room for about 6 of 64 experts
    probe.close()
    ex = _executor(reader, tmp_path, order, gpu_mem)
    try:
        logits = _greedy(ex, forced=forced.tolist())[1]
        stats = ex.expert_cache.stats()
        assert ex.budgets["gpu"].used_bytes + ex.budgets["gpu"].cached_bytes <= gpu_mem
    finally:
        ex.close()
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(logits, expected))
    assert 0 < stats["hits"] and stats["misses"] > stats["kept"] > 0, stats  # some kept, some evicted
    assert ex.budgets["gpu"].cached_bytes == 0  # given back on close


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_four_bit_experts_read_off_disk_equal_resident_ones(tmp_path, dtype):
    """4-bit experts (multiplied in place, or dequantized once for prompt chunks of 128 rows or
    more) fetched from disk as routed give the bits of the same experts resident on the gpu tier."""
    import dataclasses

    reader = open_checkpoint(make_checkpoint(tmp_path / "mixtral", MANY_EXPERTS_OF["mixtral"]))
    ids = torch.randint(2, reader.config.vocab_size, (4, 130), generator=torch.Generator().manual_seed(1))
    steps = [Step(ids[:2], torch.arange(130).expand(2, 130), torch.tensor([0, 1])),
             Step(ids[2:], torch.arange(130).expand(2, 130), torch.tensor([2, 3]))]
    decode = [Step(ids[:, :1], torch.full((4, 1), 130), torch.arange(4))]
    outs = []
    for weights in (MOSTLY_DISK.weights, ON_GPU):
        policy = dataclasses.replace(MOSTLY_DISK, weights=weights, compress_weight=True, gpu_batch_size=2,
                                     num_gpu_batches=2)
        ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                             gpu_mem=1 << 30, cpu_mem=1 << 30, offload_dir=tmp_path / str(weights.gpu),
                             dtype=dtype)
        try:
            cache = ex.new_cache(4, 140)
            outs.append(ex.forward_steps(cache, steps) + ex.forward_steps(cache, decode))
        finally:
            ex.close()
    assert all(torch.equal(a, b) for a, b in zip(*outs))


MOSTLY_CPU = TierSplit(gpu=0.05, cpu=0.95, disk=0.0)


@pytest.mark.parametrize("in_place", [True, False])
def test_cpu_tier_experts_are_computed_where_they_live_when_few_tokens_route_to_them(family_reader, tmp_path,
                                                                                    in_place):
    """Few tokens per expert (`Policy.cpu_expert_tokens` above a decode step's): a cpu-tier
    expert is handed to the forward as it lives, never fetched (no staging copy, no charge);
    below (0: always staged) it is fetched for the batched GEMM. The text equals in memory's."""
    reader = family_reader
    expected_tokens, expected_logits = _greedy(InMemoryExecutor(reader.config, read_all(reader, torch.float32),
                                                                torch.float32))
    policy = Policy(gpu_batch_size=1, num_gpu_batches=1, weights=MOSTLY_CPU, cache=ON_GPU, activations=ON_GPU,
                    cpu_expert_tokens=1 << 20 if in_place else 0)
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=1 << 30, cpu_mem=1 << 30, dtype=torch.float32, expert_cache="off")
    cpu_experts = {name for experts in ex.experts.values() for names in experts.values() for name in names
                   if ex.store.tier_of(name) == "cpu"}
    fetched = []
    fetch = ex.store.fetch
    ex.store.fetch = lambda names: fetched.extend(names) or fetch(names)
    try:
        tokens, logits = _greedy(ex)
    finally:
        ex.close()
    assert cpu_experts and tokens == expected_tokens
    assert all((a - b).abs().max() <= 1e-5 for a, b in zip(logits, expected_logits))
    staged = cpu_experts.intersection(fetched)
    if in_place:
        assert not staged, f"staged in the in-place regime: {sorted(staged)[:4]}"
        assert ex.cpu_expert_reads["in place"] > 0 and ex.cpu_expert_reads["staged"] == 0
    else:
        assert staged and ex.cpu_expert_reads["in place"] == 0 and ex.cpu_expert_reads["staged"] > 0


def test_the_planner_prices_the_bytes_a_decode_step_reads_off_disk(family_reader, tmp_path):
    """Every weight on disk, batch 1, no hot set: the planner's disk bytes per decode step (its
    dtoc term over the disk rate, all layers) are what the engine reads (/proc/self/io): the
    layers but their unpicked experts, the head whole, one row of the input embedding table."""
    import dataclasses

    import placement
    from tests.described import described

    reader = family_reader
    policy = Policy(gpu_batch_size=1, num_gpu_batches=1, weights=TierSplit(gpu=0.0, cpu=0.0, disk=1.0),
                    cache=ON_GPU, activations=ON_GPU)
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=1 << 30, cpu_mem=1 << 30, offload_dir=tmp_path / "off",
                         dtype=torch.float32, expert_cache="off")
    reads = []
    try:
        _greedy(ex, reads)
    finally:
        ex.close()
    spec = dataclasses.replace(described(reader.config)[1], dtype="fp32")
    hw = placement.hardware_preset("rtx4090")
    workload = placement.WorkloadSpec(prompt_len=PROMPT_LEN, gen_len=DECODE_STEPS + 1)
    predicted = placement.predict(policy, spec, hw, workload).decode_layer_s["dtoc"] * hw.disk_read_bytes_per_s
    assert sum(reads) / len(reads) == pytest.approx(predicted * spec.num_layers, rel=0.01)


def test_the_next_layers_predicted_experts_are_read_ahead_once(reader, tmp_path):
    """A decode step's MoE layer scores its routed inputs with the next layer's router and starts
    reading those predicted experts that live on disk into the expert cache (`experts_ahead`; here
    every expert is predicted, as this tiny random model's next routing is not predictable): reads
    ahead start, none is read twice, the gpu tier stays within its budget,
    and the logits equal the in-memory run's (and the run's without reads ahead)."""
    forced = torch.randint(2, reader.config.vocab_size, (DECODE_STEPS,), generator=torch.Generator().manual_seed(5))
    expected = _greedy(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32),
                       forced=forced.tolist())[1]
    runs = {}
    for ahead in (True, False):
        ex = _executor(reader, tmp_path / str(ahead), "cyclic", 1 << 30)
        ex.sweep.read_ahead = ahead
        ex.sweep.read_ahead_picks = reader.config.moe.num_experts  # every expert predicted: some are picked
        owner = {name: (layer, e) for layer, experts in ex.experts.items() for e, names in experts.items()
                 for name in names}
        fetched, fetch = [], ex.store.fetch
        ex.store.fetch = lambda names: fetched.extend(owner[n] for n in names[:1] if n in owner) or fetch(names)
        reads = []
        try:
            runs[ahead] = _greedy(ex, reads, forced=forced.tolist())[1]
            budget = ex.budgets["gpu"]
            assert budget.used_bytes + budget.cached_bytes <= budget.capacity_bytes
            stats = (ex.sweep._ahead.started, ex.sweep._ahead.used) if ahead else None
        finally:
            ex.close()
        if ahead:  # the gpu tier keeps every expert read: none is read twice, ahead or in turn
            assert stats[0] > 0, stats
            assert len(fetched) == len(set(fetched)), fetched
    for logits in runs.values():
        assert all((a - b).abs().max() <= 1e-5 for a, b in zip(logits, expected))
