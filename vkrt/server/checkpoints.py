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
    """One slot's checkpoints (engine Checkpoint objects, oldest first), at most `limit`."""

    def __init__(self, slot_id: int, limit: int):
        self.slot_id = slot_id
        self.limit = limit
        self.saved: list = []
        self.pending: list[int] = []   # positions of the prompt being read still to checkpoint

    def resume(self, engine, keep: int, live: int) -> int:
        """Make the slot's state hold the first `keep` prompt tokens or fewer; returns how many it
        holds: `keep` when the live state is exactly there, else the longest checkpoint within it
        (restored), else 0 (the sequence starts afresh). Checkpoints past the result are dropped."""
        if keep == live:
            held = keep
        else:
            usable = [c for c in self.saved if c.length <= keep]
            held = max((c.length for c in usable), default=0)
            if held:
                engine.restore_state(self.slot_id, next(c for c in usable if c.length == held))
        for c in [c for c in self.saved if c.length > held]:
            engine.release_state(c)
            self.saved.remove(c)
        return held

    def plan(self, prompt: list[int], start: int, token_types: list[int]) -> None:
        self.pending = checkpoint_positions(prompt, start, token_types) if self.limit else []

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
            engine.release_state(self.saved.pop(0))
        ckpt = engine.save_state(self.slot_id)
        if ckpt is not None:
            self.saved.append(ckpt)

    def drop(self, engine) -> None:
        for c in self.saved:
            engine.release_state(c)
        self.saved, self.pending = [], []
