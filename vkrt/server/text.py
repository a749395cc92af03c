"""Generated tokens -> text pieces for streaming: incremental detokenization and stop strings."""

from __future__ import annotations

from ..model.tokenizer import TOKEN_CONTROL, TOKEN_USER_DEFINED


class Detokenizer:
    """Turns a growing token list into new text, decoding only a short window of recent tokens
    (so a long generation costs O(1) per token) and holding back incomplete UTF-8 characters.
    Special tokens are left out, but for those in `keep` (markup a reply parser reads, e.g. <think>,
    <tool_call>, gpt-oss's <|channel|>: llama-server's preserved tokens)."""

    def __init__(self, tokenizer, keep: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.keep = keep
        self.tokens: list[int] = []
        self.prefix = 0   # window start: tokens before it are already text
        self.read = 0     # tokens up to here have been turned into text

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special=not self.keep)

    def push(self, token: int) -> str:
        if self.keep and token not in self.keep and \
                self.tokenizer.token_types[token] in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            return ""
        self.tokens.append(int(token))
        before = self._decode(self.tokens[self.prefix:self.read])
        text = self._decode(self.tokens[self.prefix:])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.tokens)
        return text[len(before):]

    def flush(self) -> str:
        """What is left at the end (an incomplete character comes out as U+FFFD)."""
        before = self._decode(self.tokens[self.prefix:self.read])
        text = self._decode(self.tokens[self.prefix:])
        self.prefix = self.read = len(self.tokens)
        return text[len(before):]


class StopMatcher:
    """Finds the first stop string in generated text. push() returns the text that is safe to
    send: text that might be the start of a stop string is held back until it is decided."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.text = ""
        self.sent = 0
        self.hit: str | None = None

    def push(self, piece: str) -> str:
        if self.hit is not None:  # the text ended at the stop string
            return ""
        self.text += piece
        found = [(i, s) for s in self.stops if (i := self.text.find(s, self.sent)) >= 0]
        if found:
            idx, self.hit = min(found)
            out = self.text[self.sent:idx]
            self.text = self.text[:idx]
            self.sent = idx
            return out
        end = len(self.text) - self._held()
        out = self.text[self.sent:end]
        self.sent = end
        return out

    def _held(self) -> int:
        """Length of the longest unsent suffix that begins some stop string."""
        tail = self.text[self.sent:]
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out
