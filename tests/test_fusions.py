"""Lossless fusions (vkrt/model/fuse.py, chosen by VKRT_FUSE), bit for bit against the separate
kernels on every architecture, each with the commands it saves counted: each block's residual
add inside the next RMS norm (add_norm: two commands fewer a layer), q/k norm + RoPE + K's cache
store in one kernel (norm_rope: norms, ropes, set_rows; three commands fewer a layer with q/k
norms, one without), for decode the gate and up projections in one pass with the activation on
its output (gate_up: two commands fewer a gated FFN), V's cache store inside K's norm_rope
dispatch (kv_store), a MoE block's weighted sum of its experts inside the next RMS norm
(combine_norm: moe_combine's pass a MoE layer), and the decode fusions below."""

import dataclasses

import numpy as np
import pytest

from models import tiny_model
from vkrt.device.tuning import TABLE, Arch
from vkrt.engine.engine import Engine
from vkrt.model.loader import Model

PROMPT = [5, 9, 2, 11, 3, 7, 1, 4]
# the tuning fields that decide which steps of a tiny model fuse (the mat-vec's column limits,
# workgroups, the norm's workgroup): pinned to lavapipe's table, which the counts below assume.
# The H200's (mv_dense_max_n = 4, norm workgroups of 1024) leaves the 8-token prefill and the
# router's norm prologue apart, so the counts would say nothing and the bits would be compared
# between two unfused runs
SHAPE_FIELDS = ("mv_wg", "mv_max_n", "mv_dense_max_n", "mv_id_max_n", "mv_chunk_n", "reduce_wg")


@pytest.fixture(autouse=True)
def _lavapipe_shape_limits(device, monkeypatch):
    lp = TABLE[Arch.LLVMPIPE].resolved(device.profile)
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, **{f: getattr(lp, f) for f in SHAPE_FIELDS}))


# the fusions a test of each leaves off on both sides, so that the commands it saves are its own:
# every add+norm a kernel of its own, none in a router's prologue (which needs route); q's
# norm_rope its own dispatch; norm_rope's decode dispatch counted, not in the attention; the norms
# before the projections counted as dispatches
PINNED_OFF = {"add_norm": ("norm_route", "fa_rope", "resid_norm"), "route": ("norm_route", "fa_rope", "resid_norm"),
              "norm_rope": ("qk_rope", "kv_store", "fa_rope", "resid_norm"), "kv_store": ("qk_rope", "fa_rope", "resid_norm"),
              "fa_rope": ("resid_norm",), "resid_norm": ("fa_rope",)}


def fuse_items(fuse: bool, fusion: str) -> str:
    """VKRT_FUSE for a run with `fusion` on or off: every other fusion on, but PINNED_OFF's."""
    off = PINNED_OFF.get(fusion, ("fa_rope", "resid_norm")) + (() if fuse else (fusion,))
    return ",".join(("all", *(f"-{name}" for name in off)))


def run(device, path, device_env, fuse: bool, fusion: str = "add_norm", **engine_kw):
    device_env("VKRT_FUSE", fuse_items(fuse, fusion))
    out, dispatches = run_as_set(device, path, **engine_kw)
    with Model(device, path, progress=False) as m:
        return out, dispatches, m.cfg


def run_as_set(device, path, **engine_kw):
    """A prompt, then two decode steps, with the device's settings as they are: (the logits, the
    dispatches both graphs recorded); run_as_set.barriers: their barriers."""
    with Model(device, path, progress=False, n_cpu_moe=engine_kw.pop("n_cpu_moe", 0)) as m, \
            Engine(m, n_ctx=64, n_ubatch=16, **engine_kw) as e:
        prefill = e.eval(PROMPT, all_logits=True)
        decode = [e.eval([int(np.argmax(prefill[-1]))])]
        decode.append(e.eval([int(np.argmax(decode[-1]))]))
        dispatches = sum(s.dispatch_count for g in e.steps.graphs.values() for s in g.seqs)
        run_as_set.barriers = sum(s.barrier_count for g in e.steps.graphs.values() for s in g.seqs)
        return np.concatenate([prefill.reshape(-1), *decode]), dispatches


