"""Tokenizers from an HF folder (`tokenizer.json` + `tokenizer_config.json`) or from GGUF metadata.

Built on the `tokenizers` library; the chat template is rendered with jinja2 the way
transformers does (`messages`, `add_generation_prompt`, special-token strings as variables).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

from flexlamps.models.loading.errors import CheckpointError, json_file

log = logging.getLogger(__name__)

# llama.cpp's pre-tokenizer names -> the split regex they stand for (GPT-2 style by default).
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class Tokenizer:
    def __init__(self, tk: HFTokenizer, *, bos_token_id: int | None, eos_token_ids: Sequence[int],
                 add_bos: bool, chat_template: str | None, special_strings: dict[str, str] | None = None):
        self.tk = tk
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template
        self._special_strings = special_strings or {}

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.tk.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids
        return ids

    def encode_prompt(self, prompt: str, chat: bool = False) -> list[int]:
        """A prompt's ids; `chat` wraps it as a user turn in the model's chat template."""
        if chat:
            return self.encode_chat([{"role": "user", "content": prompt}])
        return self.encode(prompt)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """A conversation's ids through the chat template, ending where the assistant's turn starts."""
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        if not (add_special_tokens and self.add_bos):
            return [e.ids for e in self.tk.encode_batch(list(texts), add_special_tokens=add_special_tokens)]
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_str(self, token_id: int) -> str:
        """One token's text, special tokens included (what a chat template writes around turns)."""
        return self.decode([token_id], skip_special_tokens=False)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None) -> str:
        """The conversation rendered as transformers renders it: `tools` (JSON schemas, e.g.
        `{"type": "function", "function": {...}}`) and `documents` are None unless given, so a
        template's `{% if tools %}` works; undefined names are falsy, not errors."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; run without --chat-template")
        return self._compiled_template().render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, documents=None,
            **self._special_strings
        )

    @property
    def template_takes_tools(self) -> bool:
        """Whether the chat template shows a `tools` list itself (Qwen, Hermes, Llama 3.1...)."""
        probe = [{"role": "user", "content": "u"}]
        tool = {"type": "function", "function": {"name": "\u2063probe\u2063", "parameters": {}}}
        return self.apply_chat_template(probe, tools=[tool]) != self.apply_chat_template(probe)

    def _compiled_template(self):
        """The chat template compiled once per template text (compiling took ~8 ms of every prompt)."""
        cached = getattr(self, "_template", None)
        if cached is None or cached[0] != self.chat_template:
            import jinja2.ext  # only for --chat: importing jinja2 costs about 0.2 s of every start
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            # A template comes with the user's checkpoint: the sandbox keeps it from reaching Python.
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
            cached = self._template = (self.chat_template, env.from_string(self.chat_template))
        return cached[1]


def _raise(msg):
    import jinja2

    raise jinja2.TemplateError(msg)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja2's own tojson escapes <, >, & and ' for HTML; chat templates want plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    import datetime

    return datetime.datetime.now().strftime(fmt)


def _token_text(tok: Any) -> str | None:
    if tok is None or isinstance(tok, str):
        return tok
    return tok.get("content")


def tokenizer_from_hf_folder(folder: Path, bos_token_id: int | None = None,
                             eos_token_ids: tuple[int, ...] = ()) -> Tokenizer:
    """The folder's tokenizer.json with its tokenizer_config.json's special tokens and chat template;
    `bos_token_id`/`eos_token_ids`: the model config's (its `ModelConfig`), a bos the tokenizer
    config does not name and eos tokens beside the tokenizer's."""
    path = folder / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"{folder} has no tokenizer.json; flexlamps needs a fast-tokenizer file")
    try:
        tk = HFTokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001  (the tokenizers library raises a bare Exception on a bad file)
        raise CheckpointError(f"{path} is not a readable tokenizer file ({e}); the file is damaged or cut short: "
                              "copy or download it again") from None
    tc_path = folder / "tokenizer_config.json"
    tc = json_file(tc_path, "tokenizer config") if tc_path.exists() else {}
    if not isinstance(tc, dict):
        raise CheckpointError(f"{tc_path} must hold a JSON object, not {type(tc).__name__}")
    specials = {k: _token_text(tc.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    bos = tk.token_to_id(specials["bos_token"]) if specials["bos_token"] else bos_token_id
    eos_ids = set()
    if specials["eos_token"] and tk.token_to_id(specials["eos_token"]) is not None:
        eos_ids.add(tk.token_to_id(specials["eos_token"]))
    eos_ids.update(eos_token_ids)
    template = tc.get("chat_template")
    chat_file = folder / "chat_template.jinja"
    if template is None and chat_file.exists():
        template = chat_file.read_text()
    return Tokenizer(tk, bos_token_id=bos, eos_token_ids=sorted(eos_ids), add_bos=bool(tc.get("add_bos_token", False)),
                     chat_template=template, special_strings={k: v for k, v in specials.items() if v})


# Bumped whenever `_bpe_from_gguf` builds differently, so no cached build of older code is read.
GGUF_TOKENIZER_FORMAT = 1


def tokenizer_from_gguf(fields: dict[str, Any], cache_dir: Path | None = None, content_sha256: str = "") -> Tokenizer:
    """Rebuild a byte-level BPE tokenizer from `tokenizer.ggml.*` metadata (GPT-2 style models).
    With `cache_dir` and the GGUF's `content_sha256`, the build is kept there as tokenizers' JSON,
    named by the file's content, this code's format and the library's version: reading it back
    takes a sixth of the build (SmolLM2: 0.14 vs 0.9 s)."""
    import tokenizers

    cached_json = None
    if cache_dir is not None and content_sha256:
        tag = f"{content_sha256[:32]}-v{GGUF_TOKENIZER_FORMAT}-{tokenizers.__version__}"
        cached_json = Path(cache_dir) / f"tokenizer-{tag}.json"
    if cached_json is not None and cached_json.exists():
        try:
            return _wrap_gguf_tokenizer(HFTokenizer.from_str(cached_json.read_text(encoding="utf-8")), fields)
        except Exception as e:  # an unreadable or torn file (tokenizers raises plain Exception): rebuilt
            log.warning("tokenizer cache %s is unreadable (%s); building it again", cached_json, e)
    tk = _bpe_from_gguf(fields)
    if cached_json is not None:
        _write_text(cached_json, tk.to_str())
    return _wrap_gguf_tokenizer(tk, fields)


def _bpe_from_gguf(fields: dict[str, Any]) -> HFTokenizer:
    kind = fields.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer type {kind!r} is not supported (byte-level BPE 'gpt2' is)")
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre = fields.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("llama-bpe", "llama3", "qwen2", "smaug-bpe"):
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif pre in ("default", "gpt2", "gpt-2"):
        tk.pre_tokenizer = byte_level
    else:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported (smollm, llama-bpe, qwen2, gpt2 are)")
    tk.decoder = decoders.ByteLevel()
    # CONTROL (3) and USER_DEFINED (4) tokens are matched whole, never split by BPE.
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tk


def _wrap_gguf_tokenizer(tk: HFTokenizer, fields: dict[str, Any]) -> Tokenizer:
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    bos = fields.get("tokenizer.ggml.bos_token_id")
    eos = [fields[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in fields]
    specials = {"bos_token": tokens[bos] if bos is not None else None,
                "eos_token": tokens[eos[0]] if eos else None}
    return Tokenizer(tk, bos_token_id=bos, eos_token_ids=sorted(set(eos)),
                     add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
                     chat_template=fields.get("tokenizer.chat_template"),
                     special_strings={k: v for k, v in specials.items() if v})


def _write_text(path: Path, text: str) -> None:
    """Write through a temp file and a rename; a read-only folder only costs the next load time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write the tokenizer cache %s (%s)", path, e)
