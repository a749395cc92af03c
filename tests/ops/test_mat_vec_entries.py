"""The mat-vec's entry shaders (vkrt/ops/mat_vec.py ENTRIES): every legal entry x feature
combination compiles, with the push layout mat_vec_kernel gives it, for representative weight
types and the subgroup layouts of lavapipe, the RX 580, NVIDIA and lavapipe emulating the RX 580's
64 lanes; every illegal one is refused with a ConfigError naming it."""

import dataclasses
import itertools
from types import SimpleNamespace

import pytest

from vkrt.device import Arch
from vkrt.device.tuning import TABLE
from vkrt.errors import ConfigError
from vkrt.memory import ggml_type
from vkrt.ops.mat_vec import ENTRIES, mat_vec_variant
from vkrt.pipeline.compiler import compile_shader
from vkrt.pipeline.spirv import reflect

# plain (K not a multiple of 4), the 4-unit blocks, 16-byte loads with the header in one load,
# a 16-unit type reading its grids from shared memory
TYPES = ("F32", "Q4_0", "Q4_K", "IQ2_XXS")
# (name, subgroup lanes the layout is for, lanes the device runs, tuning table)
LAYOUTS = (("lavapipe", 8, 8, Arch.LLVMPIPE), ("RX 580", 64, 64, Arch.AMD_GCN), ("NVIDIA", 32, 32, Arch.NVIDIA),
           ("RX 580 emulated on 8 lanes", 64, 8, Arch.AMD_GCN))


def layout_device(device, lanes: int, runs: int, arch: Arch):
    """A stand-in for a device of `lanes`-wide subgroups (running `runs` lanes) with `arch`'s table."""
    prof = dataclasses.replace(device.profile, subgroup_min=lanes, subgroup_max=lanes, subgroup_size=runs,
                               subgroup_shuffle=True, subgroup_arithmetic=True)
    return SimpleNamespace(profile=prof, tuning=TABLE[arch].resolved(prof))


def route_defines(dev, one: bool) -> dict:
    """moe.route_epilogue's defines for 64 experts: a one-subgroup router (its epilogue in the
    first subgroup) or the router of several subgroups routed by the whole workgroup."""
    lanes = dev.profile.subgroup_min
    rwg = lanes if one else 64
    defines = {"RWG": rwg, "EPT": 64 // rwg + (64 % rwg > 0), "SUBGROUPS": 1}
    return defines | ({"NSG": 1, "ROUTE_SUBGROUP": 1} if one else {"NSG": max(1, dev.tuning.mv_wg // lanes)})


def combinations(entry: str):
    """(keyword arguments of mat_vec_variant, shape) of every feature subset of `entry`, and of
    the entry's own arguments: token columns, routing, slots."""
    features = sorted(ENTRIES[entry])
    for subset in itertools.chain.from_iterable(itertools.combinations(features, n) for n in range(len(features) + 1)):
        kw = {"gate_up": "silu" if "gate_up" in subset else None, "bias": "bias" in subset,
              "norm_in": "norm_in" in subset}
        if entry == "mul_mv":
            yield from ((dict(kw), dict(n=n, k=512, m=64)) for n in (1, 4))
        elif entry == "mul_mv_id":
            yield kw, dict(n=1, k=512, m=64, layers=4)
        elif entry == "mul_mv_route":
            yield from (({**kw, "route": one}, dict(n=n, k=256, m=64)) for one in (False, True) for n in (1, 2))
        else:   # a block a row: a few lanes a slot, the slots' groups within the norm's subgroups
            yield {**kw, "slots": 8}, dict(n=1, k=0, m=256)


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout[0] for layout in LAYOUTS])
def test_every_legal_combination_compiles(device, entry, layout):
    """Each combination of ENTRIES compiles for TYPES with the push layout mat_vec_kernel builds,
    where the layout gives it one (a norm the layout cannot redo is refused, never compiled
    wrong); the emulated layout routes in one subgroup only where the workgroup is one."""
    name, lanes, runs, arch = layout
    dev = layout_device(device, lanes, runs, arch)
    built = 0
    for typ_name, (kw, shape) in itertools.product(TYPES, combinations(entry)):
        typ = ggml_type(typ_name)
        kw = dict(kw)
        tuning = dev.tuning
        if "route" in kw:
            one = kw["route"]
            if one and runs < lanes:
                tuning = dataclasses.replace(tuning, mv_wg=lanes)
            kw["route"] = route_defines(SimpleNamespace(profile=dev.profile, tuning=tuning), one)
        k = shape["k"] + (3 if typ_name == "F32" and entry == "mul_mv" else 0) or max(32, typ.block_size)
        try:
            defines, push, _ = mat_vec_variant(dev, typ, shape["n"], tuning, k=k, m=shape["m"],
                                               layers=shape.get("layers", 1), xvec4=k % 4 == 0, entry=entry,
                                               wide=typ_name == "Q4_K", **kw)
        except ConfigError as exc:
            assert "RMS norm" in str(exc), exc
            continue
        spirv = compile_shader(entry, defines, cache_dir=device.settings.shader_cache_dir,
                               glslang_lib=device.settings.glslang_lib)
        push.check(reflect(spirv), f"{entry} {defines}")
        built += 1
    assert built, f"{entry}: no combination compiled on the {name} layout"


@pytest.mark.parametrize("entry, kw, says", [
    ("mul_mv", dict(bias=True), "does not take bias"),
    ("mul_mv", dict(norm_in=True), "does not take norm_in"),
    ("mul_mv_id", dict(norm_in=True), "does not take norm_in"),
    ("mul_mv_route", dict(gate_up="silu", route={}), "does not take gate_up"),
    ("mul_mv_id_sum", dict(bias=True, slots=8), "does not take bias"),
    ("mul_mv_id_sum", dict(gate_up="silu", slots=8), "does not take gate_up"),
    ("mul_mv", dict(route={}), "only it, takes the routing"),
    ("mul_mv_route", dict(), "only it, takes the routing"),
    ("mul_mv_id", dict(slots=8), "only it, takes the slots"),
    ("mul_mv_id_sum", dict(), "only it, takes the slots"),
    ("mul_mv_id", dict(n=2), "one column"),
    ("mul_mv_glu", dict(), "no entry shader"),
])
def test_illegal_combinations_are_refused(device, entry, kw, says):
    kw = dict(kw)
    n = kw.pop("n", 1)
    with pytest.raises(ConfigError, match=says):
        mat_vec_variant(device, ggml_type("Q4_0"), n, device.tuning, k=256, m=64, xvec4=True, entry=entry, **kw)
