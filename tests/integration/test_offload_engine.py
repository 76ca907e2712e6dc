"""The offload executor equals the plain in-memory one for every tier mix, within honest budgets."""

import pytest
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.batch.generate import generate
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.split_tables import head_chunks
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors.step import Step
from flexlamps.engine.executors.sweep import HEAP_TRIM_SHARE, MICRO_BATCH_TRIM_BYTES, HeapWatch, trims_heap_after
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.mapped_pages import in_file_mapping
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.weight_specs import weight_specs
from offload import BudgetExceededError
from placement import Policy, TierSplit

GiB = 2**30
ALL_GPU = TierSplit(gpu=1, cpu=0, disk=0)
MIXES = {
    "all_gpu": dict(weights=ALL_GPU, cache=ALL_GPU, activations=ALL_GPU),
    "weights_half_cpu": dict(weights=TierSplit(gpu=0.5, cpu=0.5, disk=0), cache=ALL_GPU, activations=ALL_GPU),
    "weights_mostly_disk": dict(weights=TierSplit(gpu=0.1, cpu=0.1, disk=0.8), cache=ALL_GPU, activations=ALL_GPU),
    "cache_cpu_cpu_attention": dict(weights=ALL_GPU, cache=TierSplit(gpu=0, cpu=1, disk=0), activations=ALL_GPU,
                                    cpu_attention=True),
    "cache_cpu_staged": dict(weights=ALL_GPU, cache=TierSplit(gpu=0.5, cpu=0.5, disk=0), activations=ALL_GPU),
    # disk-tier cache layers: mapped files (caches.disk_rows, tests/integration/test_cache_on_disk.py)
    "cache_disk_staged": dict(weights=ALL_GPU, cache=TierSplit(gpu=0, cpu=0.5, disk=0.5), activations=ALL_GPU),
    "cache_disk_cpu_attention": dict(weights=ALL_GPU, cache=TierSplit(gpu=0, cpu=0, disk=1), activations=ALL_GPU,
                                     cpu_attention=True),
    "activations_cpu": dict(weights=TierSplit(gpu=0.3, cpu=0.7, disk=0), cache=ALL_GPU,
                            activations=TierSplit(gpu=0, cpu=1, disk=0)),
}
PROMPTS = ["hello world", "the quick brown fox jumps over", "numbers 1 2 3 4 5", "a"]


def _policy(mix, **kw):
    return Policy(gpu_batch_size=2, num_gpu_batches=2, **MIXES[mix], **kw)


@pytest.fixture(scope="module")
def reader(tiny_models):
    return open_checkpoint(tiny_models["llama_gqa"])


@pytest.fixture(scope="module")
def plain(reader):
    return InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)


def _steps(reader):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, reader.config.vocab_size, (4, 12), generator=g)
    return [Step(ids[:2], torch.arange(12).expand(2, 12), torch.tensor([0, 1])),
            Step(ids[2:, :7], torch.arange(7).expand(2, 7), torch.tensor([2, 3]))]


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_tier_mix_equals_plain_engine(reader, plain, mix, tmp_path):
    ex = OffloadExecutor(reader, _policy(mix), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    steps = _steps(reader)
    ref_cache, cache = plain.new_cache(4, 16), ex.new_cache(4, 16)
    ref = plain.forward_steps(ref_cache, steps)
    got = ex.forward_steps(cache, steps)
    for a, b in zip(ref, got):
        assert (a - b).abs().max().item() <= 1e-5
    cache.release()
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (6, 3, 8, 5)]
    ids = [reader.tokenizer.encode(p) for p in PROMPTS]
    expected = [o.token_ids for o in generate(plain, reader.tokenizer, ids, params, max_batch=3)]
    got = [o.token_ids for o in generate(ex, reader.tokenizer, ids, params, max_batch=3, micro_batch=2)]
    assert got == expected
    assert ex.budgets["gpu"].peak_bytes <= GiB and ex.budgets["gpu"].used_bytes == sum(
        t.numel() * t.element_size() for n, t in ex.store._resident.items() if ex.store.tier_of(n) == "gpu")
    ex.close()


