"""Continuing a chat in the model's own template after text the model generated: the text that
closes the assistant's turn and the text of a new turn (ending with the next assistant header).

Both are read off the template by rendering a probe conversation twice, with and without the new
turn, so any template whose earlier turns do not change when one is appended works (ChatML,
Llama 3, the tiny test template...); one that rewrites earlier turns is refused by name.
"""

from __future__ import annotations

from flexlamps.models.loading.tokenizer import Tokenizer

_MARK = "\u2063flexlamps-turn\u2063"  # text no real turn contains


class ChatTurns:
    def __init__(self, tokenizer: Tokenizer):
        if not tokenizer.chat_template:
            raise ValueError("agents need the model's chat template to add tool turns; this model has none")
        self.tokenizer = tokenizer
        self._probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]
        base = tokenizer.apply_chat_template(self._probe, add_generation_prompt=False)
        self._base = base
        self.close = base[base.rindex(_MARK) + len(_MARK):]  # ends the assistant's turn
        self._eos_text = {e: tokenizer.token_str(e) for e in tokenizer.eos_token_ids}

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The conversation so far, ending with the assistant's header; `tools` (JSON schemas) are
        shown by the template itself where it takes them."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def turn_text(self, role: str, content: str, after_token: int | None = None) -> str:
        """Text to append after the assistant's generated text (whose last token is
        `after_token`): the end of its turn, the new `role` turn and the next assistant header."""
        full = self.tokenizer.apply_chat_template([*self._probe, {"role": role, "content": content}],
                                                  add_generation_prompt=True)
        if not full.startswith(self._base):
            raise ValueError(f"the model's chat template rewrites earlier turns when a {role!r} turn follows; "
                             "agents cannot continue a conversation in it")
        close = self.close
        eos = self._eos_text.get(after_token)
        if eos and close.startswith(eos):  # the model already ended its turn
            close = close[len(eos):]
        return close + full[len(self._base):]

    def turn_ids(self, role: str, content: str, after_token: int | None, max_tokens: int) -> list[int]:
        """`turn_text` as ids, at most `max_tokens`: a long `content` keeps its tail (where a
        traceback's error is), cut in tokens so the result is the same in every run."""
        encode = lambda text: self.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        ids = encode(self.turn_text(role, content, after_token))
        if len(ids) <= max_tokens:
            return ids
        content_ids = encode(content)
        keep = len(content_ids) - (len(ids) - max_tokens)
        while keep > 0:  # cut the content's head until the whole turn fits (merges may shift a token)
            ids = encode(self.turn_text(role, "..." + self.tokenizer.decode(content_ids[-keep:]), after_token))
            if len(ids) <= max_tokens:
                return ids
            keep -= max(1, len(ids) - max_tokens)
        raise ValueError(f"no room for a {role!r} turn in {max_tokens} tokens; raise the context cap")
