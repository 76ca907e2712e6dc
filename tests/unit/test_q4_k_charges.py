"""A GGUF's 4-bit blocks charged as the engine holds them: Q4_K's scales as the file has them (4.625
bits a weight where our kernel runs, `Int4Weight.from_k_blocks`), Q4_0 / Q4_1's and a stacked mix's
(scale, zero) pairs (5), sized in one place (`quant.int4_layout`, each kind's `stored_bytes`), by the
offload executor's store, its dry run (`PlanTarget.in_place`: the file's blocks as kept) and
`--max-rss`'s figure for the in-memory executor."""
from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest
import torch

from flexlamps.commands import memory
from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.weight_store import in_place_coded
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import GGUFReader
from flexlamps.models.loading.gguf_blocks import q4_k_parts
from flexlamps.models.blocks.weight_kind import kind_of
from flexlamps.models.loading.in_place import keeps_k_scales
from flexlamps.models.loading.weight_cache import load_weights
from flexlamps.models.weight_specs import weight_specs
from flexlamps.planning.dry_run import dry_run
from flexlamps.planning.target import BlockLengths, PlanTarget
from flexlamps.run_plan.build import in_memory_weight_bytes
from placement import Policy, TierSplit
from quant.int4_layout import int4_bits_per_weight, int4_params_nbytes
from quant.int4_weight import Int4Weight
from tests.gguf_models import random_k_blocks, write_llama_gguf
from tests.unit.test_gguf_kquants import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB, kquant_types

ON_GPU = TierSplit(gpu=1, cpu=0, disk=0)
TYPES = {"q4_k": lambda name, layer: None if name.endswith("norm") else "Q4_K",  # every matrix Q4_K
         "q4_k_m": kquant_types}  # Q4_K beside Q5_x / Q6_K: a stacked q/k/v of Q4_K and Q5_0 holds pairs


def _gguf(path, types: str):
    return GGUFReader(write_llama_gguf(path / f"{types}.gguf", TYPES[types], hidden=HIDDEN, ffn=FFN, layers=LAYERS,
                                       heads=HEADS, kv_heads=KV_HEADS, vocab=VOCAB))


def test_the_layout_sizes_both_forms_as_the_weight_holds_them():
    rows, cols = 48, 512
    k_form = Int4Weight.from_k_blocks(*q4_k_parts(random_k_blocks(np.random.default_rng(0), rows, cols, "Q4_K"),
                                                  (rows, cols)), torch.bfloat16)
    assert k_form.k_scales and k_form.scale_zero.nbytes == int4_params_nbytes(rows, cols, k_scales=True)
    assert k_form.pairs().scale_zero.nbytes == int4_params_nbytes(rows, cols, k_scales=False)
    assert int4_bits_per_weight(k_scales=True) == 4.625 and int4_bits_per_weight(k_scales=False) == 5


def _held(ex, folder) -> dict[str, int]:
    """Bytes the executor's store holds for each stored weight (its parts on its tier)."""
    held = {}
    for name, tier in ex.weights.tiers.items():
        parts = [n for n in ex.store._tier if (n == name or n.startswith(name + "::")) and n not in ex.store._qparts]
        if tier == "disk":
            held[name] = sum((folder / (n.replace("/", "_") + ".dat")).stat().st_size for n in parts)
        else:
            held[name] = sum(ex.store._resident[n].numel() * ex.store._resident[n].element_size() for n in parts)
    return held


