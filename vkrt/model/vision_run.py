"""A vision tower's recorded run for one input size: the buffers of an image of that size and the
command sequence recorded over them, replayed with each image of the size (recording a tower's
~600 commands takes longer on the host than the GPU takes to run them for a 448 x 448 image:
81 against 35 ms on an H100). A tower keeps the last size's run only, as the VRAM estimate counts
one image's buffers (vision_memory.activation_bytes)."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from ..commands import CommandSequence, read_tensor, run_once, write_tensor
from ..memory import F32, Tensor
from ..ops.flash_work import FlashWork
from ..owned import Owned


class EncoderRun(Owned):
    """Buffers by name (new(), held until close()) and the sequence recorded over them (record());
    run() writes the inputs, runs it and reads one buffer back."""

    def __init__(self, device, label: str):
        super().__init__(label)
        self.device = device
        self.tensors: dict[str, Tensor] = {}
        self.seq: CommandSequence | None = None

    def new(self, name: str, ne, typ=F32, zeroed: bool = False) -> Tensor:
        t = Tensor.empty(self.device, typ, ne, name=f"vision {name}")
        self.tensors[name] = t
        if zeroed:
            run_once(self.device, lambda seq: seq.fill(t.range(), 0), f"zeroing vision {name}")
        return t

    def record(self, body: Callable[[CommandSequence], None]) -> None:
        self.seq = CommandSequence(self.device, label=self.label)
        with self.seq.record():
            body(self.seq)

    def run(self, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
        for name, array in inputs.items():
            write_tensor(self.tensors[name], array)
        self.seq.run()
        return read_tensor(self.tensors[output])

    def _release(self) -> None:
        if self.seq is not None:
            self.seq.close()
        for t in self.tensors.values():
            t.close()
        self.tensors.clear()


class LastRun(Owned):
    """A tower's EncoderRun for the last input size it was asked for."""

    def __init__(self, label: str):
        super().__init__(label)
        self.key = None
        self.run: EncoderRun | None = None

    def get(self, key, build: Callable[[EncoderRun], None], device) -> EncoderRun:
        """The run for `key`, built by build(run) (which allocates with run.new and records with
        run.record) where the last one was for another key (that one closed first)."""
        if self.run is not None and self.key == key:
            return self.run
        self._drop()
        run = EncoderRun(device, self.label)
        try:
            build(run)
        except BaseException:
            run.close()
            raise
        self.key, self.run = key, run
        return run

    def _drop(self) -> None:
        if self.run is not None:
            self.run.close()
        self.key = self.run = None

    def _release(self) -> None:
        self._drop()


class Tower(Owned):
    """What both towers hold: the mmproj file's weights by name (`w`, the subclass loads them and
    sets `cfg`), the FlashWork their GEMMs and attention share and the last image size's run."""

    def __init__(self, device, path: str | os.PathLike):
        super().__init__(f"vision encoder {os.path.basename(os.fspath(path))}")
        self.device, self.path = device, os.fspath(path)
        self.w: dict[str, Tensor] = {}
        self.work = FlashWork(device, label="vision work")
        self.runs = LastRun("vision encoder run")

    def grid(self, pixels: np.ndarray) -> tuple[int, int]:
        """(rows, columns) of image tokens an input of pixels' size gives."""
        return self.cfg.token_grid(pixels.shape[1], pixels.shape[2])

    def _release(self) -> None:
        for t in self.w.values():
            t.close()
        self.w.clear()
        self.runs.close()
        self.work.close()
