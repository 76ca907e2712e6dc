"""lm-evaluation-harness's model interface on the flexlamps engine: `FlexlampsLM`, registered in
lm_eval as "flexlamps" (`lm_eval.simple_evaluate(model="flexlamps", model_args={...})` once this
module is imported; `flexlamps eval` is the command line).

lm_eval hands a model all requests of one kind at once; each kind is answered as one job on the
engine's batch face: log-likelihoods sorted so shared prefixes sit together and scored packed
with the prefix computed once (`LLM.score_ids`), rolling windows (lm_eval's own
`get_rolling_token_windows`) scored the same way, generations decoded together with each
request's own sampling parameters (`LLM.generate_ids`). Tokenization, truncation and the text a
generation returns follow lm_eval's HF backend (`HFLM`), so the two agree on the same model.
Every finished part goes to lm_eval's cache hook (`use_cache`), which is what makes a killed
run resume. Imports lm_eval (an optional extra); the engine is reached through `LLM` only.
"""

from __future__ import annotations

import zlib

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from flexlamps import fault_points
from flexlamps.api import LLM, RunSettings, SamplingParams
from flexlamps.evals.lm_eval_jobs import Engines, score_chunks, truncate_pair

# generation keywords lm_eval tasks pass that the engine takes (lm_eval's aliases for the length
# are folded into max_gen_toks by normalize_gen_kwargs)
_SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "seed")


