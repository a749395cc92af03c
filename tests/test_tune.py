"""Tuning overrides (VKRT_TUNE, the bench scripts' --set): parsing, refusals, the device's limits,
and a device opened with them (vkrt/device/tune.py)."""

import dataclasses

import pytest

from file_modules import load
from vkrt.device import Device
from vkrt.device.architecture import Arch
from vkrt.device.tune import describe_tune, parse_tune, tuning_for
from vkrt.device.tuning import TABLE
from vkrt.errors import TuningOverrideError
from vkrt.owned import live_objects
from vkrt.settings import Settings


def test_every_value_form_parses():
    text = "fa_loads_first=3, mv_rows_by_type=Q4_K:2+Q6_K:2 fa_unroll=off mv_narrow_types=none moe_read_in_place=Q4_0"
    assert dict(parse_tune(text)) == {"fa_loads_first": 3, "mv_rows_by_type": (("Q4_K", 2), ("Q6_K", 2)),
                                      "fa_unroll": False, "mv_narrow_types": (), "moe_read_in_place": ("Q4_0",)}
    assert parse_tune("") == () and parse_tune("mv_rows=2 mv_rows=8") == (("mv_rows", 8),)
    assert parse_tune("fa_loads_first_by_type=Q8_0:3+IQ4_NL:0") == (("fa_loads_first_by_type",
                                                                     (("Q8_0", 3), ("IQ4_NL", 0))),)
    assert parse_tune("fa_pack_rows_by_type=Q8_0:2 fa_pack_rows_by_type=none") == (("fa_pack_rows_by_type", ()),)
    assert parse_tune("fa_prologue_pack_rows_by_head=128:2+64:1") == (("fa_prologue_pack_rows_by_head",
                                                                       ((128, 2), (64, 1))),)
    assert parse_tune("fa_pack_rows_by_head=none") == (("fa_pack_rows_by_head", ()),)
    assert parse_tune("fa_pack_rows_by_head=128:2") == (("fa_pack_rows_by_head", ((128, 2),)),)
    assert parse_tune("fa_prompt_wg_by_head=none") == (("fa_prompt_wg_by_head", ()),)
    changes = parse_tune(text)
    assert parse_tune(describe_tune(changes)) == changes


@pytest.mark.parametrize("text, says", [
    ("fa_loads_first", "'fa_loads_first' is not FIELD=VALUE"),
    ("fa_load=3", "'fa_load' is not a tuning field; did you mean fa_loads_first"),
    ("arch=gcn", "arch is set by VKRT_ARCH"),
    ("mm_coopmat=1", "mm_coopmat is set by VKRT_COOPMAT"),
    ("fa_unroll=maybe", "fa_unroll is a switch"),
    ("mv_rows=-1", "mv_rows takes a whole number"),
    ("mv_rows=2.5", "mv_rows takes a whole number"),
    ("mv_rows_by_type=Q4K:2", "'Q4K' is not a GGUF weight type"),
    ("mv_rows_by_type=Q4_K", "TYPE:COUNT pairs"),
    ("mv_rows_by_type=Q4_K:0", "TYPE:COUNT pairs"),
    ("fa_prologue_pack_rows_by_head=Q8_0:2", "HEAD:COUNT pairs"),
    ("fa_prologue_pack_rows_by_head=128:0", "HEAD:COUNT pairs"),
    ("fa_pack_rows_by_head=Q8_0:2", "fa_pack_rows_by_head takes HEAD:COUNT pairs"),
    ("fa_loads_first=4", "fa_loads_first takes 0 to 3 .the kernel's LOADS_FIRST layouts., got 4"),
    ("fa_loads_first_by_type=Q8_0:3+Q4_0:9", "fa_loads_first_by_type takes 0 to 3"),
    ("mv_narrow_types=Q5_K+Q9_K", "'Q9_K' is not a GGUF weight type"),
])
def test_bad_items_are_refused_by_name(text, says):
    with pytest.raises(TuningOverrideError, match="VKRT_TUNE: .*" + says.replace("(", r"\(")):
        parse_tune(text)
    before = live_objects()
    with pytest.raises(TuningOverrideError, match="VKRT_TUNE: .*" + says.replace("(", r"\(")):
        Device(settings=Settings.from_env({"VKRT_TUNE": text}))   # refused before anything opens
    assert live_objects() == before


