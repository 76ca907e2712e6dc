"""One `flexlamps generate` job, apart from where it runs: its settings, which prompts are still
to do, prompt encoding with the context check, and the engine call that turns finished
sequences into output records. The single-process command and the Ray workers
(`flexlamps.distributed.generate`) both run prompts through `generate_rows`, so a record is
built one way whichever path computed it.

Imports torch only inside the functions that need the engine.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from flexlamps.api import LLM, planning_lengths
from flexlamps.engine.batch.grammar import GrammarError
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.io.fingerprint import RecordFingerprint, model_fingerprint, stable_hash
from flexlamps.io.openai_output import error_line, response_line
from flexlamps.io.prompts import PromptRecord, read_prompts
from flexlamps.io.results import ResumableResults
from flexlamps.planning.policy_choice import load_policy
from flexlamps.settings import RunSettings


class PromptTooLongError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class GenerateSettings:
    """Everything that decides a record's content, plus how each engine is built: `run`, the one
    parsed `RunSettings` every engine of the job is made from (budgets are per engine)."""

    run: RunSettings
    # sampling
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    ignore_eos: bool = False
    chat: bool = False
    json_schema: str | None = None  # --json-schema: the schema of every line that names none
    created: int = 0  # OpenAI output lines' `created`: the prompt file's modification time

    @property
    def model_name(self) -> str:
        """The `model` OpenAI output lines name: --model's built-in name or its file or folder name."""
        return Path(self.run.model).name

    def with_offload_dir(self, offload_dir: str | None) -> "GenerateSettings":
        return dataclasses.replace(self, run=dataclasses.replace(self.run, offload_dir=offload_dir))

    def load_llm(self, prepare: bool = True):
        return LLM.from_settings(self.run, prepare)

    def sampling_params(self, record_id: str, record: PromptRecord | None = None):
        """A prompt's params: the command's options, overridden by what its line sets. Its seed
        derives from --seed and its id (or is the line's own), so results do not depend on
        batching, sharding or resuming."""
        fields = dict(seed=zlib.crc32(f"{self.seed}:{record_id}".encode()), max_new_tokens=self.max_new_tokens,
                      temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, stop=tuple(self.stop),
                      logprobs=self.logprobs, ignore_eos=self.ignore_eos, json_schema=self.json_schema)
        if record is not None:
            fields.update(record.sampling, n=record.n)
            fields["json_schema"] = record.json_schema or self.json_schema
        return SamplingParams(**fields)


@dataclass
class PendingJob:
    """The prompt file read against the output written so far."""

    records: list[PromptRecord]  # every prompt, in input order
    results: ResumableResults  # locked and loaded: `results.done` holds the finished records
    todo: list[PromptRecord]  # prompts without a finished record, in input order

    @property
    def order(self) -> list[str]:
        return [r.id for r in self.records]


def policy_compression(policy) -> dict:
    """What of a policy (a JSON file's path, a `placement.Policy`, "auto" or None) changes a
    record's bits: the compression it turns on and its layout. Tier fractions, budgets, batching
    and merged decode are placement: the offload executor gives the in-memory bits under any
    (`docs/generate.md`), so records made under any placement are resumed by any other."""
    if policy is None or policy == "auto":
        return {}
    policy = load_policy(policy) if isinstance(policy, (str, Path)) else policy
    if not (policy.compress_weight or policy.compress_cache):
        return {}
    return {"policy_compression": [policy.compress_weight, policy.compress_cache, policy.compression.to_json(None)]}


def record_fingerprints(settings: GenerateSettings, records: list[PromptRecord]) -> dict[str, RecordFingerprint]:
    """Each prompt's RecordFingerprint: the model file's content, the options that shape the
    output (dtype, compression, a policy's included, chat, sampling), the prompt's id (it seeds
    sampling), text and copied fields. Placement and batching are left out: they do not change a record."""
    run = settings.run
    shaping = {k: getattr(run, k) for k in ("dtype", "compress_weight", "compress_cache", "weight_quant")}
    shaping.update({k: getattr(settings, k) for k in (
        "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop", "logprobs", "ignore_eos", "chat")})
    if settings.json_schema is not None:
        shaping["json_schema"] = settings.json_schema
    shaping.update(policy_compression(run.policy))
    model, options = model_fingerprint(run.model), stable_hash(shaping)
    return {r.id: RecordFingerprint(model=model, options=options, prompt=stable_hash(r.identity())) for r in records}


def pending_job(settings: GenerateSettings, prompts_path: str | Path, out_path: str | Path,
                overwrite: bool = False) -> PendingJob:
    """Read the prompts, lock `out_path` and load the finished records whose fingerprint matches.
    Raises PromptFileError / ResultsError / PathInUseError (the caller releases `results`)."""
    records = read_prompts(prompts_path)
    results = ResumableResults(out_path, record_fingerprints(settings, records), overwrite=overwrite)
    results.lock()
    try:
        done = results.load().done
    except BaseException:
        results.release()
        raise
    return PendingJob(records, results, [r for r in records if r.id not in done])