def test_weights_on_disk_really_leave_memory(reader, tmp_path):
    ex = OffloadExecutor(reader, _policy("weights_mostly_disk"), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    on_disk = [n for n, t in ex.tiers.items() if t == "disk"]
    assert on_disk and all(n not in ex.store._resident for n in on_disk)
    assert (tmp_path / "off" / "flexlamps-offload" / "index.json").exists()
    ex.close()


@pytest.mark.parametrize("mix", ["weights_half_cpu", "weights_mostly_disk"])
def test_memory_tiers_hold_their_own_copies(reader, mix, tmp_path):
    """No memory-tier weight is a view of the checkpoint's mapped file (a memory cgroup would evict it
    as page cache and read it again); the checkpoint's tensors are mapped views to begin with."""
    spec = next(s for s in weight_specs(reader.config) if s.layer == 0)
    assert in_file_mapping(reader.read(spec, torch.float32))
    ex = OffloadExecutor(reader, _policy(mix), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    held = {n: t for n, t in ex.store._resident.items() if isinstance(t, torch.Tensor)}
    assert any(ex.store.tier_of(n) == "cpu" for n in held)
    assert [n for n, t in held.items() if in_file_mapping(t)] == []
    ex.close()


def test_offload_folder_is_reused_and_damage_detected(reader, tmp_path):
    folder = tmp_path / "off"

    def run(policy):
        ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                             gpu_mem=GiB, cpu_mem=GiB, offload_dir=folder)
        ex.close()
        return ex

    assert not run(_policy("weights_mostly_disk")).reused_disk
    assert run(_policy("weights_mostly_disk")).reused_disk
    victim = next((folder / "flexlamps-offload").glob("*.dat"))
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert not run(_policy("weights_mostly_disk")).reused_disk  # checksum mismatch: rebuilt, not used
    assert run(_policy("weights_half_cpu")).store.disk is None  # no disk share: folder untouched
    fourth = run(Policy(gpu_batch_size=1, num_gpu_batches=1, weights=TierSplit(gpu=0, cpu=0.2, disk=0.8),
                        cache=ALL_GPU, activations=ALL_GPU))
    assert not fourth.reused_disk  # a different split is a stale folder


def test_gpu_budget_is_enforced(reader, tmp_path):
    with pytest.raises(BudgetExceededError, match="gpu tier budget exceeded"):
        OffloadExecutor(reader, _policy("all_gpu"), model_spec=model_spec(reader.config), gpu_mem=10_000, cpu_mem=GiB)


def test_a_description_of_another_model_is_refused(reader, tiny_models):
    """The executor charges from the description it is handed (a run plan's): one of another model
    would charge another model's workspace, so it is refused before any weight is placed."""
    other = model_spec(open_checkpoint(tiny_models["llama3_scaled"]).config)
    with pytest.raises(ValueError, match="model_spec describes another model"):
        OffloadExecutor(reader, _policy("all_gpu"), model_spec=other, gpu_mem=GiB, cpu_mem=GiB)


def test_budget_too_small_for_a_step_raises(reader, tmp_path):
    total = sum(s.numel for s in __import__("flexlamps.models.weight_specs", fromlist=["x"]).weight_specs(reader.config)) * 4
    ex = OffloadExecutor(reader, _policy("weights_mostly_disk"), model_spec=model_spec(reader.config),
                         gpu_mem=int(total * 0.25), cpu_mem=GiB,
                         offload_dir=tmp_path / "off")
    cache = ex.new_cache(4, 16)
    big = Step(torch.ones(4, 2000, dtype=torch.long), torch.arange(2000).expand(4, 2000), torch.arange(4))
    with pytest.raises(BudgetExceededError):
        ex.forward_steps(cache, [big])
    assert ex.budgets["gpu"].used_bytes == sum(
        t.numel() * t.element_size() for n, t in ex.store._resident.items() if ex.store.tier_of(n) == "gpu") + sum(
        n for tier, n in cache._charged if tier == "gpu")
    ex.close()


def test_compressed_cache_stays_close(reader, plain):
    ex = OffloadExecutor(reader, _policy("all_gpu", compress_cache=True), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB,
                         device=torch.device("cpu"))  # the prompt's rows bit for bit: the CPU's guarantee
    steps = _steps(reader)
    ref_cache, cache = plain.new_cache(4, 16), ex.new_cache(4, 512)
    ref, got = plain.forward_steps(ref_cache, steps), ex.forward_steps(cache, steps)
    dense_bytes = 2 * reader.config.num_layers * 4 * reader.config.kv_size * 512 * 4
    assert sum(n for _, n in cache._charged) < 0.3 * dense_bytes
    for a, b in zip(ref, got):  # a prompt attends over its own exact keys (caches.fresh)
        assert torch.equal(a, b)
    # the steps after read the compressed cache
    decode = [Step(torch.tensor([[5], [6], [7], [8]]), torch.tensor([[12], [12], [7], [7]]), torch.arange(4))]
    a, b = plain.forward_steps(ref_cache, decode)[0], ex.forward_steps(cache, decode)[0]
    assert 0 < ((a - b).norm() / a.norm()).item() < 0.3
    ex.close()


@pytest.mark.parametrize("merge", [True, False])
def test_decode_micro_batches_merge_only_when_the_policy_says_so(reader, plain, tmp_path, merge):
    ex = OffloadExecutor(reader, _policy("all_gpu", merge_decode=merge), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB,
                         offload_dir=tmp_path / "off")
    swept = []
    sweep = ex.sweep._sweep
    ex.sweep._sweep = lambda cache, steps: swept.append(len(steps)) or sweep(cache, steps)
    params = [SamplingParams(max_new_tokens=4, ignore_eos=True)] * 4
    ids = [reader.tokenizer.encode(p) for p in PROMPTS]
    expected = [o.token_ids for o in generate(plain, reader.tokenizer, ids, params, max_batch=4)]
    got = [o.token_ids for o in generate(ex, reader.tokenizer, ids, params, max_batch=4, micro_batch=2)]
    assert got == expected
    decode_sweeps = swept[1:]  # the first sweep prefills
    assert decode_sweeps and all(n == (1 if merge else 2) for n in decode_sweeps)
    ex.close()


def test_a_recorded_sweep_splits_its_wall_time_into_cpu_a_cores_wait_and_the_rest(reader, tmp_path):
    """A sweep profile says how much of the sweep its thread computed and waited for a core, so a
    benchmark tells a plan's miss on compute from a busy machine's and from blocking (faults, reads)."""
    ex = OffloadExecutor(reader, _policy("weights_mostly_disk"), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    ex.sweep.record_profile = True
    ids = [reader.tokenizer.encode(p) for p in PROMPTS[:2]]
    generate(ex, reader.tokenizer, ids, [SamplingParams(max_new_tokens=3, ignore_eos=True)] * 2, max_batch=2)
    profiles = ex.sweep.profiles
    assert len(profiles) >= 3
    for p in profiles:
        assert p.cpu_s > 0 and p.run_queue_s >= 0 and p.cpu_s + p.run_queue_s <= p.sweep_s + 0.01
    ex.close()


@pytest.mark.parametrize("free_heap", [128 << 20, (128 << 20) - 1])
def test_every_sweep_gives_its_freed_heap_back(reader, plain, free_heap, tmp_path, monkeypatch):
    """Every layer of a prompt sweep, every prompt micro-batch and the last layer of each decode sweep
    end in `release_heap` (`trims_heap_after`): with a prompt sweep's layers trimmed alone the freed
    heap grew sweep on sweep (the MoE job worker: RssAnon 3031 -> 3604 MiB over 63 decode sweeps at
    steady charges, OOM-killed under its 3.5 GiB cap) and micro-batch on micro-batch within a prompt
    layer (122 -> 501 MiB free over 6); the tokens stay the plain engine's. A layer's end trims only a
    heap with 1/32 of the host budgets (2 x 2 GiB here) free: less, and the micro-batches' trims alone
    run (a small model's trims had its next layer fault the pages back: SmolLM2 5-11% slower)."""
    from flexlamps.engine.executors import sweep as sweep_module

    trims = []
    monkeypatch.setattr(sweep_module, "release_heap", lambda: trims.append(1) or True)
    monkeypatch.setattr(sweep_module, "heap_free_bytes", lambda: free_heap)
    monkeypatch.setattr(sweep_module, "MICRO_BATCH_TRIM_BYTES", 0)  # the tiny model's micro-batches count as large
    ex = OffloadExecutor(reader, _policy("weights_mostly_disk"), model_spec=model_spec(reader.config),
                         gpu_mem=2 * GiB, cpu_mem=2 * GiB, offload_dir=tmp_path / "off")
    swept = []  # per sweep, whether each micro-batch has a prompt
    sweep = ex.sweep._sweep
    ex.sweep._sweep = lambda cache, steps: swept.append([s.input_ids.shape[1] > 1 for s in steps]) \
        or sweep(cache, steps)
    params = [SamplingParams(max_new_tokens=4, ignore_eos=True)] * 4
    ids = [reader.tokenizer.encode(p) for p in PROMPTS]
    expected = [o.token_ids for o in generate(plain, reader.tokenizer, ids, params, max_batch=4)]
    got = [o.token_ids for o in generate(ex, reader.tokenizer, ids, params, max_batch=4, micro_batch=2)]
    assert got == expected
    prompt_sweeps = [steps for steps in swept if any(steps)]
    decode_sweeps = len(swept) - len(prompt_sweeps)
    between = sum(sum(steps[:-1]) for steps in prompt_sweeps)  # prompt micro-batches not a layer's last
    assert decode_sweeps >= 3 and between >= 1
    layer_ends = len(prompt_sweeps) * reader.config.num_layers + decode_sweeps if free_heap >= 128 << 20 else 0
    assert len(trims) == between * reader.config.num_layers + layer_ends
    ex.close()


@pytest.mark.parametrize("mix", ["weights_mostly_disk", "activations_cpu"])
def test_every_layer_writes_over_its_micro_batchs_hidden_states(reader, plain, mix, tmp_path, monkeypatch):
    """A sweep's hidden states are one buffer each layer writes its output over (`Sweep._activations`):
    a fresh tensor a layer and micro-batch left a hole in glibc's heap each time (the MoE job's prompt
    sweep, 16 micro-batches of 63 x 128 tokens: +31 MiB of free heap a micro-batch, uncharged, its worker
    OOM-killed under its 3.5 GiB cap); the results stay the plain engine's."""
    ex = OffloadExecutor(reader, _policy(mix), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    inputs = []
    layer = ex.sweep.fwd.layer
    monkeypatch.setattr(ex.sweep.fwd, "layer", lambda w, x, *rest: inputs.append(x.data_ptr()) or layer(w, x, *rest))
    steps = _steps(reader)
    got, ref = ex.forward_steps(ex.new_cache(4, 16), steps), plain.forward_steps(plain.new_cache(4, 16), steps)
    for a, b in zip(ref, got):
        assert (a - b).abs().max().item() <= 1e-5
    by_step = [inputs[k::len(steps)] for k in range(len(steps))]  # layer j runs every micro-batch in turn
    assert len(inputs) == reader.config.num_layers * len(steps) and reader.config.num_layers > 1
    assert all(len(set(ptrs)) == 1 for ptrs in by_step) and len({ptrs[0] for ptrs in by_step}) == len(steps)
    ex.close()


def test_the_heap_policy_trims_a_prompt_sweeps_layers_and_micro_batches_and_a_decode_sweeps_last():
    assert [trims_heap_after(j, 4, prefill=True) for j in range(4)] == [True] * 4
    assert [trims_heap_after(j, 4, prefill=False) for j in range(4)] == [False, False, False, True]
    large = MICRO_BATCH_TRIM_BYTES
    assert [trims_heap_after(j, 4, True, large) for j in range(4)] == [True] * 4  # a large prompt micro-batch
    assert [trims_heap_after(j, 4, True, large - 1) for j in range(4)] == [False] * 4  # a small one
    assert [trims_heap_after(j, 4, False, large) for j in range(4)] == [False] * 4  # decode


def test_the_heap_policy_trims_a_layers_end_only_where_the_free_heap_is_a_share_of_the_host_budget():
    """A layer's end trims where the heap holds 1/32 of the host memory budgeted free, not below (the
    next layer faults back what it reuses: SmolLM2's ~170 MiB a layer of 16 GiB budgeted cost it 5-11%),
    and where the free bytes are unknown (no glibc mallinfo2) as before; a micro-batch's trim keeps its
    own rule (its workspace), and the free heap is read only where a layer's end could trim."""
    budget, reads = 16 << 30, []

    def free(n):
        return lambda: reads.append(n) or n
    small, enough = free((budget >> 5) - 1), free(budget >> 5)
    assert [trims_heap_after(j, 4, True, host_budget=budget, free_heap=small) for j in range(4)] == [False] * 4
    assert [trims_heap_after(j, 4, True, host_budget=budget, free_heap=enough) for j in range(4)] == [True] * 4
    assert [trims_heap_after(j, 4, False, host_budget=budget, free_heap=small) for j in range(4)] == [False] * 4
    assert [trims_heap_after(j, 4, False, host_budget=budget, free_heap=enough) for j in range(4)] == \
        [False, False, False, True]
    assert len(reads) == 4 + 4 + 1 + 1  # a decode sweep's first layers read nothing
    assert trims_heap_after(0, 4, True, host_budget=budget, free_heap=lambda: None)
    assert trims_heap_after(0, 4, True, MICRO_BATCH_TRIM_BYTES, host_budget=budget, free_heap=small)


@pytest.mark.gpu
@pytest.mark.parametrize("mix", ["weights_mostly_disk", "cache_cpu_staged", "activations_cpu"])
def test_cuda_offload_with_copy_stream_equals_the_plain_engine(reader, plain, mix, tmp_path):
    """On CUDA the weights load on a copy stream from pinned buffers; the results must not change."""
    ex = OffloadExecutor(reader, _policy(mix), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off",
                         device=torch.device("cuda"))
    assert ex.copies.stream is not None
    steps = _steps(reader)
    ref = plain.forward_steps(plain.new_cache(4, 16), steps)
    for _ in range(3):  # later sweeps reuse the allocator's blocks: the events must order them
        got = ex.forward_steps(ex.new_cache(4, 16), steps)
        for a, b in zip(ref, got):
            assert (a - b.cpu()).abs().max().item() <= 1e-4
    ex.close()


@pytest.mark.parametrize("mix", ["cache_cpu_staged", "cache_cpu_cpu_attention"])
def test_step_geometry_is_made_once_per_step_not_per_layer(reader, plain, mix, tmp_path, monkeypatch):
    """Masks and spans once a step (issue 18): the fresh-prefill check and the mask per device run
    once for each step however many layers and tiers it crosses, and the results stay the plain
    engine's."""
    from flexlamps.engine.caches import tiered

    checks, masks = [], []
    real_check, real_on = tiered.is_fresh_prefill, tiered.TieredStepGeometry.on
    monkeypatch.setattr(tiered, "is_fresh_prefill", lambda p: checks.append(1) or real_check(p))

    def counted_on(self, device):
        masks.append((id(self), str(device))) if torch.device(device) not in self._placed else None
        return real_on(self, device)

    monkeypatch.setattr(tiered.TieredStepGeometry, "on", counted_on)
    ex = OffloadExecutor(reader, _policy(mix), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    steps = _steps(reader)
    cache, ref_cache = ex.new_cache(4, 16), plain.new_cache(4, 16)
    got, ref = ex.forward_steps(cache, steps), plain.forward_steps(ref_cache, steps)
    assert reader.config.num_layers > 1
    assert len(checks) == len(steps)  # one geometry a step, not one a layer
    assert len(masks) == len(set(masks)) <= len(steps) * 2  # placed at most once per (step, device)
    for a, b in zip(ref, got):
        assert (a - b).abs().max().item() <= 1e-5
    cache.release()
    ex.close()


@pytest.mark.parametrize("mix", ["weights_mostly_disk", "activations_cpu"])
def test_the_head_is_read_once_a_sweep_for_every_micro_batch(reader, plain, mix, tmp_path):
    """The output head's vocab chunks are read once a sweep (as the planner prices them), not once
    per micro-batch, and each micro-batch's logits stay the plain engine's."""
    ex = OffloadExecutor(reader, _policy(mix), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off")
    head = {p.name for p in ex.head_pieces}
    reads = []
    fetch_rows = ex.store.fetch_rows
    ex.store.fetch_rows = lambda name, *a: (reads.append(name) if name in head else None) or fetch_rows(name, *a)
    steps = _steps(reader)
    assert len(steps) > 1
    got = ex.forward_steps(ex.new_cache(4, 16), steps)
    ref = plain.forward_steps(plain.new_cache(4, 16), steps)
    for a, b in zip(ref, got):
        assert (a - b).abs().max().item() <= 1e-5
    chunks = list(head_chunks(ex.head_pieces, ex.sweep.head_chunk_rows))
    assert len(reads) == len(chunks)  # one read a chunk for both micro-batches
    ex.close()


def _head_reads_by_thread(ex) -> list[str]:
    """Wrap `ex.store.fetch_rows` to note the thread each head chunk is read on."""
    import threading

    head, threads = {p.name for p in ex.head_pieces}, []
    fetch_rows = ex.store.fetch_rows

    def noted(name, *a):
        if name in head:
            threads.append(threading.current_thread().name)
        return fetch_rows(name, *a)
    ex.store.fetch_rows = noted
    return threads


def test_the_head_reads_its_next_chunk_while_it_multiplies_one(reader, plain, tmp_path):
    """With room for a second staged chunk under the sweep's charged peak, each off-gpu vocab chunk
    after the first is read on an I/O thread while the one before is multiplied; with room for
    one only (the rest taken when the head starts), only while nothing is staged (a gpu-tier chunk
    multiplied). Either way the gpu tier stays under what the dry run charges the sweep, and the
    logits equal the plain engine's."""
    steps = _steps(reader)
    ref = plain.forward_steps(plain.new_cache(4, 16), steps)
    for room_for_one in (False, True):
        ex = OffloadExecutor(reader, _policy("weights_mostly_disk"), model_spec=model_spec(reader.config),
                             gpu_mem=GiB, cpu_mem=GiB,
                             offload_dir=tmp_path / str(room_for_one))
        ex.sweep.head_chunk_rows = 64  # several chunks on disk on the tiny vocab
        threads = _head_reads_by_thread(ex)
        if room_for_one:
            _leave_room_for_one_chunk(ex)
        cache = ex.new_cache(4, 16)
        ex.reset_peaks()
        charged = ex.budgets["gpu"].used_bytes + ex.charges.sweep_gpu_peak(
            [(s.input_ids.shape[0], s.input_ids.shape[1], s.span) for s in steps])
        got = ex.forward_steps(cache, steps)
        # reads ahead stay under what the dry run charges (the squeeze's own bytes are not charged)
        assert ex.budgets["gpu"].peak_bytes <= (ex.budgets["gpu"].capacity_bytes if room_for_one else charged)
        chunks = list(head_chunks(ex.head_pieces, ex.sweep.head_chunk_rows))
        off_gpu = sum(p.tier != "gpu" for p, _, _ in chunks)
        assert off_gpu > 2 and len(threads) == len(chunks)
        read_ahead = sum(name.startswith("flexlamps-io") for name in threads)
        # every off-gpu chunk but the first of all is read ahead; with room for one staged chunk,
        # only one that follows a gpu-tier chunk (nothing staged while that one is multiplied)
        expected = sum(chunks[i][0].tier != "gpu" and (not room_for_one or chunks[i - 1][0].tier == "gpu")
                       for i in range(1, len(chunks)))
        assert read_ahead == expected, threads
        for a, b in zip(ref, got):
            assert (a - b).abs().max().item() <= 1e-5
        ex.close()


def _leave_room_for_one_chunk(ex) -> None:
    """Take all of the gpu tier's room (under the sweep's charged peak) but one head chunk's
    staging while `ex` computes logits."""
    logits, budget = ex.sweep._logits, ex.budgets["gpu"]
    elem = torch.empty(0, dtype=ex.dtype).element_size()
    one_chunk = ex.sweep.head_chunk_rows * ex.cfg.hidden_size * elem

    def squeezed(hs, limit):
        rows = max(h.numel() // h.shape[-1] for h in hs)  # the chunk of logits `_logits` holds
        top = min(budget.capacity_bytes, limit())
        taken = top - budget.used_bytes - rows * ex.sweep.head_chunk_rows * elem - one_chunk - 1
        budget.allocate(taken, "test: the rest of the tier")
        try:
            return logits(hs, limit)
        finally:
            budget.free(taken)
    ex.sweep._logits = squeezed



def test_the_heap_watch_reads_the_free_heap_again_only_where_a_trim_may_be_due():
    """mallinfo2 walks the free lists (~2.4 ms, 45 readings a SmolLM2 generate): a reading below the
    share is kept while the anonymous resident bytes stay within half the share of where they were; a
    reading at the share (a trim follows) or resident bytes that moved read again."""
    budget, frees, anon = 32 << 30, [], [4 << 30]
    share = budget // HEAP_TRIM_SHARE
    watch = HeapWatch(read_free=lambda: frees.append(1) or free_now[0], read_anon=lambda: anon[0])
    free_now = [share - 1]
    assert [watch.free_bytes(budget) for _ in range(5)] == [share - 1] * 5
    assert len(frees) == 1  # settled: read once
    anon[0] += share // 2 - 1
    watch.free_bytes(budget)
    assert len(frees) == 1  # moved less than half the share
    anon[0] += 2
    free_now[0] = share
    assert watch.free_bytes(budget) == share and len(frees) == 2  # moved: read again, a trim is due
    watch.free_bytes(budget)
    assert len(frees) == 3  # after a reading at the share, read every time
    unknown = HeapWatch(read_free=lambda: frees.append(1) or 0, read_anon=lambda: None)
    unknown.free_bytes(budget), unknown.free_bytes(budget)
    assert len(frees) == 5  # no statm: every time, as before