@pytest.mark.parametrize("compress", [True, False], ids=["4-bit", "codes"])
@pytest.mark.parametrize("types", sorted(TYPES))
def test_the_dry_run_charges_what_the_store_holds(tmp_path, types, compress):
    """Each tier's weights as the executor holds them are what the dry run charges: a Q4_K matrix
    at its 4.625 bits (where our kernel runs) whether the policy compresses (`read_int4`) or keeps
    the file's blocks as codes, which the dry run charged as dense bf16 before it saw them."""
    reader = _gguf(tmp_path, types)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=TierSplit(gpu=0.3, cpu=0.3, disk=0.4), cache=ON_GPU,
                    activations=ON_GPU, compress_weight=compress)
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config), gpu_mem=1 << 30, cpu_mem=1 << 30,
                         offload_dir=tmp_path / "off", dtype=torch.bfloat16, device=torch.device("cpu"))
    held = _held(ex, tmp_path / "off" / "flexlamps-offload")
    assert held == ex.weights.stored
    prompt_len, gen_len = 12, 3
    ex.store.submit = _run_at_once  # loads land at once: the peak cannot depend on the I/O thread
    ids = torch.randint(2, VOCAB, (2, prompt_len), generator=torch.Generator().manual_seed(0)).tolist()
    generate(ex, reader.tokenizer, ids, [SamplingParams(max_new_tokens=gen_len, ignore_eos=True)] * 2, max_batch=2,
             micro_batch=2, reuse_prefix=False)
    ex.close()
    target = PlanTarget(config=reader.config, model=model_spec(reader.config), dtype=torch.bfloat16,
                        in_place=in_place_coded(reader, torch.bfloat16)[1])
    run = dry_run(target, policy, BlockLengths(prompt_len=prompt_len, gen_len=gen_len), gpu_mem=1 << 30,
                  cpu_mem=1 << 30)
    by_tier = {t: sum(n for name, n in held.items() if ex.weights.tiers[name] == t) for t in ("cpu", "disk")}
    assert run.peak_bytes["disk"] == by_tier["disk"] and run.peak_bytes["cpu"] == by_tier["cpu"] > 0
    measured = ex.budgets["gpu"].peak_bytes
    assert measured <= run.peak_bytes["gpu"] <= 1.1 * measured
    if types == "q4_k" and compress:  # every matrix read as the file has it, off the gpu tier in one layout
        bits = int4_bits_per_weight(k_scales=keeps_k_scales())
        for spec in (s for s in ex.specs if ex.weights.form(s) == "int4" and ex.tiers[s.name] != "gpu"):
            assert held[spec.name] == spec.numel * bits / 8 + 4, spec.name


def _run_at_once(load) -> Future:
    done = Future()
    done.set_result(load())
    return done


def _held_in_memory(reader) -> int:
    """Bytes the in-memory executor holds, each weight as its kind stores it (twins made)."""
    ex = InMemoryExecutor(reader.config, load_weights(reader, torch.bfloat16, int4_in_place=True, use_cache=False),
                          torch.bfloat16, "cpu", dense_twins=True)
    held = [*ex.global_weights.values(), *(t for w in ex.layer_weights for t in w.values())]
    return sum(kind_of(t).stored_bytes(t) for t in held)


@pytest.mark.parametrize("prompts_on_codes", [True, False], ids=["codes", "twins"])
@pytest.mark.parametrize("types", sorted(TYPES))
def test_max_rss_charges_what_the_in_memory_executor_holds(tmp_path, monkeypatch, types, prompts_on_codes):
    """`--dtype auto` in memory charges each weight as its kind holds it there (`in_memory_weight_bytes`):
    a Q4_K matrix at 4.625 bits where our kernel keeps its scales (not Q4_0's 5, nor Q8_0's 10 for a
    Q4_K_M, which the one figure a weight charged), with a dense twin where prompts do not run on
    the codes; equal to what the executor holds but the group sizes of the parts it stacks."""
    from click import ClickException

    from flexlamps.generate_job import GenerateSettings
    from flexlamps.models.blocks import coded_weights
    from flexlamps.settings import RunSettings

    if not prompts_on_codes:
        monkeypatch.setattr(coded_weights, "prompts_run_on_codes", lambda dtype: False)
    reader = _gguf(tmp_path, types)
    charged = in_memory_weight_bytes(reader, torch.bfloat16)
    assert 0 <= charged - _held_in_memory(reader) <= 4 * len(weight_specs(reader.config))  # stacked: fewer group sizes
    if types == "q4_k" and prompts_on_codes and keeps_k_scales():  # the embedding table dense, the rest Q4_K
        specs = weight_specs(reader.config)
        coded = [s for s in specs if s.role == "linear"] + [s for s in specs if s.name == "embed_tokens"]  # tied head
        dense = sum(s.numel * 2 for s in specs if s.role != "linear")
        assert charged == dense + sum(s.numel * 4.625 / 8 + 4 for s in coded)
    spec = model_spec(reader.config)
    settings = GenerateSettings(run=RunSettings(model=f"{types}.gguf", max_batch_size=2), max_new_tokens=0)
    cap = memory.planned_rss_bytes(spec, None, weight_bytes=charged, offload_budgets=None, num_sequences=2,
                                   context_len=min(reader.config.max_position, 512), cache_bytes_per_value=2)
    memory.check_max_rss(settings, cap, 2, reader, spec)
    with pytest.raises(ClickException, match="cannot be met"):
        memory.check_max_rss(settings, cap - 1, 2, reader, spec)
