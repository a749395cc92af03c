"""What a command speculates with: the options and, for a draft model, its model and engine
(opened here, owned here): `vkrt run`, `bench`, `serve` and the Python API share it."""

from __future__ import annotations

from ..errors import ConfigError
from ..owned import Owned
from .drafters import ModelDrafter, NgramDrafter
from .options import EngineOptions, open_engine
from .speculative import SpecOptions, Speculation, check_draft_vocab


class Drafting(Owned):
    """The speculation of one command: `options`, and with a draft model its `model` and
    `engine` (one sequence a slot of the target's engine). drafter(seq) makes the drafter of one
    sequence (n-gram lookups keep their own index)."""

    def __init__(self, options: SpecOptions, model=None, engine=None):
        super().__init__(f"speculative decoding ({options.type})")
        self.options, self.model, self.engine = options, model, engine
        self.devices = None   # devices opened for the draft model alone (--device-draft): closed last

    def drafter(self, seq_id: int = 0):
        o = self.options
        if o.type == "draft":
            return ModelDrafter(self.engine, seq_id, p_min=o.p_min, n_min=o.draft_min)
        return NgramDrafter(o.ngram_min, o.ngram_max)

    def speculation(self, seq_id: int = 0) -> Speculation:
        return Speculation(self.options, self.drafter(seq_id))

    def describe(self) -> str:
        o = self.options
        what = f"draft model {self.model.path}" if self.model is not None else \
            f"n-gram lookup ({o.ngram_min}..{o.ngram_max} tokens)"
        return f"speculative decoding: {what}, up to {o.draft_max} drafts a step"

    def _release(self) -> None:
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