def commands_saved(device, tmp_path, device_env, name, fusion="add_norm", **engine_kw):
    """Run `name` with `fusion` on and off (fuse_items), assert the outputs are the same bits;
    returns (commands the fusion saves over both graphs, the model's config)."""
    path = tiny_model(name, tmp_path)
    fused, n_fused, cfg = run(device, path, device_env, True, fusion, **engine_kw)
    plain, n_plain, _ = run(device, path, device_env, False, fusion, **engine_kw)
    np.testing.assert_array_equal(fused.view(np.uint32), plain.view(np.uint32))
    return n_plain - n_fused, cfg


def sums_in_norm(cfg) -> int:
    """MoE layers whose experts' sum the next norm adds (combine_norm): not where an
    ungated shared expert is added after the sum (granitemoe, glm4moe) or the block output is
    scaled first (granite's residual_scale)."""
    if cfg.residual_scale:
        return 0
    return sum(1 for layer in cfg.layers
               if layer.moe and not (layer.ffn == "moe_shared" and not cfg.spec.moe.shared_gate))


def gated_ffns(cfg) -> int:
    """Gated FFNs a forward pass runs: one a layer, two where a shared expert joins the routed ones."""
    return sum(2 if layer.ffn == "moe_shared" else 1 for layer in cfg.layers)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-qwen3moe",
                                  "tiny-qwen2moe", "tiny-qwen35moe", "tiny-qwen35", "tiny-gpt-oss", "tiny-olmoe",
                                  "tiny-granite", "tiny-granitemoe", "tiny-qwen3next", "tiny-glm4moe", "tiny-phi3"])
def test_fused_add_norm_is_bit_identical(device, tmp_path, device_env, name):
    """granite: each block's output scaled (residual_scale) before either path adds it. Apart, a
    MoE block's experts are summed by moe_combine first (COMBINE_NORM needs ADD_NORM)."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name)
    assert saved == 2 * (cfg.n_layer * 2 + sums_in_norm(cfg))   # two graphs (prefill, decode), one add per block


@pytest.mark.parametrize("name,n_cpu_moe", [("tiny-qwen3moe", 0), ("tiny-qwen3moe", 2), ("tiny-qwen2moe", 0),
                                            ("tiny-qwen35moe", 0), ("tiny-qwen35moe", 2), ("tiny-gpt-oss", 0),
                                            ("tiny-olmoe", 0), ("tiny-qwen3next", 2), ("tiny-granitemoe", 0),
                                            ("tiny-glm4moe", 0)])
def test_experts_summed_in_the_next_norm_is_bit_identical(device, tmp_path, device_env, name, n_cpu_moe):
    """The next layer's (or the output's) RMS norm adds the MoE block's weighted sum of its experts
    (qwen2moe, qwen35moe, qwen3next: with the sigmoid-gated shared expert) as moe_combine would
    store it, experts in VRAM and staged from host; granitemoe (residual_scale) and glm4moe (the
    ungated shared expert added after the sum) keep moe_combine."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "combine_norm", n_cpu_moe=n_cpu_moe,
                                stage_experts=True)
    assert saved == 2 * sums_in_norm(cfg)   # both graphs: moe_combine's pass a MoE layer
    assert name in ("tiny-granitemoe", "tiny-glm4moe") or saved > 0


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-qwen3moe", "tiny-qwen35moe",
                                  "tiny-gpt-oss", "tiny-olmoe", "tiny-granite", "tiny-qwen3next", "tiny-glm4moe",
                                  "tiny-glm4moe-air", "tiny-phi3"])
