"""Step inputs: the host's part of a step before its graph runs. The step's tokens take KV cells
in the cell table (padding tokens one free cell no token attends), the span attention covers
is chosen so shapes repeat, and the token ids, positions, cells, sequence slots, attention masks
(and whether each is all zero on the live cells), live KV length and output rows are written
into the stages' host-visible step-input buffers, one of two copies (`parity`), which the
graph's first commands copy to the GPU."""

from __future__ import annotations

import numpy as np

from ..errors import VkrtError

# attention covers the used cells rounded up to this, so shapes repeat; with flash attention to a
# power of two (at least this): the kernel stops at the live cells (kv_used), so the longer span
# costs only mask bytes (at most twice), and a growing context or a server's slots filling the
# cache record a few graphs per step size instead of one per 256 cells
KV_STEP = 256
# prompt chunks of more than PAD_FROM tokens run as a multiple of PAD_STEP (the GEMM's token tile)
# where that is free of side effects (flash attention, no recurrent state, no host experts): the
# extra tokens come first, see nothing, write one free cell and are dropped, so a server's
# prompts of new lengths reuse a few recorded graphs instead of recording one each
PAD_FROM, PAD_STEP = 16, 64
PAD_SEQ = -2   # the sequence id of padding tokens: no cell holds it
# an engine for several sequences (a server) runs its steps over at least this many cells: one
# graph per step shape until the slots' cells pass it (splits of flash attention left without
# live tiles only count themselves done; the mask's dead columns cost bytes only)
MULTI_SEQ_MIN_SPAN = 4096


