"""Loading a model: GGUF metadata -> config and tokenizer; tensors placed in VRAM or left in
host memory (used by the GPU through the host-memory path) by `-ngl`."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..memory import Buffer, MemoryKind, Tensor, host_registry
from ..owned import Owned
from ..units import fmt_bytes
from .config import ModelConfig
from ..ops.binding import binding_limit
from .gguf_source import GROUP_ALIGN
from .split_gguf import open_gguf
from .tokenizer import Tokenizer
from .delta_net_layout import derived_tensors
from .fused_views import fused_views
from .tensors import SHARED_ALLOCATIONS, check_expert_layout, check_tensors, file_layout, required_tensors

log = logging.getLogger("vkrt")


def layer_of(name: str) -> int | None:
    if name.startswith("blk."):
        return int(name.split(".")[1])
    return None


def is_cpu_moe(name: str, n_cpu_moe: int) -> bool:
    """--n-cpu-moe N: the expert matrices (ffn_*_exps.weight) of the first N layers stay in host
    memory (gpt-oss's small per-expert biases stay in VRAM)."""
    il = layer_of(name)
    return il is not None and il < n_cpu_moe and name.endswith("_exps.weight")


@dataclass
class Placement:
    """Which tensors live where, and how the host-resident ones reach the GPU."""

    vram_bytes: int = 0
    host_bytes: int = 0
    host_imported: int = 0
    host_copied: int = 0
    host_tensors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        s = f"{fmt_bytes(self.vram_bytes)} in VRAM"
        if self.host_bytes:
            s += (f", {fmt_bytes(self.host_bytes)} in host memory ({len(self.host_tensors)} tensors: "
                  f"{fmt_bytes(self.host_imported)} read through imported memory, "
                  f"{fmt_bytes(self.host_copied)} through host-visible copies)")
        return s


class Model(Owned):
    """An opened model: `cfg`, `tokenizer`, `weights` (GGUF name -> Tensor) and their placement.

    split: a LayerSplit (layer_split.py) placing each layer's tensors on its device (`device`
    is then the split's main device); host-resident tensors are imported into the device that
    reads them, in place (no second copy in RAM). With tied embeddings the output matrix is a
    copy of token_embd on the main device (`output_weight`)."""

    def __init__(self, device, path: str | os.PathLike, *, mmap: bool = True, n_gpu_layers: int = 999,
                 n_cpu_moe: int = 0, pin: bool | None = None, progress: bool | None = None, on_host=None,
                 split=None):
        super().__init__(f"model {os.path.basename(os.fspath(path))}")
        if split is not None and split.main is not device:
            raise ConfigError(f"a split model's device is the split's main device ({split.main.label}), "
                              f"not {device.label}")
        self.device = device
        self.split = split
        self.path = os.fspath(path)
        self.weights: dict[str, Tensor] = {}
        self._derived: dict = {}
        self.output_weight: Tensor | None = None
        self._owned: list = []
        self._regions: list = []
        self.gguf = open_gguf(path, mmap=mmap, progress=progress)
        try:
            meta = self.gguf.metadata
            self.cfg = file_layout(ModelConfig.from_metadata(meta, self.path), self.gguf.tensors)
            check_expert_layout(self.gguf.tensors, self.path)
            self.gguf.require(tensors=required_tensors(self.cfg))
            check_tensors(self.cfg, self.gguf.tensors, self.path)
            self.tokenizer = Tokenizer.from_metadata(meta, device.settings.tokenizer_cache_dir)
            self.placement = Placement()
            self.n_cpu_moe = min(max(n_cpu_moe, 0), self.cfg.n_layer) if self.cfg.moe else 0

            def host_pred(name: str) -> bool:
                return (on_host is not None and on_host(name)) or is_cpu_moe(name, self.n_cpu_moe)

            self._place(n_gpu_layers, pin, host_pred)
            views, fused = fused_views(self.cfg, self.weights)   # phi3: q/k/v and gate/up as views
            self._owned += [self.weights.pop(n) for n in fused]
            self.weights.update(views)
            log.info("%s: %s", os.path.basename(self.path), self.placement.summary())
        except BaseException:
            self.close()
            raise

    @property
    def size_bytes(self) -> int:
        return sum(t.nbytes for t in self.gguf.tensors.values())

    @property
    def n_params(self) -> int:
        return sum(math.prod(t.ne) for t in self.gguf.tensors.values())

    def _place(self, n_gpu_layers: int, pin: bool | None, on_host) -> None:
        cfg = self.cfg
        first_gpu_layer = max(cfg.n_layer - n_gpu_layers, 0)
        non_layer_gpu = n_gpu_layers > cfg.n_layer

        def host_resident(name: str) -> bool:
            if on_host is not None and on_host(name):
                return True
            il = layer_of(name)
            return il < first_gpu_layer if il is not None else not non_layer_gpu

        names = [n for n in self.gguf.tensors if (layer_of(n) or 0) < cfg.n_layer]
        skipped = len(self.gguf.tensors) - len(names)
        if skipped:   # multi-token-prediction blocks past the trunk: vkrt does not run them
            log.info("%s: %d tensors of %d multi-token-prediction layer(s) not loaded", os.path.basename(self.path),
                     skipped, cfg.n_layer_nextn)
        # tensors built from the file's (qwen3next's DeltaNet in the kernels' layout) replace them
        self._derived = derived = derived_tensors(cfg, self.gguf)
        consumed = {src for d in derived.values() for src in d.sources}
        names = [n for n in names if n not in consumed] + list(derived)

        def info_of(name: str):
            return derived[name] if name in derived else self.gguf.tensor(name)
        host = [n for n in names if host_resident(n)]
        vram = [n for n in names if n not in set(host)]
        pin = self.device.settings.register_host if pin is None else pin
        for device, mine in self._by_device(names):
            limit = binding_limit(device)
            together = []
            for il in range(cfg.n_layer):
                for group in SHARED_ALLOCATIONS:
                    group = [f"blk.{il}.{n}" for n in group]
                    if all(n in mine for n in group) and \
                            sum(info_of(n).nbytes + GROUP_ALIGN for n in group) <= limit:
                        together.append(group)
            self.weights.update(self.gguf.upload(device, [n for n in vram if n in mine], together=together,
                                                 derived=derived))
            if [n for n in host if n in mine]:
                self._map_host(device, [n for n in host if n in mine], pin)
        self.placement.vram_bytes = sum(info_of(n).nbytes for n in vram)
        if self.split is not None and "output.weight" not in self.gguf.tensors \
                and self.split.stage_of("token_embd.weight") != self.split.n_stages - 1:
            # tied embeddings: the main device multiplies by its own copy of token_embd
            self.output_weight = self.gguf.upload(self.device, ["token_embd.weight"])["token_embd.weight"]
            self.placement.vram_bytes += self.output_weight.nbytes

    def _by_device(self, names: list[str]) -> list[tuple[object, set[str]]]:
        """(device, the names it holds) for each device of the split (one device without one)."""
        if self.split is None:
            return [(self.device, set(names))]
        out = [(dev, set()) for dev in self.split.devices]
        for n in names:
            out[self.split.stage_of(n)][1].add(n)
        return out

    def _map_host(self, device, names: list[str], pin: bool) -> None:
        """Host-resident tensors: read in place through imported (or once-copied) memory; a tensor
        straddling two import chunks, or everything when pinning is off, is copied once into a
        host-visible buffer of its own."""
        p = self.placement
        registry = host_registry(device) if pin else None
        if registry is not None:
            for part in self.gguf.parts:   # one region of each file (each part of a split model)
                mine = [n for n in names if n not in self._derived and self.gguf.part(n) is part]
                if not mine:
                    continue
                start = min(part.tensor(n).offset for n in mine)
                end = max(part.tensor(n).end for n in mine)
                base = part.data(mine[0]).ctypes.data - part.tensor(mine[0]).offset
                self._regions.append(registry.register(base + start, end - start, label=os.path.basename(part.path)))
        for name in names:
            derived = self._derived.get(name)
            info = derived or self.gguf.tensor(name)
            data = derived.make() if derived is not None else self.gguf.data(name)
            chunk = registry.chunk_at(data.ctypes.data) if registry is not None and derived is None else None
            rng = registry.lookup(data.ctypes.data, info.nbytes) if chunk is not None else None
            if rng is None:
                buf = Buffer(device, max(info.nbytes, 4), MemoryKind.HOST, label=f"{name} (host copy)")
                buf.write(data)
                self._owned.append(buf)
                rng = buf.range(0, info.nbytes)
                p.host_copied += info.nbytes
            elif chunk.imported:
                p.host_imported += info.nbytes
            else:  # the registry's host-visible fallback copy
                p.host_copied += info.nbytes
            self.weights[name] = Tensor.on(rng, info.type, info.ne, name=name)
            p.host_bytes += info.nbytes
            p.host_tensors.append(name)

    def _release(self) -> None:
        for name, t in self.weights.items():
            t.close()
        self.weights.clear()
        if self.output_weight is not None:
            self.output_weight.close()
        for b in self._owned:
            b.close()
        for region in self._regions:
            region.close()
        self.gguf.close()
