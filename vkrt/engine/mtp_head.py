"""MtpHead: a model's MTP block (vkrt/model/mtp.py) as the one-layer model an Engine runs.

The block's tensors are uploaded from the model's file to its device, renamed blk.0; the
token embedding, the output norm and the output matrix are the trunk's (unless the file gives
the block its own). Two more tensors are the head's step inputs: the trunk's states for the
step's tokens (host-visible: the host writes them before each step) and the concatenated
normed input eh_proj reads. token_rows reads token embeddings back, for the steps of input
embeddings an image's positions take (mtp_drafter.py)."""

from __future__ import annotations

import numpy as np

from ..commands import run_once
from ..errors import ConfigError, GGUFError
from ..memory import F32, I32, MemoryKind, Tensor
from ..model.loader import Placement
from ..model.mtp import EMBED_TOKENS, HEAD, HEAD_NORM, MTP_CONCAT, MTP_HIDDEN, mtp_config, mtp_tensors
from ..model.tensors import SHARED_ALLOCATIONS
from ..ops.get_rows import get_rows
from ..owned import Owned


class MtpHead(Owned):
    """The first MTP block of `model`, for steps of at most `n_ubatch` tokens. Quacks like a
    Model for the Engine: `cfg` (one layer), `weights`, `device`, `placement`; `hidden` is the
    step input holding the trunk's states, [n_embd, n_ubatch]."""

    def __init__(self, model, n_ubatch: int):
        super().__init__("MTP head")
        if model.split is not None:
            raise ConfigError("MTP drafting runs the MTP block on one device: it does not run on a model split "
                              "over several devices (use --spec-type ngram or a draft model)")
        self.cfg = cfg = mtp_config(model.cfg)
        self.device, self.split, self.path, self.tokenizer = model.device, None, model.path, model.tokenizer
        self.output_weight = None
        self.placement = Placement()
        self._owned: dict[str, Tensor] = {}
        self._inputs: list[Tensor] = []
        il = model.cfg.n_layer
        specs = mtp_tensors(model.cfg)
        present = model.gguf.tensors
        missing = [t.name for t in specs if t.required and t.name not in present]
        if missing:
            raise GGUFError(f"{model.path}: the MTP block lacks tensor(s) {', '.join(missing[:5])}: its MTP head "
                            f"cannot run (use --spec-type ngram)")
        names = [t.name for t in specs if t.name in present]
        together = [[f"blk.{il}.{n}" for n in group] for group in SHARED_ALLOCATIONS
                    if all(f"blk.{il}.{n}" in present for n in group)]
        try:
            self._owned = model.gguf.upload(self.device, names, together=together)
            self.placement.vram_bytes = sum(t.nbytes for t in self._owned.values())
            w = {n.replace(f"blk.{il}.", "blk.0.", 1): t for n, t in self._owned.items()}
            embed, norm, head = (w.pop("blk.0." + n, None) for n in (EMBED_TOKENS, HEAD_NORM, HEAD))
            trunk = model.weights
            w["token_embd.weight"] = embed if embed is not None else trunk["token_embd.weight"]
            w["output_norm.weight"] = norm if norm is not None else trunk["output_norm.weight"]
            w["output.weight"] = head if head is not None else model.output_weight if model.output_weight is not None \
                else trunk.get("output.weight", trunk["token_embd.weight"])
            E = cfg.n_embd
            self.hidden = Tensor.empty(self.device, F32, (E, n_ubatch), name="MTP trunk states", kind=MemoryKind.HOST)
            self._inputs.append(self.hidden)
            self._inputs.append(Tensor.empty(self.device, F32, (2 * E, n_ubatch), name="MTP input"))
            w[MTP_HIDDEN], w[MTP_CONCAT] = self._inputs
            self.weights = w
        except BaseException:
            self.close()
            raise

    def write_hidden(self, rows) -> None:
        """The trunk states of the next step's tokens, [T, n_embd] (float32)."""
        self.hidden.buffer.write(rows, self.hidden.offset)

    def token_rows(self, ids) -> np.ndarray:
        """The embeddings the head reads for tokens `ids`, [n, n_embd] float32 (its token_embd's
        rows, scaled as a token step scales them)."""
        ids = np.asarray(ids, np.int32).reshape(-1)
        E, n = self.cfg.n_embd, ids.size
        src = Tensor.empty(self.device, I32, (n,), name="MTP token ids", kind=MemoryKind.HOST)
        dst = None
        try:
            dst = Tensor.empty(self.device, F32, (E, n), name="MTP token rows", kind=MemoryKind.READBACK)
            src.buffer.write(ids, src.offset)
            run_once(self.device, lambda seq: get_rows(seq, self.weights["token_embd.weight"], src, dst),
                     "MTP token rows")
            rows = dst.buffer.read(np.float32, 4 * E * n, dst.offset).reshape(n, E)
        finally:
            for t in (dst, src):
                if t is not None:
                    t.close()
        return rows * np.float32(self.cfg.embd_scale) if self.cfg.embd_scale != 1.0 else rows

    def _release(self) -> None:
        for t in [*self._owned.values(), *self._inputs]:
            t.close()
        self._owned.clear()
        self._inputs.clear()
