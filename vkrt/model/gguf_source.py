"""GGUFSource: what a loaded GGUF model offers whether it is one file or split over several
(gguf-split): metadata, one tensor table, each tensor's bytes and uploads to the device."""

from __future__ import annotations

import abc
import os
from typing import Any, Iterable, Sequence

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from tqdm import tqdm

from ..commands import write_tensor
from ..errors import GGUFError
from ..memory import MemoryKind, Tensor
from ..owned import Owned

GROUP_ALIGN = 256   # tensors after the first of a shared allocation start at a multiple of this


class GGUFSource(Owned):
    """`metadata` maps keys to Python values; `tensors` maps names to TensorInfo (offsets within
    the file that holds them: `part(name)`). Subclasses set `path` (the file named to open the
    model), `mmap`, `progress`, `metadata`, `tensors` and give `data`, `part` and `parts`."""

    path: str
    mmap: bool
    progress: bool
    metadata: dict[str, Any]
    tensors: dict

    @abc.abstractmethod
    def data(self, name: str) -> np.ndarray:
        """The tensor's bytes as a flat uint8 array (a view, valid until close())."""

    @abc.abstractmethod
    def part(self, name: str):
        """The GGUFFile holding tensor `name`."""

    @property
    @abc.abstractmethod
    def parts(self) -> list:
        """Every GGUFFile of the model, in order."""

    def _error(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}")

    # -- metadata --------------------------------------------------------------------------------
    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def __getitem__(self, key: str) -> Any:
        if key not in self.metadata:
            raise self._error(f"metadata key {key!r} is missing")
        return self.metadata[key]

    def require(self, keys: Iterable[str] = (), tensors: Iterable[str] = ()) -> None:
        """Raise one GGUFError listing every missing metadata key and tensor."""
        missing_keys = [k for k in keys if k not in self.metadata]
        missing_tensors = [t for t in tensors if t not in self.tensors]
        parts = []
        if missing_keys:
            parts.append(f"metadata key(s) {', '.join(map(repr, missing_keys))}")
        if missing_tensors:
            parts.append(f"tensor(s) {', '.join(map(repr, missing_tensors))}")
        if parts:
            arch = f" ({self.architecture} model)" if self.architecture else ""
            raise self._error(f"missing {' and '.join(parts)}{arch}")

    def tensor(self, name: str):
        if name not in self.tensors:
            raise self._error(f"no tensor {name!r}")
        return self.tensors[name]

    # -- data ------------------------------------------------------------------------------------
    def array(self, name: str) -> np.ndarray:
        """Plain types: elements of numpy shape (ne[n-1], ..., ne[0]); BF16 as uint16 bit patterns.
        Quantised types: uint8 blocks of shape (ne[n-1], ..., ne[1], row bytes), as gguf.quants takes."""
        t = self.tensor(name)
        raw = self.data(name)
        shape = tuple(reversed(t.ne))
        if t.type.quantized:
            return raw.reshape(shape[:-1] + (t.type.row_bytes(t.ne[0]),))
        return raw.view(t.type.dtype).reshape(shape)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 on the host, computed by gguf.quants (the reference)."""
        t = self.tensor(name)
        return dequantize(self.array(name), GGMLQuantizationType(t.type.id)).reshape(tuple(reversed(t.ne)))

    def upload(self, device, names: Iterable[str] | None = None,
               kind: MemoryKind = MemoryKind.DEVICE, together: Iterable[Sequence[str]] = (),
               derived: dict | None = None) -> dict[str, Tensor]:
        """New device tensors holding `names` (default: every tensor), with a progress bar. Each
        group in `together` whose tensors are all uploaded shares one allocation (the first tensor
        owns it), so that one binding can cover them (a gated FFN's gate and up weights).
        `derived` maps names to DerivedTensors (delta_net_layout.py) built from the file's."""
        derived = derived or {}
        names = list(self.tensors if names is None else names)

        def info_of(n):
            return derived[n] if n in derived else self.tensor(n)

        def array_of(n):
            return derived[n].make() if n in derived else self.array(n)

        infos = [info_of(n) for n in names]
        wanted = set(names)
        group_of = {g[0]: g for g in together if all(n in wanted for n in g)}
        out: dict[str, Tensor] = {}
        with tqdm(total=sum(t.nbytes for t in infos), unit="B", unit_scale=True,
                  desc=f"uploading {os.path.basename(self.path)}", disable=not self.progress, leave=False) as bar:
            try:
                for t in infos:
                    if t.name in out:
                        continue
                    group = group_of.get(t.name, (t.name,))
                    if len(group) > 1:
                        infos_g = [info_of(n) for n in group]
                        out.update((t.name, dev_t) for t, dev_t in zip(infos_g, Tensor.empty_group(
                            device, [(t.type, t.ne, t.name) for t in infos_g], kind, GROUP_ALIGN)))
                    else:
                        out[t.name] = Tensor.empty(device, t.type, t.ne, name=t.name, kind=kind)
                    for name in group:
                        write_tensor(out[name], array_of(name))
                        bar.update(info_of(name).nbytes)
            except BaseException:
                for dev_t in out.values():
                    dev_t.close()
                raise
        return out