def test_fused_norm_rope_is_bit_identical(device, tmp_path, device_env, name):
    """With q/k norms (qwen3, gemma3, qwen3moe) and without (llama, gpt-oss: YaRN; granite);
    gemma3 and gpt-oss have sliding layers; qwen35moe's queries are a strided view (each head's
    gate follows its query) under IMROPE; olmoe's whole-vector q/k norms run before, apart."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "norm_rope")
    per_layer = 1 if name in ("tiny-llama", "tiny-gpt-oss", "tiny-olmoe", "tiny-granite", "tiny-glm4moe-air",
                              "tiny-phi3") else 3
    assert saved == 2 * len(cfg.kv_layers) * per_layer   # DeltaNet layers have no RoPE


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-qwen3moe", "tiny-qwen35moe",
                                  "tiny-gpt-oss", "tiny-qwen3next", "tiny-glm4moe", "tiny-phi3", "tiny-mistral3"])
def test_q_in_the_k_dispatch_is_bit_identical(device, tmp_path, device_env, name):
    """The queries' norm_rope riding in K's dispatch (qk_rope): with q/k norms and
    without (llama, gpt-oss: YaRN, phi3: views of attn_qkv), sliding layers (gemma3, gpt-oss),
    IMROPE sections and queries strided between their gates (qwen35moe, qwen3next); mistral3's
    queries carry the attention temperature and keep their own dispatch."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "qk_rope")
    assert saved == (0 if name == "tiny-mistral3" else 2 * len(cfg.kv_layers))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-qwen3moe", "tiny-qwen35moe",
                                  "tiny-gpt-oss", "tiny-qwen3next", "tiny-glm4moe", "tiny-phi3", "tiny-mistral3",
                                  "tiny-olmoe"])
def test_norm_rope_in_the_attention_is_bit_identical(device, tmp_path, device_env, name):
    """The decode step's q/k norm, RoPE and K/V cache stores in flash attention's prologue
    (fa_rope): norm_rope's dispatch and its barrier gone a layer in the decode graph,
    the same bits: with q/k norms and without (llama), sliding layers (gemma3), YaRN and sinks
    (gpt-oss), IMROPE and queries strided between their gates (qwen35moe, qwen3next), views of
    attn_qkv (phi3), projection biases (glm4moe), whole-vector norms before it (olmoe);
    mistral3's attention temperature keeps norm_rope."""
    path = tiny_model(name, tmp_path)
    fused, n_fused, cfg = run(device, path, device_env, True, "fa_rope")
    barriers_fused = run_as_set.barriers
    plain, n_plain, _ = run(device, path, device_env, False, "fa_rope")
    np.testing.assert_array_equal(fused.view(np.uint32), plain.view(np.uint32))
    assert n_plain - n_fused == (0 if name == "tiny-mistral3" else len(cfg.kv_layers))
    assert run_as_set.barriers - barriers_fused == n_plain - n_fused


@pytest.mark.parametrize("name,n_cpu_moe", [("tiny-qwen3moe", 0), ("tiny-qwen3moe", 2), ("tiny-qwen2moe", 0),
                                            ("tiny-qwen35moe", 0), ("tiny-qwen35moe", 2), ("tiny-qwen3next", 0),
                                            ("tiny-olmoe", 0), ("tiny-gpt-oss", 0), ("tiny-granitemoe", 0),
                                            ("tiny-glm4moe", 0), ("tiny-llama", 0), ("tiny-qwen35", 0)])
