"""Prompt-prefix reuse for models with a recurrent state (qwen35's DeltaNet layers): the state
cannot be rewound to the end of a shared prefix, so each slot keeps a few checkpoints of it in
host memory, taken while prompts are read, and a new prompt resumes from the longest one inside
its shared prefix (llama-server keeps context checkpoints for the same reason)."""

from __future__ import annotations

CONTROL = 3   # tokenizer.ggml.token_type of control tokens (<|im_start|>, <|im_end|>, ...)


def checkpoint_positions(prompt: list[int], start: int, token_types: list[int], last_controls: int = 3) -> list[int]:
    """Where to checkpoint while reading prompt[start:]: its end, and just before each of its last
    `last_controls` control tokens (with chat templates: the last user turn, its end, the assistant
    turn's start). A follow-up turn re-renders the history the same way up to where the previous
    answer begins (templates may drop its reasoning); a regenerated or edited last message
    diverges inside the last user turn; either way the shared prefix ends at or after one of them."""
    n = len(prompt)
    controls = [i for i in range(n - 1, start, -1)
                if 0 <= prompt[i] < len(token_types) and token_types[prompt[i]] == CONTROL][:last_controls]
    return sorted({*controls, n} - {start})


class SlotCheckpoints:
    """One slot's checkpoints (engine Checkpoint objects, oldest first), at most `limit`. When
    full, the one given up is, in this order, and never an anchor while another can go: the
    oldest taken inside an earlier prompt (not at its end); the oldest earlier prompt's end; the
    oldest of the prompt being read. The anchors are the end of the first prompt read after one
    that went back before the previous prompt's end, and its last checkpoint before that end: a
    chat template that drops the reasoning of the turns since the last user message (Qwen3's)
    re-renders the history differently from about there when the next user message comes, while
    an agent loop's tool turns extend each other (they resume at the previous prompt's end)."""

    def __init__(self, slot_id: int, limit: int):
        self.slot_id = slot_id
        self.limit = limit
        self.saved: list = []
        self.pending: list[int] = []   # positions of the prompt being read still to checkpoint
        self.ends: dict[int, int] = {}   # position that ended a prompt -> where that prompt started
        self.start = 0                 # where the prompt being read started
        self.anchor_from = 0           # the anchor is the first end past this

    def usable(self, keep: int, live: int) -> int:
        """How many of the first `keep` prompt tokens a resume holds (see resume), not resuming."""
        if keep == live:
            return keep
        return max((c.length for c in self.saved if c.length <= keep), default=0)

    def resume(self, engine, keep: int, live: int) -> int:
        """Make the slot's state hold the first `keep` prompt tokens or fewer; returns how many it
        holds: `keep` when the live state is exactly there, else the longest checkpoint within it
        (restored), else 0 (the sequence starts afresh). Checkpoints past the result are dropped."""
        held = self.usable(keep, live)
        if held != live and held:
            engine.restore_state(self.slot_id, next(c for c in self.saved if c.length == held))
        for c in [c for c in self.saved if c.length > held]:
            engine.release_state(c)
            self.saved.remove(c)
        return held

    def plan(self, prompt: list[int], start: int, token_types: list[int]) -> None:
        self.pending = checkpoint_positions(prompt, start, token_types) if self.limit else []
        if start < max(self.ends, default=0):   # went back before the previous prompt's end
            self.anchor_from = start
        self.ends = {e: s for e, s in self.ends.items() if e <= start} | {len(prompt): start}
        self.start = start

    def next_stop(self, position: int) -> int | None:
        """The next position (after `position`) where reading should pause for a checkpoint."""
        later = [p for p in self.pending if p > position]
        return later[0] if later else None

    def reached(self, engine, position: int) -> None:
        """The state now holds `position` tokens: checkpoint it if that was planned."""
        if position not in self.pending:
            return
        self.pending.remove(position)
        if any(c.length == position for c in self.saved):
            return
        while len(self.saved) >= self.limit:
            engine.release_state(self.saved.pop(self.saved.index(self._victim())))
        ckpt = engine.save_state(self.slot_id)
        if ckpt is not None:
            self.saved.append(ckpt)

    def _victim(self):
        """The checkpoint to give up for a new one (see the class)."""
        anchors = set()
        first = min((e for e in self.ends if e > self.anchor_from), default=None)
        if first is not None:
            inside = [c.length for c in self.saved if self.ends[first] < c.length < first]
            anchors = {first, *([max(inside)] if inside else [])}
        free = [c for c in self.saved if c.length not in anchors]
        earlier = [c for c in free if c.length <= self.start]
        for group in ([c for c in earlier if c.length not in self.ends], earlier,
                      [c for c in free if c.length > self.start], self.saved):
            if group:
                return min(group, key=lambda c: c.length)

    def drop(self, engine) -> None:
        for c in self.saved:
            engine.release_state(c)
        self.saved, self.pending = [], []
        self.ends, self.start, self.anchor_from = {}, 0, 0
