"""Tokenizers from an HF folder (`tokenizer.json` + `tokenizer_config.json`) or from GGUF metadata.

Built on the `tokenizers` library; the chat template is rendered with jinja2 the way
transformers does (`messages`, `add_generation_prompt`, special-token strings as variables).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

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
            text = self.apply_chat_template([{"role": "user", "content": prompt}])
            return self.encode(text, add_special_tokens=False)
        return self.encode(prompt)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        if not (add_special_tokens and self.add_bos):
            return [e.ids for e in self.tk.encode_batch(list(texts), add_special_tokens=add_special_tokens)]
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_str(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; run without --chat-template")
        import jinja2  # only for --chat: importing it costs about 0.2 s of every start

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                                 extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self._special_strings
        )


def _raise(msg):
    import jinja2

    raise jinja2.TemplateError(msg)


def _token_text(tok: Any) -> str | None:
    if tok is None or isinstance(tok, str):
        return tok
    return tok.get("content")


def tokenizer_from_hf_folder(folder: Path, hf_config: dict[str, Any]) -> Tokenizer:
    path = folder / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"{folder} has no tokenizer.json; flexlamps needs a fast-tokenizer file")
    tk = HFTokenizer.from_file(str(path))
    tc_path = folder / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text()) if tc_path.exists() else {}
    specials = {k: _token_text(tc.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    bos = tk.token_to_id(specials["bos_token"]) if specials["bos_token"] else hf_config.get("bos_token_id")
    eos_ids = set()
    if specials["eos_token"] and tk.token_to_id(specials["eos_token"]) is not None:
        eos_ids.add(tk.token_to_id(specials["eos_token"]))
    cfg_eos = hf_config.get("eos_token_id")
    eos_ids.update(cfg_eos if isinstance(cfg_eos, list) else [cfg_eos] if cfg_eos is not None else [])
    template = tc.get("chat_template")
    chat_file = folder / "chat_template.jinja"
    if template is None and chat_file.exists():
        template = chat_file.read_text()
    return Tokenizer(tk, bos_token_id=bos, eos_token_ids=sorted(eos_ids), add_bos=bool(tc.get("add_bos_token", False)),
                     chat_template=template, special_strings={k: v for k, v in specials.items() if v})


def tokenizer_from_gguf(fields: dict[str, Any]) -> Tokenizer:
    """Rebuild a byte-level BPE tokenizer from `tokenizer.ggml.*` metadata (GPT-2 style models)."""
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
    bos = fields.get("tokenizer.ggml.bos_token_id")
    eos = [fields[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in fields]
    specials = {"bos_token": tokens[bos] if bos is not None else None,
                "eos_token": tokens[eos[0]] if eos else None}
    return Tokenizer(tk, bos_token_id=bos, eos_token_ids=sorted(set(eos)),
                     add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
                     chat_template=fields.get("tokenizer.chat_template"),
                     special_strings={k: v for k, v in specials.items() if v})