def test_residual_sum_and_next_norm_in_the_down_projection_is_bit_identical(device, tmp_path, device_env, name,
                                                                           n_cpu_moe):
    """The experts' summed down projection adds its sum into the residual stream and its last
    workgroup does the next block's RMS norm (the next layer's or the output's; resid_norm):
    the same bits, experts in VRAM and staged from host; the combining norm's dispatch and its
    barrier gone a MoE layer in both graphs (the 8-token prompt is mat-vec sized). gpt-oss (expert
    biases), granitemoe (residual_scale) and the layers with a shared expert (qwen2moe, qwen35moe,
    qwen3next, glm4moe: the sum would wait for its down projection) keep the norm apart, as do
    dense models."""
    path = tiny_model(name, tmp_path)
    fused, n_fused, cfg = run(device, path, device_env, True, "resid_norm", n_cpu_moe=n_cpu_moe,
                              stage_experts=True)
    barriers_fused = run_as_set.barriers
    plain, n_plain, _ = run(device, path, device_env, False, "resid_norm", n_cpu_moe=n_cpu_moe,
                            stage_experts=True)
    np.testing.assert_array_equal(fused.view(np.uint32), plain.view(np.uint32))
    summed = 0 if name in ("tiny-gpt-oss", "tiny-granitemoe") else sum(
        1 for layer in cfg.layers if layer.moe and layer.ffn != "moe_shared")
    assert n_plain - n_fused == 2 * summed
    assert run_as_set.barriers - barriers_fused == n_plain - n_fused
    assert summed or name not in ("tiny-qwen3moe", "tiny-olmoe")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-qwen35moe", "tiny-gpt-oss",
                                  "tiny-qwen3next", "tiny-glm4moe", "tiny-phi3"])
def test_v_store_in_the_k_dispatch_is_bit_identical(device, tmp_path, device_env, name):
    """V's cache store inside K's norm_rope dispatch (kv_store): one command fewer a
    layer with attention, in both graphs; sliding layers (gemma3, gpt-oss), IMROPE (qwen35moe)."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "kv_store")
    assert saved == 2 * len(cfg.kv_layers)


def back_to_back(m, il: int, names) -> int:
    """How many of layer il's weights `names` follow the first back to back in memory, in order."""
    ts = [m.weights.get(f"blk.{il}.{n}.weight") for n in names]
    n = 0
    for a, b in zip(ts, ts[1:]):
        if a is None or b is None or b.buffer is not a.buffer or b.offset != a.offset + a.nbytes:
            break
        n += 1
    return n


@pytest.mark.parametrize("name,pairs", [("tiny-qwen35moe", 1), ("tiny-qwen35-f32", 2), ("tiny-qwen3next", 1),
                                        ("tiny-llama", 0), ("tiny-qwen2", 0), ("tiny-qwen3moe", 0), ("tiny-gemma3", 0)])
def test_stacked_projections_are_bit_identical(device, tmp_path, device_env, name, pairs):
    """A DeltaNet block's attn_qkv and attn_gate projections as one mat-vec over their stacked
    rows, and its ssm_alpha and ssm_beta where the loader's 256-byte alignment leaves them back
    to back (F32 rows of 64: 1 KiB; Q8_0's 4 rows of 68 bytes are not): one command fewer a
    pair, in both graphs (the prompt's 8 tokens and decode's one are mat-vec sized). Attention's
    q, k and v: one command fewer for each of k and v whose weight follows the one before it,
    in the decode graph (one token's q, k and v outputs lie back to back; the prompt's do not)."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "stacked")
    with Model(device, tiny_model(name, tmp_path), progress=False) as m:
        attention = sum(back_to_back(m, il, ("attn_q", "attn_k", "attn_v")) for il in cfg.kv_layers)
    assert saved == 2 * pairs * len(cfg.linear_layers) + attention
    if not cfg.linear_layers:
        assert attention >= cfg.n_layer   # q|k at least, in every layer of these models


@pytest.mark.parametrize("name,n_cpu_moe", [("tiny-llama", 0), ("tiny-gemma3", 0), ("tiny-qwen3moe", 0),
                                            ("tiny-qwen35moe", 0), ("tiny-qwen35moe", 2), ("tiny-qwen35", 0),
                                            ("tiny-granite", 0), ("tiny-granitemoe", 0), ("tiny-qwen3next", 0),
                                            ("tiny-qwen3next", 2), ("tiny-glm4moe", 0), ("tiny-phi3", 0)])
def test_fused_gate_up_is_bit_identical(device, tmp_path, device_env, name, n_cpu_moe):
    """Dense (silu, gemma3's gelu), expert and shared-expert gate/up pairs in VRAM (the loader
    puts each pair in one allocation; phi3: views of one ffn_up); experts staged from host stay
    apart and still agree."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "gate_up", n_cpu_moe=n_cpu_moe,
                                stage_experts=True)
    fewer = 2 * 2 * (gated_ffns(cfg) - n_cpu_moe)   # both graphs are mat-vec sized
    if n_cpu_moe:   # host experts fuse only where a prefetch slot holds gate and up together
        assert fewer <= saved <= fewer + 2 * 2 * n_cpu_moe and saved % 4 == 0
    else:
        assert saved == fewer