class StepInputs:
    """Cells and inputs of the steps of an engine: `stages` (each with its step-input buffer, two
    copies of `size` bytes laid out as `layout` says), the shared cell table `cells`, the
    recurrent `state` (None: none), a model of `cfg`, `n_ctx` cells, micro-batches of at most
    `n_ubatch` tokens. `pads`: prompt steps may run padded (PAD_FROM); `min_span`: the fewest
    cells a step with flash attention attends over."""

    def __init__(self, stages: list, cells, state, cfg, *, n_ctx: int, n_ubatch: int, flash_attn: bool,
                 pads: bool, min_span: int):
        self.stages, self.cells, self.state, self.cfg = stages, cells, state, cfg
        self.n_ctx, self.n_ubatch, self.flash_attn = n_ctx, n_ubatch, flash_attn
        self.pads, self.min_span = pads, min_span
        self.layout, self.size = stages[0].layout, stages[0].inputs_size
        # the most rows a step whose masks are checked for all-zero live cells has: the decode-sized
        # attention's (FlashAttn.decode_sized), the only one that reads the flag
        self.flag_rows = max(st.device.tuning.fa_pack_max_q for st in stages)

    def kv_span(self, used: int) -> int:
        """The KV cells a step attends over when `used` are in use (one past the highest): with
        flash attention a power of two (at least min_span), else a multiple of KV_STEP; never
        more than the context."""
        if self.flash_attn:
            span = max(self.min_span, 1 << (used - 1).bit_length())
        else:
            span = -(-used // KV_STEP) * KV_STEP
        return min(span, self.n_ctx)

    def padded_tokens(self, n: int) -> int:
        """The tokens a prompt step of n runs as: n, or with padding a multiple of PAD_STEP up to
        the micro-batch."""
        if n <= PAD_FROM or not self.pads:
            return n
        return min(self.n_ubatch, -(-n // PAD_STEP) * PAD_STEP)

    def padded(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray) -> tuple[int, tuple]:
        """(padding tokens, (ids, seqs, pos) with them first) for a step of ids.size tokens (see
        padded_tokens; none when no cell would be left for them). Padding comes first: the last
        token, whose logits a step reads, stays a real one."""
        n = ids.size
        pad = self.padded_tokens(n) - n
        if not pad or self.cells.n_free() <= n:
            return 0, (ids, seqs, pos)
        return pad, (np.concatenate([np.zeros(pad, np.int32), ids]),
                     np.concatenate([np.full(pad, PAD_SEQ, np.int32), seqs]),
                     np.concatenate([np.zeros(pad, np.int32), pos]))

    def check_tokens(self, ids: np.ndarray) -> None:
        vocab = self.cfg.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:
            raise VkrtError(f"token ids must be in [0, {vocab}); got {int(ids.min())}..{int(ids.max())}")

    def decode_batch(self, batch: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sequences, tokens, positions) of a decode batch of (seq_id, token) pairs, checked."""
        seqs = np.array([s for s, _ in batch], np.int32)
        if len(set(seqs.tolist())) != len(seqs):
            raise VkrtError("decode takes one token per sequence")
        ids = np.array([t for _, t in batch], np.int32)
        self.check_tokens(ids)
        return seqs, ids, np.array([self.cells.length(int(s)) for s in seqs], np.int32)

    def take_cells(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray, n_seqs: int,
                   rope: tuple | None = None) -> tuple:
        """Check a step's sequences (a recurrent state must be at the step's positions) and take
        its KV cells; returns (each token's cell, the sequence of each group of tokens). rope:
        (rotary positions [n, 3], after [n]) of every token (an image's rows: CellTable); None:
        text, each sequence's tokens going on from the rotary position its last token left."""
        slots = seqs[::ids.size // n_seqs]   # the sequence of each group of tokens
        if self.state is not None:
            for s, p in zip(slots.tolist(), pos[::ids.size // n_seqs].tolist()):
                self.state.check_slot(s)
                if self.state.length[s] != p:
                    raise VkrtError(f"sequence {s}: its recurrent state holds {self.state.length[s]} tokens but "
                                    f"the next token is at position {p} (a recurrent state cannot be rewound; "
                                    f"restore a checkpoint or reset the sequence)")
        cells = np.empty(ids.size, np.int32)
        for s in np.unique(seqs):
            sel = seqs == s
            if s == PAD_SEQ:
                continue
            if rope is not None:
                cells[sel] = self.cells.allocate(int(s), pos[sel], rope[0][sel], rope[1][sel])
            elif self.cells.moved:   # text after an image: its rotary positions go on from the image's
                first = int(pos[sel].min())
                r = pos[sel] - first + self.cells.text_position(int(s), first)
                cells[sel] = self.cells.allocate(int(s), pos[sel], np.repeat(r[:, None], 3, axis=1), r + 1)
            else:
                cells[sel] = self.cells.allocate(int(s), pos[sel])
        if (seqs == PAD_SEQ).any():   # padding writes its K and V to a free cell no token attends (padded left one)
            cells[seqs == PAD_SEQ] = self.cells.highest_free()
        return cells, slots

    def _flag(self, host, lay: dict, name: str, mask: np.ndarray, used: int) -> None:
        """Step input `name`: 1 where `mask` (f16 [rows, n_kv]) is 0 on every live cell (below
        `used`) of every row, so a decode-sized flash attention need not read it; steps of more
        rows than those are not scanned (0)."""
        if name in lay:
            zero = mask.shape[0] <= self.flag_rows and not mask[:, :used].any()
            host[lay[name]:lay[name] + 4] = np.array([int(zero)], np.int32).view(np.uint8)

    def write(self, ids: np.ndarray, seqs: np.ndarray, pos: np.ndarray, cells: np.ndarray, slots: np.ndarray,
              n_seqs: int, parity: int, out: np.ndarray | None, broadcast: bool, rows: np.ndarray | None = None,
              causal: bool = True) -> int:
        """Write a step's inputs into copy `parity` of the first stage's buffer (broadcast: of
        every stage's; else a pipelined step writes the others' as they take it up); out: the
        tokens whose logits the step computes (None: as its graph says); rows: the step's input
        embeddings [n, n_embd] (an image's), which replace the token ids'; causal False: the
        step's tokens also see each other's later positions (CellTable.mask). Returns the KV span."""
        n = ids.size
        used = self.cells.used_end()
        n_kv = self.kv_span(used)
        lay = self.layout
        base = parity * self.size
        host = self.stages[0].inputs.host_bytes[base:base + self.size]
        host[lay["ids"]:lay["ids"] + 4 * n] = ids.view(np.uint8)
        streams = pos   # multi-section RoPE on text: the t, h and w streams hold the position, e is 0
        if self.cells.moved:   # images in the cache: each token's rotary positions (CellTable.rope)
            r = np.where((seqs == PAD_SEQ)[:, None], 0, self.cells.rope[cells]).astype(np.int32)
            streams = r[:, 0].copy() if self.cfg.pos_streams == 1 else np.concatenate([r.T.reshape(-1), 0 * pos])
        elif self.cfg.pos_streams > 1:
            streams = np.concatenate([pos, pos, pos, np.zeros_like(pos)])
        host[lay["pos"]:lay["pos"] + streams.nbytes] = streams.view(np.uint8)
        host[lay["cells"]:lay["cells"] + 4 * n] = cells.view(np.uint8)
        host[lay["slots"]:lay["slots"] + 4 * n_seqs] = slots.astype(np.int32).view(np.uint8)
        if "mask" in lay:
            mask = self.cells.mask(seqs, pos, n_kv, n, used=used, causal=causal)
            host[lay["mask"]:lay["mask"] + mask.nbytes] = mask.reshape(-1).view(np.uint8)
            self._flag(host, lay, "mask_zero", mask, used)
        if "mask_swa" in lay:
            swa = self.cells.mask(seqs, pos, n_kv, n, window=self.cfg.sliding_window, used=used, causal=causal)
            host[lay["mask_swa"]:lay["mask_swa"] + swa.nbytes] = swa.reshape(-1).view(np.uint8)
            self._flag(host, lay, "mask_swa_zero", swa, used)
        if "kv_used" in lay:
            host[lay["kv_used"]:lay["kv_used"] + 4] = np.array([used], np.int32).view(np.uint8)
        if out is not None:
            host[lay["out_ids"]:lay["out_ids"] + 4 * out.size] = out.astype(np.int32).view(np.uint8)
        if rows is not None:
            if "embd" not in lay:
                raise VkrtError("this engine takes no input embeddings (open it with a vision projector)")
            data = np.ascontiguousarray(rows, np.float32).reshape(-1).view(np.uint8)
            host[lay["embd"]:lay["embd"] + data.size] = data
        for st in self.stages[1:] if broadcast else ():   # each stage of a split reads them from its own device
            st.inputs.host_bytes[base:base + self.size] = host
        return n_kv

    def first_stage_copy(self, parity: int) -> bytes:
        """A copy of the step inputs the host wrote for the first stage (copy `parity`)."""
        base = parity * self.size
        return self.stages[0].inputs.host_bytes[base:base + self.size].copy()

    def write_token(self, parity: int, token: int) -> None:
        """Make `token` the input of the chain step whose inputs are copy `parity`, on every stage."""
        at = parity * self.size + self.layout["ids"]
        for st in self.stages:
            st.inputs.host_bytes[at:at + 4] = np.array([token], np.int32).view(np.uint8)

    def advance(self, slots: np.ndarray, n: int) -> None:
        """A step ran n tokens of each sequence of `slots`: their recurrent states hold them."""
        if self.state is not None:
            self.state.note_step(slots.tolist(), n, n * len(slots))
            for s in slots.tolist():
                self.state.length[s] += n