@register_model("flexlamps")
class FlexlampsLM(TemplateLM):
    """lm_eval's `LM` on a flexlamps engine.

    Args:
        pretrained: a built-in name (smollm2-135m), a Hugging Face folder or a .gguf file
            (`model` is accepted too, as `flexlamps eval --model` names it).
        llm: an `LLM` (flexlamps.api) to run on instead: pretrained and the engine options are
            then its own.
        dtype, gpu_mem, cpu_mem, offload_dir, policy, compress_weight, compress_cache,
            weight_quant, cache_dir, max_batch_size, reuse_prefix: `flexlamps.LLM`'s options.
        batch_size: lm_eval's name for max_batch_size ("auto" leaves the engine's default).
        max_length: tokens a request may hold (context + continuation, a rolling window, a prompt
            and its generation); default the model's context, as HFLM takes it from the config.
        max_gen_toks: generation length when a task does not say (HFLM's 256).
        seed: base of each sampled generation's seed (derived from it and the prompt).
        chunk_tokens: tokens computed per engine call (a shared prefix once): the unit of progress and resume.
        progress: show progress bars.
    """

    def __init__(self, pretrained: str = "smollm2-135m", *, model: str | None = None, dtype: str = "auto",
                 batch_size=None, max_batch_size=None, device=None, max_length: int | None = None,
                 max_gen_toks: int = 256, seed: int = 0, chunk_tokens: int = 16384, progress: bool = True,
                 llm: LLM | None = None, **engine):
        super().__init__()

        if isinstance(batch_size, int) or (isinstance(batch_size, str) and batch_size.isdigit()):
            engine.setdefault("max_batch_size", int(batch_size))
        if max_batch_size is not None and "max_batch_size" not in engine:
            engine["max_batch_size"] = int(max_batch_size)
        if device is not None:
            engine["device"] = device
        if llm is None:  # weights are read on first use
            llm = LLM.from_settings(RunSettings.parse(model or pretrained, dtype=dtype, **engine), prepare=False)
        self.settings = llm.settings
        self.engines = Engines(llm)
        self.tokenizer = self.engines.llm.tokenizer
        self._max_length = int(max_length) if max_length else self.engines.llm.config.max_position
        self._max_gen_toks = int(max_gen_toks)
        self.seed = int(seed)
        self.chunk_tokens = int(chunk_tokens)
        self.progress = bool(progress)

    # -- what lm_eval reads of a model -----------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_ids[0]

    @property
    def prefix_token_id(self) -> int:
        """What an empty context or a document's first window conditions on (HFLM's: BOS, else EOS)."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.settings.model.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """HFLM's rule: the tokenizer's special tokens (its BOS) unless told otherwise, and none
        when the text already starts with the BOS (a chat template wrote it)."""
        if add_special_tokens is None:
            bos = self.tokenizer.bos_token_id
            starts_with_bos = bos is not None and string.startswith(self.tokenizer.token_str(bos))
            add_special_tokens = not starts_with_bos
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation in the model's template; without a generation prompt the last
        (assistant) message is left open for the model to continue, as transformers'
        continue_final_message does."""
        text = self.tokenizer.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)
        if not add_generation_prompt and chat_history:
            last = chat_history[-1]["content"].rstrip()
            cut = text.rfind(last)
            if last and cut >= 0:
                text = text[: cut + len(last)]
        return text

    def get_model_info(self) -> dict:
        """Recorded in the results' config: the engine and its settings."""
        s = self.settings
        return {"engine": "flexlamps", "model_name": s.model, "model_dtype": s.dtype, "offloaded": s.offloaded,
                "gpu_mem": s.gpu_mem, "cpu_mem": s.cpu_mem, "compress_weight": s.compress_weight,
                "compress_cache": s.compress_cache, "weight_quant": s.weight_quant, "max_length": self.max_length}

    def close(self) -> None:
        self.engines.close()

    # -- the three request kinds ----------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(log-prob, greedy) of each ((context, continuation), context ids, continuation ids),
        truncated from the left to max_length + 1 tokens as HFLM does."""
        pairs = [truncate_pair(ctx, cont, self.max_length) for _, ctx, cont in requests]
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        llm = self.engines.for_kind("score")
        llm.prepare_scoring(pairs)  # one plan for the whole job, whatever part runs first
        order = sorted(range(len(pairs)), key=lambda i: (pairs[i][0], pairs[i][1]))  # shared prefixes together
        bar = self._bar(len(pairs), "loglikelihood", disable_tqdm)
        for chunk in score_chunks(order, [[p] for p in pairs], self.chunk_tokens):
            for i, res in zip(chunk, llm.score_ids([pairs[i] for i in chunk])):
                out[i] = (res.logprob, bool(res.is_greedy))
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
            self._part_done(bar, len(chunk))
        bar.close()
        return out  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each document's log-likelihood over lm_eval's disjoint rolling windows of max_length
        tokens, the first conditioned on the prefix token; a document's windows are scored in
        one part, so a finished document is cached whole."""
        docs = [[make_disjoint_window(w) for w in get_rolling_token_windows(
            token_list=self.tok_encode(req.args[0]), prefix_token=self.prefix_token_id,
            max_seq_len=self.max_length, context_len=1)] for req in requests]
        out = [0.0] * len(docs)
        llm = self.engines.for_kind("score")
        llm.prepare_scoring([w for windows in docs for w in windows])
        bar = self._bar(len(docs), "loglikelihood_rolling", disable_tqdm)
        for chunk in score_chunks(range(len(docs)), docs, self.chunk_tokens):
            flat = [(d, w) for d in chunk for w in docs[d]]  # an empty document has no window
            for (d, _), res in zip(flat, llm.score_ids([w for _, w in flat]) if flat else []):
                out[d] += res.logprob
            for d in chunk:
                self.cache_hook.add_partial("loglikelihood_rolling", requests[d].args, out[d])
            self._part_done(bar, len(chunk))
        bar.close()
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Every request decoded in one job, each with its own length, stop strings and sampling;
        the text is cut at the first stop string (the EOS text among them), as HFLM cuts it."""
        eos = self.tokenizer.token_str(self.eot_token_id)
        prompts, params, untils = [], [], []
        seen: dict[str, int] = {}
        for req in requests:
            context, gen_kwargs = req.args
            repeat = seen[context] = seen.get(context, -1) + 1  # repeats of a prompt sample apart
            sampling, until, max_gen = self._sampling(gen_kwargs, eos, _seed(self.seed, context, repeat))
            prompts.append(self.tok_encode(context)[-(self.max_length - max_gen):])
            params.append(sampling)
            untils.append(until)
        out = [""] * len(requests)
        bar = self._bar(len(requests), "generate_until", disable_tqdm)

        def finished(res) -> None:
            out[res.index] = postprocess_generated_text(res.text, untils[res.index], None)
            self.cache_hook.add_partial("generate_until", requests[res.index].args, out[res.index])
            self._part_done(bar, 1)

        if requests:
            self.engines.for_kind("generate").generate_ids(prompts, params, on_finish=finished)
        bar.close()
        return out

    # -- helpers ----------------------------------------------------------------------------------
    def _sampling(self, gen_kwargs: dict, eos: str, seed: int):
        """(SamplingParams, stop strings, max new tokens) of one request's generation keywords;
        a keyword the engine does not take is a ValueError naming it."""
        kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_gen = int(kwargs.pop("max_gen_toks"))
        if max_gen >= self.max_length:
            raise ValueError(f"max_gen_toks {max_gen} leaves no room for the prompt in max_length {self.max_length}: "
                             "lower it (--gen-kwargs max_gen_toks=N) or raise --max-length")
        unknown = sorted(set(kwargs) - set(_SAMPLING_KEYS))
        if unknown:
            raise ValueError(f"generation_kwargs {', '.join(unknown)} are not supported by the flexlamps engine "
                             f"(it takes until, max_gen_toks, {', '.join(_SAMPLING_KEYS)})")
        sample = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature") or 0.0) > 0
        params = SamplingParams(
            max_new_tokens=max_gen, stop=tuple(s for s in until if s),
            temperature=float(kwargs["temperature"]) if sample else 0.0,
            top_p=float(kwargs.get("top_p") or 1.0) if sample else 1.0,
            top_k=int(kwargs.get("top_k") or 0) if sample else 0,
            seed=int(kwargs.get("seed", seed)) if sample else None)
        return params, until, max_gen

    def _bar(self, total: int, kind: str, disable: bool):
        return tqdm(total=total, desc=f"flexlamps {kind}", unit="req", disable=disable or not self.progress,
                    dynamic_ncols=True)

    def _part_done(self, bar, num: int) -> None:
        """A finished part: its results made durable in the cache (when caching), the bar moved."""
        db = getattr(self.cache_hook, "dbdict", None)
        if db is not None:
            db.commit()
        bar.update(num)
        fault_points.reached("eval_part")


def _seed(base: int, context: str, repeat: int) -> int:
    """A sampled generation's seed from the run's seed, its prompt and which repeat it is: the
    same in any batch, order or resumed run."""
    return (base * 1_000_003 + zlib.crc32(context.encode("utf-8")) + repeat * 7919) % 2**31