@pytest.mark.parametrize("name,n_cpu_moe", [("tiny-qwen3moe", 0), ("tiny-qwen3moe", 2), ("tiny-qwen2moe", 0),
                                            ("tiny-qwen35moe", 0), ("tiny-gpt-oss", 0), ("tiny-olmoe", 0),
                                            ("tiny-granitemoe", 0), ("tiny-qwen3next", 2), ("tiny-glm4moe", 0)])
def test_routing_in_the_router_mat_vec_is_bit_identical(device, tmp_path, device_env, name, n_cpu_moe):
    """The router's mat-vec routes the tokens in its last workgroup (softmax and renormalised top-k;
    glm4moe's sigmoid gating with its selection bias) instead of a moe_route dispatch after it,
    experts in VRAM and from host; gpt-oss's router bias keeps them apart."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "route", n_cpu_moe=n_cpu_moe)
    moe_layers = sum(1 for layer in cfg.layers if layer.moe)
    assert saved == (0 if cfg.spec.moe.router_bias else 2 * moe_layers)   # both graphs are mat-vec sized


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-qwen35moe"])
@pytest.mark.parametrize("dense_max_n", [4, 8])
def test_routing_in_runs_of_the_router_mat_vec_is_bit_identical(device, tmp_path, monkeypatch, device_env, name,
                                                                dense_max_n):
    """Mat-vec runs of 4 columns (the GCN and NVIDIA tables) or one of 8: the 8-token prompt's
    router runs in two (or one), each routing its tokens in its last workgroup, instead of its
    plain runs and moe_route's dispatch; logits bit for bit."""
    import dataclasses
    monkeypatch.setattr(device, "tuning", dataclasses.replace(device.tuning, mv_max_n=8, mv_dense_max_n=dense_max_n,
                                                              mv_chunk_n=16))
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "route")
    # the prompt and a decode step each save moe_route's dispatch: the runs are as many either way
    assert saved == 2 * sum(1 for layer in cfg.layers if layer.moe)


@pytest.mark.parametrize("name,n_cpu_moe", [("tiny-qwen3moe", 0), ("tiny-qwen3moe", 2), ("tiny-qwen2moe", 0),
                                            ("tiny-qwen35moe", 0), ("tiny-qwen35moe", 2), ("tiny-olmoe", 0),
                                            ("tiny-granitemoe", 0), ("tiny-glm4moe", 0), ("tiny-qwen3next", 2),
                                            ("tiny-gpt-oss", 0)])
