"""CUDA host -> device copy rates (pinned and pageable memory), the PCIe reference of bench/h2d.py:
through PyTorch where it has CUDA, else straight through the NVIDIA driver (libcuda.so.1 with
ctypes), so the reference needs nothing beyond the driver."""

from __future__ import annotations

import ctypes
from typing import Callable

Timer = Callable[[Callable[[], None], int], float]  # (copy, size) -> seconds


class _CudaFailed(Exception):
    pass


def measure(sizes: list[int], seconds: Timer) -> tuple[dict | None, str]:
    """({"via", "device", "pinned": [...], "pageable": [...]}, "") or (None, why not)."""
    result, why_torch = _with_torch(sizes, seconds)
    if result is not None:
        return result, ""
    result, why_driver = _with_driver(sizes, seconds)
    if result is not None:
        return result, ""
    return None, f"{why_torch}; {why_driver}"


def _rows(sizes, seconds, copy) -> list[dict]:
    out = []
    for size in sizes:
        sec = seconds(lambda: copy(size), size)
        out.append({"size_bytes": size, "seconds": sec, "gbps": size / sec / 1e9})
    return out


def _with_torch(sizes, seconds) -> tuple[dict | None, str]:
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, "PyTorch has no CUDA device"
    top = sizes[-1]
    dst = torch.empty(top, dtype=torch.uint8, device="cuda")
    sources = {"pinned": torch.ones(top, dtype=torch.uint8).pin_memory(),
               "pageable": torch.ones(top, dtype=torch.uint8)}
    out = {"via": "torch", "device": torch.cuda.get_device_name()}
    for name, src in sources.items():
        def copy(size, src=src):
            dst[:size].copy_(src[:size], non_blocking=True)
            torch.cuda.synchronize()
        out[name] = _rows(sizes, seconds, copy)
    sources.clear()
    dst = None  # noqa: F841 (frees the device copy before emptying the cache)
    torch.cuda.empty_cache()
    return out, ""


def _with_driver(sizes, seconds) -> tuple[dict | None, str]:
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, "no NVIDIA driver library (libcuda.so.1)"
    try:
        _declare(cu)
    except AttributeError as exc:
        return None, f"libcuda.so.1 lacks a driver function: {exc}"

    def check(result: int, what: str) -> None:
        if result != 0:
            raise _CudaFailed(f"{what} returned CUresult {result}")

    top = sizes[-1]
    device, ctx = ctypes.c_int(), ctypes.c_void_p()
    dptr, pinned = ctypes.c_uint64(), ctypes.c_void_p()
    retained = False
    try:
        check(cu.cuInit(0), "cuInit")
        check(cu.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        name = ctypes.create_string_buffer(256)
        check(cu.cuDeviceGetName(name, 256, device), "cuDeviceGetName")
        check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
        retained = True
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        check(cu.cuMemAlloc_v2(ctypes.byref(dptr), top), "cuMemAlloc")
        check(cu.cuMemAllocHost_v2(ctypes.byref(pinned), top), "cuMemAllocHost")
        ctypes.memset(pinned, 1, top)
        pageable = (ctypes.c_char * top)()
        ctypes.memset(pageable, 1, top)
        out = {"via": "libcuda", "device": name.value.decode()}
        for label, src in (("pinned", pinned.value), ("pageable", ctypes.addressof(pageable))):
            def copy(size, src=src):
                check(cu.cuMemcpyHtoD_v2(dptr.value, src, size), "cuMemcpyHtoD")
                check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            out[label] = _rows(sizes, seconds, copy)
        return out, ""
    except _CudaFailed as exc:
        return None, f"CUDA driver: {exc}"
    finally:
        if pinned.value:
            cu.cuMemFreeHost(pinned)
        if dptr.value:
            cu.cuMemFree_v2(dptr)
        if retained:
            cu.cuDevicePrimaryCtxRelease_v2(device)


def _declare(cu) -> None:
    c_int, c_void_p, c_u64, c_size = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
    p = ctypes.POINTER
    signatures = {
        "cuInit": [ctypes.c_uint],
        "cuDeviceGet": [p(c_int), c_int],
        "cuDeviceGetName": [ctypes.c_char_p, c_int, c_int],
        "cuDevicePrimaryCtxRetain": [p(c_void_p), c_int],
        "cuDevicePrimaryCtxRelease_v2": [c_int],
        "cuCtxSetCurrent": [c_void_p],
        "cuCtxSynchronize": [],
        "cuMemAlloc_v2": [p(c_u64), c_size],
        "cuMemFree_v2": [c_u64],
        "cuMemAllocHost_v2": [p(c_void_p), c_size],
        "cuMemFreeHost": [c_void_p],
        "cuMemcpyHtoD_v2": [c_u64, c_void_p, c_size],
    }
    for name, args in signatures.items():
        fn = getattr(cu, name)
        fn.argtypes = args
        fn.restype = c_int
