"""A vision tower's weights on the GPU, read from its mmproj file as the towers use them: vectors
(norms, biases) and position tables as F32, a patch conv kernel [p, p, 3, E] as a matrix
[3 p p, E], other matrices as the file stores them, and a matrix the tower multiplies by its
transpose (Gemma 3's mm.input_projection.weight) transposed on the host."""

from __future__ import annotations

import math

import gguf
import numpy as np

from ..commands import tensor_from_numpy, write_tensor
from ..errors import GGUFError
from ..memory import F16, F32, Tensor
from .gguf_file import GGUFFile
from .vision_config import VisionConfig, vision_config

PLAIN = (F32, F16)   # types vkrt reads as they are stored


def is_vector(ne) -> bool:
    return len([d for d in ne if d > 1]) <= 1


def upload_weight(device, f: GGUFFile, name: str) -> Tensor:
    """The tensor `name` of the open file `f` on `device` (see the module's docstring)."""
    info = f.tensors[name]
    raw = f.data(name)
    if info.type in PLAIN and (is_vector(info.ne) or name == "v.position_embd.weight"):
        arr = raw.view(info.type.dtype).astype(np.float32).reshape(tuple(reversed(info.ne)))
        return tensor_from_numpy(device, arr, name=name)
    if name.startswith("v.patch_embd.weight"):   # a conv kernel [p, p, 3, E] read as a matrix [3 p p, E]
        ne = (info.ne[0] * info.ne[1] * info.ne[2], info.ne[3])
    else:
        ne = tuple(info.ne) + (1,) * (2 - len(info.ne))
    t = Tensor.empty(device, info.type, ne, name=name)
    if info.type.quantized:
        write_tensor(t, raw.reshape(ne[1], -1))
    else:
        write_tensor(t, raw.view(info.type.dtype))
    return t


def transposed_matrix(f: GGUFFile, name: str) -> np.ndarray:
    """The 2-D tensor `name` ([n0, n1]) transposed, as numpy [n0, n1] rows of n1 (a matrix vkrt
    multiplies as ggml multiplies the tensor's transpose): F16 stays F16, others become F32
    (quantised ones dequantised by gguf.quants)."""
    info = f.tensors[name]
    n0, n1 = info.ne[0], info.ne[1]
    raw = f.data(name)
    if info.type in PLAIN:
        arr = raw.view(info.type.dtype).reshape(n1, n0)
    else:
        arr = gguf.quants.dequantize(raw.reshape(n1, -1), gguf.GGMLQuantizationType(info.type.id)).reshape(n1, n0)
        arr = arr.astype(np.float32)
    return np.ascontiguousarray(arr.T)


def transposed_bytes(info) -> int:
    """Bytes transposed_matrix's result takes on the GPU."""
    return math.prod(info.ne) * (2 if info.type is F16 else 4)


def upload_transposed(device, f: GGUFFile, name: str) -> Tensor:
    """transposed_matrix(f, name) on `device`."""
    return tensor_from_numpy(device, transposed_matrix(f, name), name=name)


def load_tower(device, path: str, projector: str, what: str, required, optional: tuple[str, ...],
               w: dict, upload=None) -> VisionConfig:
    """The config of the `projector` tower ("what", for the error) in the mmproj file at `path`;
    its tensors `required(config)` and those of `optional` the file has are uploaded into `w`
    (name -> Tensor, filled as they come, for the caller to close on an error): upload(f, name)
    -> (key, Tensor) where given, else upload_weight under the tensor's name."""
    with GGUFFile(path, progress=False) as f:
        vc = vision_config(path, f.metadata, f.tensors)
        if vc.projector != projector:
            raise GGUFError(f"{path}: a {vc.projector} projector is not {what} "
                            "(vision_towers.open_encoder picks the tower of a file)")
        names = required(vc)
        missing = [n for n in names if n not in f.tensors]
        if missing:
            raise GGUFError(f"{path}: the vision projector lacks tensor(s) {', '.join(missing[:4])}")
        for name in names + [n for n in optional if n in f.tensors]:
            key, t = upload(f, name) if upload is not None else (name, upload_weight(device, f, name))
            w[key] = t
    return vc