def test_norm_in_the_router_mat_vec_is_bit_identical(device, tmp_path, device_env, name, n_cpu_moe):
    """The residual add and RMS norm before a MoE block in the prologue of its router's mat-vec
    (norm_route, one token), each workgroup redoing the norm workgroup's sums, against the
    add_rms_norm dispatch: after attention and after DeltaNet (qwen35moe, qwen3next), the shared
    expert reading the normed input (qwen2moe), granite's scaled block output, glm4moe's dense
    first layer and sigmoid router, experts in VRAM and from host; gpt-oss's router bias keeps
    its routing, so its norm, apart."""
    saved, cfg = commands_saved(device, tmp_path, device_env, name, "norm_route", n_cpu_moe=n_cpu_moe)
    moe_layers = sum(1 for layer in cfg.layers if layer.moe)
    # the decode graph only: the prompt's graph is mat-vec sized too, but a norm over several
    # tokens stays a dispatch of its own
    assert saved == (0 if cfg.spec.moe.router_bias else moe_layers)


@pytest.mark.parametrize("variable,n_cpu_moe", [("gate_up", 0), ("gate_up", 2),
                                                ("resid_norm", 0)])
def test_expert_biases_in_the_expert_fusions(device, tmp_path, device_env, variable, n_cpu_moe):
    """gpt-oss's expert biases: the fused gate/up pass adds gate's and up's before swiglu_oai
    where the mat-vec reads the experts by their own ids (staged slots from host: add_id after
    it); the summed down projection has no place for them and records nothing different. Bits
    equal the separate kernels' throughout."""
    saved, cfg = commands_saved(device, tmp_path, device_env, "tiny-gpt-oss", variable, n_cpu_moe=n_cpu_moe,
                                stage_experts=True)
    in_vram = cfg.n_layer - n_cpu_moe   # both graphs are mat-vec sized: 2 x each layer's saving
    if variable == "gate_up":   # gate, up (their biases in their stores) and the activation: one pass
        # host experts fuse only where the prompt's prefetch slot holds gate and up together
        assert 2 * 2 * in_vram <= saved <= 2 * 2 * cfg.n_layer and saved % 2 == 0
    else:
        assert saved == 0


def test_fuse_setting_names_the_fusions():
    """VKRT_FUSE: unset or `all` is every fusion, `none` none; a name brings the fusions it builds
    on, a `-name` leaves it (and what builds on it) out of all; anything else is refused naming
    the variable and the item."""
    from vkrt.errors import ConfigError
    from vkrt.model.fuse import ALL, FUSIONS, enabled
    from vkrt.settings import BY_NAME, Settings
    assert enabled(Settings.from_env({}).fuse) == ALL == enabled(("all",)) == set(FUSIONS)
    assert enabled(Settings.from_env({"VKRT_FUSE": "none"}).fuse) == frozenset()
    assert enabled(Settings.from_env({"VKRT_FUSE": "fa_rope, GATE_UP"}).fuse) == {"fa_rope", "norm_rope", "gate_up"}
    assert enabled(("-norm_rope",)) == ALL - {"norm_rope", "qk_rope", "kv_store", "fa_rope"}
    assert enabled(("all", "-add_norm")) == ALL - {"add_norm", "combine_norm"}
    assert enabled(("norm_route", "-route")) == frozenset()
    with pytest.raises(ConfigError, match="VKRT_FUSE: 'gate_upp' is not a fusion"):
        enabled(("gate_upp",))
    with pytest.raises(ConfigError, match="VKRT_FUSE='add_norm;x'"):
        Settings.from_env({"VKRT_FUSE": "add_norm;x"})
    meaning = BY_NAME["VKRT_FUSE"].meaning   # the documented names are the pass's
    assert [n for n in meaning.replace(",", " ").replace("(", " ").split() if n in FUSIONS] == list(FUSIONS)


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-qwen35moe", "tiny-gemma3", "tiny-gpt-oss"])
def test_every_fuse_value_gives_the_same_bits(device, tmp_path, device_env, name):
    """Every value of VKRT_FUSE -- all, each fusion alone (with what it builds on), none -- gives the
    unfused run's logits bit for bit (experts from host for the MoE models: staged decode, prefetched
    prompt), and each one on its own changes what is recorded."""
    from vkrt.model.fuse import FUSIONS
    path = tiny_model(name, tmp_path)
    kw = dict(n_cpu_moe=1, stage_experts=True) if name != "tiny-gemma3" else {}

    def outputs(value):
        device_env("VKRT_FUSE", value)
        return run_as_set(device, path, **kw)
    plain, n_plain = outputs("none")
    counts = {}
    for value in ("all", *FUSIONS):
        got, counts[value] = outputs(value)
        np.testing.assert_array_equal(got.view(np.uint32), plain.view(np.uint32), err_msg=f"VKRT_FUSE={value}")
    assert counts["all"] < n_plain and sum(n < n_plain for n in counts.values()) >= 5


