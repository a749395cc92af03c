"""A reasoning budget, as llama-server's --reasoning-budget N: at most N tokens inside a `<think>`
block of a reply; then the block is closed by forced tokens (llama.cpp's: the budget message, if
any, then its end tag "\\n</think>") and the model goes on with the answer. The block is the one
the prompt opened or any the reply opens; a closing tag the model writes itself ends the count.
Forced tokens wait for a whole UTF-8 character, and are taken as sampled ones are (KV cache,
grammar, stop strings, the stream)."""

from __future__ import annotations

from dataclasses import dataclass

from .reasoning import THINK_CLOSE, THINK_OPEN

# OpenAI's reasoning effort as a thinking budget in tokens (0: thinking off)
EFFORT_BUDGET = {"none": 0, "minimal": 0, "low": 1024, "medium": 4096, "high": 16384}
FORCED_CLOSE = "\n" + THINK_CLOSE   # llama.cpp forces its first end tag, after the budget message

IDLE, COUNTING, FORCING, DONE = "idle", "counting", "forcing", "done"


@dataclass(frozen=True)
class BudgetSpec:
    """A request's budget: the thinking tokens allowed, the tokens that close a block, and whether
    the prompt leaves the model inside one."""

    tokens: int
    forced: tuple[int, ...]
    open: bool


def budget_spec(tokens: int, tokenizer, thinking_open: bool, message: str = "") -> BudgetSpec:
    """A request's budget of `tokens` (>= 0) over `tokenizer`'s vocabulary; `message` (llama-server's
    --reasoning-budget-message) is forced before the close, tokenized with it as llama.cpp does."""
    return BudgetSpec(tokens, tuple(tokenizer.encode(message + FORCED_CLOSE, add_special=False)), thinking_open)


class ThinkingBudget:
    """One reply's count: next_forced() is the token to take instead of sampling (None: sample),
    accept() follows every token taken."""

    def __init__(self, spec: BudgetSpec):
        self.spec = spec
        self.state = IDLE
        self.used = 0
        self.pos = 0       # the next forced token's index
        self.tail = ""     # the block's recent text, where its tags are looked for
        if spec.open:
            self._open()

    def _open(self) -> None:
        self.state, self.used, self.tail = COUNTING, 0, ""
        if self.spec.tokens == 0:
            self._force()

    def _force(self) -> None:
        self.state, self.pos, self.tail = (FORCING if self.spec.forced else DONE), 0, ""

    def next_forced(self, allowed=None) -> int | None:
        """The token the reply must take now, if any; allowed(token): whether the request's
        grammar takes it (where it does not, forcing gives up: the grammar decides)."""
        if self.state != FORCING:
            return None
        token = self.spec.forced[self.pos]
        if allowed is not None and not allowed(token):
            self.state = DONE
            return None
        return token

    def accept(self, token: int, text: str, whole: bool) -> None:
        """A token was taken: its text, and whether the text so far ends on a whole character."""
        if self.state == FORCING:
            self.pos += 1
            if self.pos == len(self.spec.forced):
                self.state = DONE
            return
        self.tail = (self.tail + text)[-64:]
        if self.state in (IDLE, DONE):
            k = self.tail.find(THINK_OPEN)
            if k >= 0:
                rest = self.tail[k + len(THINK_OPEN):]
                self._open()
                self.tail = rest
            return
        if THINK_CLOSE in self.tail:
            self.state, self.tail = DONE, self.tail[self.tail.find(THINK_CLOSE) + len(THINK_CLOSE):]
            return
        self.used += 1
        if self.used >= self.spec.tokens and whole:
            self._force()
