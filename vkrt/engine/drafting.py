"""What a command speculates with: the options and, for a draft model, its model and engine
(opened here, owned here): `vkrt run`, `bench`, `serve` and the Python API share it."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..owned import Owned
from .drafters import ModelDrafter, NgramDrafter, draft_models
from .engine import Engine
from .mtp_drafter import MtpDrafter, draft_together
from .mtp_head import MtpHead
from .options import EngineOptions, open_engine
from .speculative import SpecOptions, Speculation, check_draft_vocab


class Drafting(Owned):
    """The speculation of one command: `options`, and with a draft model (or the model's MTP
    head: an MtpHead) its `model` and `engine` (one sequence a slot of the target's engine).
    drafter(seq) makes the drafter of one sequence (n-gram lookups keep their own index). With an
    MTP head, `target` is the target's engine, which hands its states over while this is open."""

    def __init__(self, options: SpecOptions, model=None, engine=None, target=None):
        super().__init__(f"speculative decoding ({options.type})")
        self.options, self.model, self.engine, self.target = options, model, engine, target
        self.devices = None   # devices opened for the draft model alone (--device-draft): closed last
        self._mtp: dict[int, MtpDrafter] = {}   # the MTP drafter of each sequence
        if target is not None:
            target.keep_hidden(lambda *a: self._route(a, MtpDrafter.on_trunk))
            engine.keep_hidden(lambda *a: self._route(a, lambda d, pos, ids, states, rows: d.on_head(states)))

    def drafter(self, seq_id: int = 0):
        o = self.options
        if o.type == "draft":
            return ModelDrafter(self.engine, seq_id, p_min=o.p_min, n_min=o.draft_min)
        if o.type == "mtp":
            self._mtp[seq_id] = d = MtpDrafter(self.model, self.engine, seq_id, p_min=o.p_min, n_min=o.draft_min,
                                               target=self.target)
            return d
        return NgramDrafter(o.ngram_min, o.ngram_max)

    def draft_all(self, requests: list[tuple[object, list[int], int]]) -> list[list[int]]:
        """The drafts of (drafter, history, at most n) for several sequences: a draft model's
        and an MTP head's together (a step for all of them a draft), n-gram lookups one by one."""
        if self.options.type == "mtp":
            return draft_together(requests)
        if self.options.type == "draft":
            return draft_models(requests)
        return [d.draft(h, n) for d, h, n in requests]

    def _route(self, args, deliver) -> None:
        """A step's states (seqs, pos, ids, states[, input rows: an image's]) to the MTP drafter
        of each sequence in it."""
        seqs, pos, ids, states = args[:4]
        rows = args[4] if len(args) > 4 else None
        for s in np.unique(seqs).tolist():
            d = self._mtp.get(s)
            if d is not None:
                mine = seqs == s
                deliver(d, pos[mine], ids[mine], states[mine], None if rows is None else rows[mine])

    def speculation(self, seq_id: int = 0) -> Speculation:
        return Speculation(self.options, self.drafter(seq_id))

    def describe(self) -> str:
        o = self.options
        what = f"n-gram lookup ({o.ngram_min}..{o.ngram_max} tokens)" if self.model is None else \
            f"the model's MTP head (blk.{self.target.model.cfg.n_layer})" if o.type == "mtp" else \
            f"draft model {self.model.path}"
        return f"speculative decoding: {what}, up to {o.draft_max} drafts a step"

    def _release(self) -> None:
        if self.target is not None:
            self.target.keep_hidden(None)
        if self.engine is not None:
            self.engine.close()
        if self.model is not None:
            self.model.close()
        if self.devices is not None:
            self.devices.close()


def open_drafting(options: SpecOptions | None, target, target_engine, device, draft_path: str | None = None,
                  n_gpu_layers: int | None = None) -> Drafting | None:
    """The Drafting of `options` (None: no speculation) for the `target` model and its engine;
    a draft model (draft_path) is opened on `device` with the target engine's context,
    micro-batch and sequences, all its layers in VRAM unless n_gpu_layers says otherwise."""
    if options is None:
        if draft_path is not None:
            raise ConfigError("a draft model (-md) is for speculative decoding: give --spec-type draft")
        return None
    if options.type == "ngram":
        if draft_path is not None:
            raise ConfigError("-md names a draft model, which --spec-type ngram does not use (give --spec-type draft)")
        return Drafting(options)
    if options.type == "mtp":
        if draft_path is not None:
            raise ConfigError("-md names a draft model, which --spec-type mtp does not use (the model's own MTP "
                              "block drafts)")
        return open_mtp(options, target, target_engine)
    if draft_path is None:
        raise ConfigError("--spec-type draft needs a draft model: -md FILE")
    e = target_engine
    opts = EngineOptions(n_ctx=e.n_ctx, n_batch=e.n_batch, n_ubatch=e.n_ubatch, flash_attn=e.flash_attn,
                         n_seq_max=e.n_seq_max, progress=False,
                         **({} if n_gpu_layers is None else {"n_gpu_layers": n_gpu_layers}))
    model, engine = open_engine(device, draft_path, opts)
    try:
        check_draft_vocab(target, model)
    except BaseException:
        engine.close()
        model.close()
        raise
    return Drafting(options, model, engine)



MTP_UBATCH = 512   # the MTP head's micro-batch: a long prompt's entries are made in steps of this many


def open_mtp(options: SpecOptions, target, target_engine) -> Drafting:
    """The Drafting of the target's own MTP head: the block on the target's device with a KV
    cache of the target engine's context and sequences, unpadded steps (a state a token)."""
    e = target_engine
    head = MtpHead(target, min(e.n_ubatch, MTP_UBATCH))
    try:
        engine = Engine(head, n_ctx=e.n_ctx, n_batch=head.hidden.ne[1], n_ubatch=head.hidden.ne[1],
                        flash_attn=e.flash_attn, n_seq_max=e.n_seq_max, pad_prompts=False,
                        embd_input=e.embd_input)
    except BaseException:
        head.close()
        raise
    try:
        return Drafting(options, head, engine, target=e)
    except BaseException:
        engine.close()
        head.close()
        raise