@pytest.mark.parametrize("dense_max_n", [4, 8])
def test_dense_gate_up_runs_past_mv_dense_max_n(device, tmp_path, monkeypatch, device_env, dense_max_n):
    """A dense FFN's fused gate/up pass takes the columns a mat-vec takes (mv_chunk_n), in runs
    of at most tuning.mv_dense_max_n (GCN and NVIDIA: 4; their registers grow with the columns)
    as the plain mat-vecs do: the 8-token prompt in two runs of 4 (or one of 8), logits equal to the unfused run's bit for bit either way."""
    import dataclasses

    from vkrt.device.tuning import TABLE, Arch
    from vkrt.ops.mat_vec import mat_vec_columns
    from vkrt.ops.mul_mat_id import mat_vec_tokens
    assert TABLE[Arch.AMD_GCN].mv_dense_max_n == 4 and TABLE[Arch.NVIDIA].mv_dense_max_n == 4
    tune = dataclasses.replace(device.tuning, mv_max_n=8, mv_dense_max_n=dense_max_n,
                               mv_id_max_n=32, mv_chunk_n=16)
    assert (mat_vec_columns(tune), mat_vec_tokens(tune)) == (dense_max_n, 32)
    monkeypatch.setattr(device, "tuning", tune)
    path = tiny_model("tiny-llama", tmp_path)
    fused_run, fused_n, _ = run(device, path, device_env, True, "gate_up")
    apart, apart_n, cfg = run(device, path, device_env, False, "gate_up")
    np.testing.assert_array_equal(fused_run.view(np.uint32), apart.view(np.uint32))
    runs = len(PROMPT) // dense_max_n
    # a layer's prompt: gate and up a dispatch a plain run each, and the activation, against one
    # a fused run; its decode step: gate, up and the activation against one
    assert apart_n - fused_n == (runs + 1 + 2) * cfg.n_layer


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen35moe", "tiny-qwen3next"])
def test_fused_weights_share_one_allocation(device, tmp_path, name):
    """The loader puts each group of weights one pass reads (a gated FFN's gate and up,
    attention's q, k and v, a DeltaNet block's qkv and gate, alpha and beta) in one allocation,
    in order, owned by the first."""
    from vkrt.model.gguf_source import GROUP_ALIGN
    from vkrt.model.tensors import SHARED_ALLOCATIONS
    groups = 0
    with Model(device, tiny_model(name, tmp_path), progress=False) as m:
        for il in range(m.cfg.n_layer):
            for group in SHARED_ALLOCATIONS:
                ts = [m.weights.get(f"blk.{il}.{n}") for n in group]
                if any(t is None for t in ts):
                    continue
                groups += 1
                assert ts[0].owner is not None and all(t.owner is None for t in ts[1:])
                for a, b in zip(ts, ts[1:]):
                    assert b.buffer is a.buffer and b.offset == a.offset + -(-a.nbytes // GROUP_ALIGN) * GROUP_ALIGN
    # per layer gate|up (and the shared expert's); per attention layer q|k|v; per DeltaNet layer
    # qkv|gate and alpha|beta
    assert groups == {"tiny-llama": 2 * 2, "tiny-qwen35moe": 4 * 2 + 1 + 3 * 2, "tiny-qwen3next": 4 * 2 + 1 + 3 * 2}[name]