def encode_or_error_rows(tokenizer, max_position: int, records: list[PromptRecord], chat: bool,
                         grammars=None, json_schema: str | None = None):
    """(records that can run, their token ids, error records for the others): a line that could
    not be read, a prompt that is empty after tokenizing or that the context cannot hold, a
    conversation the chat template refuses and a schema `grammars` (a JsonGrammars, needed when
    a schema is given; `json_schema`: --json-schema) cannot compile get an error record saying why."""
    keep, ids_kept, errors = [], [], []
    for r in records:
        ids, code, why = _encode_or_why(tokenizer, max_position, r, chat)
        if why is None and (r.json_schema or json_schema):
            code, why = _schema_error(grammars, r.json_schema or json_schema)
        if why is None:
            keep.append(r)
            ids_kept.append(ids)
        elif r.endpoint is not None:
            errors.append(error_line(r, code, why))
        else:
            errors.append({"id": r.id, **r.extra, "text": "", "num_prompt_tokens": len(ids),
                           "num_generated_tokens": 0, "finish_reason": "error", "error": why})
    return keep, ids_kept, errors


def _encode_or_why(tokenizer, max_position: int, r: PromptRecord, chat: bool):
    """(a record's token ids, and for a record that cannot run: an error code and why)."""
    if r.error is not None:
        return [], "invalid_request", r.error
    if r.messages is not None:
        try:
            ids = tokenizer.encode_chat(r.messages)
        except Exception as e:  # noqa: BLE001 -- a template's own refusal (jinja2.TemplateError, ValueError)
            return [], "invalid_request", f"the chat template refused the messages: {e}"
    else:
        ids = tokenizer.encode_prompt(r.prompt, chat)
    if not ids:
        return ids, "invalid_request", "the prompt is empty after tokenizing"
    if len(ids) >= max_position:
        return ids, "context_length_exceeded", f"the prompt has {len(ids)} tokens; the model's context is {max_position}"
    return ids, None, None


def _schema_error(grammars, schema: str):
    try:
        grammars.compile(schema)
    except GrammarError as e:
        return "invalid_json_schema", str(e)
    return None, None


def error_message(row: dict) -> str:
    """What an error record says (either format)."""
    return row["error"]["message"] if isinstance(row.get("error"), dict) else row["error"]


def encode_checked(tokenizer, max_position: int, records: list[PromptRecord], chat: bool) -> list[list[int]]:
    """Every prompt's ids, or PromptTooLongError naming the first prompt the context cannot hold."""
    _, ids, errors = encode_or_error_rows(tokenizer, max_position, records, chat)
    if errors:
        raise PromptTooLongError(f"prompt id {errors[0]['id']!r}: {error_message(errors[0])} ({len(errors)} such "
                                 "prompts); shorten them or drop them from the file")
    return ids


def result_row(record: PromptRecord, outs: list, settings: GenerateSettings, tokenizer) -> dict[str, Any]:
    """The output record of a prompt whose samples finished (`RequestOutput`s in sample order):
    an OpenAI output line for an OpenAI request, else a plain record: its one sample's fields, or
    for a line asking for `n` > 1, the list of its `samples`."""
    if record.endpoint is not None:
        return response_line(record, outs, model=settings.model_name, created=settings.created,
                             token_text=tokenizer.token_str)
    logprobs = settings.logprobs or bool(record.sampling.get("logprobs"))
    row, prompt_tokens = {"id": record.id, **record.extra}, outs[0].num_prompt_tokens
    if record.n == 1:  # the keys in the order records had before `n`, so older outputs resume alike
        fields = _sample_fields(outs[0], logprobs)
        return {**row, "text": fields.pop("text"), "num_prompt_tokens": prompt_tokens, **fields}
    return {**row, "num_prompt_tokens": prompt_tokens, "samples": [_sample_fields(out, logprobs) for out in outs]}


def _sample_fields(out, logprobs: bool) -> dict[str, Any]:
    fields = {"text": out.text, "num_generated_tokens": len(out.token_ids), "finish_reason": out.finish_reason}
    if out.stop_string is not None:
        fields["stop"] = out.stop_string
    if logprobs:
        fields["token_ids"] = out.token_ids
        fields["logprobs"] = out.logprobs
    return fields


def generate_rows(llm, settings: GenerateSettings, records: list[PromptRecord], prompt_ids: list[list[int]],
                  on_row: Callable[[dict], None], on_tokens: Callable[[int], None] | None = None) -> None:
    """Generate every prompt on `llm`, calling `on_row` with each record once its samples finished."""
    params = [settings.sampling_params(r.id, r) for r in records]
    finished: dict[int, list] = {}  # prompt index -> its samples finished so far

    def on_finish(out) -> None:
        outs = finished.setdefault(out.index, [])
        outs.append(out)
        if len(outs) == params[out.index].n:
            del finished[out.index]
            on_row(result_row(records[out.index], sorted(outs, key=lambda o: o.sample), settings, llm.tokenizer))

    llm.generate_ids(prompt_ids, params, on_finish=on_finish, on_tokens=on_tokens)


def prepare_offload(llm, prompt_ids: list[list[int]], settings: GenerateSettings, on_profile=None,
                    records: list[PromptRecord] | None = None) -> list[str]:
    """Plan (or load) the policy and build the offload engine for these prompts (`records`: their
    lines, whose own max_tokens and n are planned for); returns the lines that describe the
    policy (printed by the command, reported by each Ray worker)."""
    longest, shared = planning_lengths(prompt_ids)
    params = [settings.sampling_params(r.id, r) for r in records or []]
    gen_len = max((p.max_new_tokens for p in params), default=settings.max_new_tokens)
    llm.prepare(prompt_len=longest, gen_len=gen_len, num_sequences=sum(p.n for p in params) or len(prompt_ids),
                prefix_len=shared, on_profile=on_profile)
    return llm.policy_lines()