def test_overrides_apply_before_the_device_limits(device):
    gcn = dataclasses.replace(device.profile, architecture=Arch.AMD_GCN, compute_units=36,
                              max_workgroup_invocations=1024)
    assert tuning_for(gcn).fa_fill_groups == 72
    # a per-CU count is resolved against the device (a --set after resolution changed nothing)
    assert tuning_for(gcn, changes=parse_tune("fa_fill_per_cu=4")).fa_fill_groups == 144
    # the derived field set alone is taken as written
    t = tuning_for(gcn, changes=parse_tune("fa_fill_groups=100"))
    assert (t.fa_fill_groups, t.fa_fill_per_cu) == (100, 0)
    t = tuning_for(gcn, changes=parse_tune("mv_rows_by_type=Q4_K:2 fa_loads_first=3"))
    assert t.mv_rows_by_type == (("Q4_K", 2),) and t.fa_loads_first == 3
    assert t.mv_wg == TABLE[Arch.AMD_GCN].mv_wg   # the rest is the table's


def test_a_value_the_device_cannot_hold_is_an_error(device):
    small = dataclasses.replace(device.profile, architecture=Arch.AMD_GCN, max_workgroup_invocations=256)
    with pytest.raises(TuningOverrideError, match="fa_wg=512 cannot be honoured on .*resolves it to 256"):
        tuning_for(small, changes=parse_tune("fa_wg=512"))
    # a decode dot split is limited to the subgroup like fa_d_split
    narrow = dataclasses.replace(device.profile, architecture=Arch.NVIDIA, subgroup_min=8, subgroup_max=8,
                                 subgroup_shuffle=True)
    with pytest.raises(TuningOverrideError, match="fa_quant_decode_d_split_by_head=128:16 cannot be honoured .*128:8"):
        tuning_for(narrow, changes=parse_tune("fa_quant_decode_d_split_by_head=128:16"))
    held = tuning_for(narrow, changes=parse_tune("fa_quant_decode_d_split_by_head=128:4+64:2"))
    assert held.fa_quant_decode_d_split_by_head == ((128, 4), (64, 2))


def test_an_opened_device_takes_them(device):
    settings = Settings.from_env({"VKRT_TUNE": "mv_rows=2 fa_loads_first=0"})
    with Device(settings=settings) as dev:
        assert dev.tuning_overrides == (("mv_rows", 2), ("fa_loads_first", 0))
        assert (dev.tuning.mv_rows, dev.tuning.fa_loads_first) == (2, 0)
        assert dev.identity()["tune"] == "mv_rows=2 fa_loads_first=0"
    assert "tune" not in device.identity()


def test_a_scripts_set_items_follow_vkrt_tune(monkeypatch):
    """bench/common.py: --set items are added after VKRT_TUNE's, a later item winning; a --set item
    that does not parse is refused by that name."""
    common = load("bench", "common")
    monkeypatch.setenv("VKRT_TUNE", "mv_rows=2 fa_loads_first=0")
    assert parse_tune(common.bench_settings(["mv_rows=4", "fa_unroll=0"]).tune) == \
        (("mv_rows", 4), ("fa_loads_first", 0), ("fa_unroll", False))
    assert common.bench_settings().tune == "mv_rows=2 fa_loads_first=0"
    with pytest.raises(TuningOverrideError, match="--set: 'fa_load' is not a tuning field"):
        common.bench_settings(["fa_load=3"])
