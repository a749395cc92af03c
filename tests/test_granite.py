"""IBM Granite 3.x (GGUF `granite` and `granitemoe`, llama.cpp's granite graph): the tiny models
against a float64 numpy forward pass written from llama.cpp's graph, prefill and decode, flash
attention and the three-kernel path, the MoE's experts in VRAM and on the host.

    x = token_embd[tokens] * embedding_scale
    per layer:
        h = rms_norm(x) * attn_norm
        q, k, v = attn_{q,k,v}·h;  q, k = normal (GPT-J) RoPE
        x = x + residual_scale * (attn_output·softmax(q k^T * attention.scale + mask) v + attn_output.bias)
        h = rms_norm(x) * ffn_norm
        f = ffn_down·(silu(ffn_gate·h) * ffn_up·h)                  (granite)
          = sum_j w_j down_j·(silu(gate_j·h) * up_j·h) + shared(h)  (granitemoe: softmax routing,
                                    the chosen weights renormalised; the shared expert unweighted)
        x = x + residual_scale * f
    logits = token_embd·(rms_norm(x) * output_norm) / logit_scale

Leaving out any multiplier moves the reference by far more than the tolerance
(test_the_reference_is_sensitive).
"""

import dataclasses

import numpy as np
import pytest
from hybrid_reference import glu_ffn, load, moe_ffn, prompt_then_decode, rms_norm
from models import TINY, tiny_model
from test_hybrid_reference import check_logits, normalised_error
from test_mixtral import rope_normal
from test_olmoe import assert_missing_tensor_named, attention, rewrite

from vkrt.engine.engine import Engine
from vkrt.errors import GGUFError
from vkrt.memory import F32
from vkrt.model.arch import DENSE, MOE, MOE_SHARED, RopeKind
from vkrt.model.loader import Model
from vkrt.model.synthetic import write_model

TOKENS = [3, 17, 42, 5, 99, 120, 7, 64, 11, 200, 31, 8, 77, 150, 2, 45]
PREFILL = 12
TIGHT = 1e-4     # normalised error per position, F32 KV cache
F16_KV = 1e-2    # the default F16 KV cache
SCALES = ("embedding", "residual", "attention", "logit")


def forward(path: str, tokens: list[int], drop: str = "") -> np.ndarray:
    """float64 logits [len(tokens), vocab]; drop: one of SCALES left out (sensitivity checks)."""
    cfg, w = load(path, hybrid=False)
    # moe_ffn: the routed experts alone (the shared expert is added here, ungated), renormalised
    routed = dataclasses.replace(cfg, expert_weights_norm=True,
                                 layers=tuple(dataclasses.replace(la, ffn=MOE) for la in cfg.layers))
    H, KV, D, eps = cfg.n_head, cfg.n_head_kv, cfg.head_dim_k, cfg.norm_eps
    meta = _meta(path)
    scales = {s: float(meta.get(f"{cfg.arch}.{'attention.scale' if s == 'attention' else s + '_scale'}", 0.0))
              for s in SCALES}
    if drop:
        scales[drop] = 0.0
    res = scales["residual"] or 1.0
    kq = scales["attention"] or 1 / np.sqrt(D)
    x = w["token_embd.weight"][np.asarray(tokens)] * (scales["embedding"] or 1.0)
    T = x.shape[0]
    for il, layer in enumerate(cfg.layers):
        p = f"blk.{il}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = rope_normal((h @ w[p + "attn_q.weight"].T).reshape(T, H, D), cfg.rope_base)
        k = rope_normal((h @ w[p + "attn_k.weight"].T).reshape(T, KV, D), cfg.rope_base)
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV, D)
        o = attention(cfg, w, il, q, k, v, kq) + w.get(p + "attn_output.bias", 0.0)
        x = x + res * o
        h2 = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        if layer.ffn == DENSE:
            f = glu_ffn(h2, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"])
        else:
            f = moe_ffn(routed, w, il, h2)
            if layer.ffn == MOE_SHARED:
                f = f + glu_ffn(h2, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"],
                                w[p + "ffn_down_shexp.weight"])
        x = x + res * f
    logits = rms_norm(x, w["output_norm.weight"], eps) @ w.get("output.weight", w["token_embd.weight"]).T
    return logits / (scales["logit"] or 1.0)


def _meta(path: str) -> dict:
    import gguf
    return {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module", params=["tiny-granite", "tiny-granitemoe"])
def granite(request, tmp_path_factory):
    path = tiny_model(request.param, tmp_path_factory.mktemp("granite"))
    return request.param, path, forward(path, TOKENS)


def test_config(device, granite):
    name, path, _ = granite
    spec = TINY[name]
    with Model(device, path, progress=False) as m:
        cfg = m.cfg
        assert cfg.spec.rope.kind is RopeKind.NORMAL and "output.weight" not in m.weights
        assert (cfg.embd_scale, cfg.residual_scale, cfg.logit_scale) == pytest.approx(
            (spec.embedding_scale, spec.residual_scale, spec.logit_scale))
        assert cfg.attn_scale == pytest.approx(spec.attention_scale)
        if name == "tiny-granitemoe":
            assert all(layer.ffn == MOE_SHARED for layer in cfg.layers) and not cfg.spec.moe.shared_gate
            assert cfg.expert_weights_norm and cfg.n_ff_expert == 32 and cfg.n_ff_shared == 64


@pytest.mark.parametrize("n_cpu_moe,flash,kv_type,tol", [(0, True, F32, TIGHT), (0, False, F32, TIGHT),
                                                         (2, True, F32, TIGHT), (0, True, None, F16_KV)])
def test_logits_match_the_numpy_forward(device, granite, n_cpu_moe, flash, kv_type, tol):
    """A 12-token prefill (all logits), then 4 decode steps; n_cpu_moe (granitemoe): every
    layer's experts in host memory. kv_type None: the engine's default F16 KV cache."""
    name, path, ref = granite
    if n_cpu_moe and name == "tiny-granite":
        pytest.skip("dense: no experts to place")
    kw = {"kv_type": kv_type} if kv_type else {}
    with Model(device, path, progress=False, n_cpu_moe=n_cpu_moe) as m, \
            Engine(m, n_ctx=64, n_ubatch=32, flash_attn=flash, **kw) as e:
        got = prompt_then_decode(e, TOKENS, PREFILL)
    check_logits(got, ref, tol, f"{name}, n_cpu_moe={n_cpu_moe}, flash={flash}, kv {kv_type}")


@pytest.mark.parametrize("drop", SCALES)
def test_the_reference_is_sensitive(granite, drop):
    _, path, ref = granite
    worst = normalised_error(forward(path, TOKENS, drop=drop), ref).max()
    assert worst > 10 * F16_KV, f"dropping {drop}_scale changes the logits by {worst:.2e} only"


def test_granitemoe_without_a_shared_expert(device, tmp_path):
    """GraniteMoe files without expert_shared_feed_forward_length: routed experts only."""
    spec = dataclasses.replace(TINY["tiny-granitemoe"], n_ff_shared=0, seed=33)
    path = write_model(tmp_path / "granitemoe-plain.gguf", spec)
    ref = forward(path, TOKENS[:PREFILL])
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=64, n_ubatch=32, kv_type=F32) as e:
        assert all(layer.ffn == MOE for layer in m.cfg.layers)
        check_logits(e.eval(TOKENS[:PREFILL], all_logits=True), ref, TIGHT, "granitemoe without a shared expert")


def test_the_output_bias_is_optional(device, tmp_path):
    """Granite 3.x files have no attention output bias (llama.cpp: optional): the model loads."""
    src = tiny_model("tiny-granite", tmp_path)
    path = src
    for il in range(TINY["tiny-granite"].n_layer):
        path = rewrite(path, tmp_path / f"nobias{il}.gguf", "granite", drop_tensor=f"blk.{il}.attn_output.bias")
    ref = forward(path, TOKENS[:PREFILL])
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=64, n_ubatch=32, kv_type=F32) as e:
        check_logits(e.eval(TOKENS[:PREFILL], all_logits=True), ref, TIGHT, "granite without attn_output.bias")


@pytest.mark.parametrize("name,missing", [("tiny-granite", "blk.1.ffn_down.weight"),
                                          ("tiny-granitemoe", "blk.0.ffn_up_shexp.weight")])
def test_missing_tensors_are_named(device, tmp_path, name, missing):
    assert_missing_tensor_named(device, tiny_model(name, tmp_path), tmp_path, name.removeprefix("tiny-"), missing)


def test_bad_metadata_is_named(tmp_path):
    """No logit_scale (llama.cpp requires it), RoPE turned off, FFN biases: clear errors."""
    from vkrt.model.config import ConfigMissing, ModelConfig
    from vkrt.model.gguf_file import GGUFFile
    from vkrt.model.tensors import check_tensors
    path = tiny_model("tiny-granite", tmp_path)
    meta = _meta(path)
    with pytest.raises(ConfigMissing, match="granite.rope.scaling.finetuned=false"):
        ModelConfig.from_metadata({**meta, "granite.rope.scaling.finetuned": False}, "m.gguf")
    cfg = ModelConfig.from_metadata(meta, "m.gguf")
    with GGUFFile(path, progress=False) as f:
        tensors = dict(f.tensors)
    tensors["blk.0.ffn_up.bias"] = tensors["blk.0.ffn_norm.weight"]
    with pytest.raises(GGUFError, match=r"dense FFN biases \(blk\.0\.ffn_up\.bias, \.\.\.\) are not supported"):
        check_tensors(cfg, tensors, "m.gguf")
    del meta["granite.logit_scale"]
    with pytest.raises(ConfigMissing, match="granite.logit_scale is missing"):
        ModelConfig.from_metadata(meta, "m.gguf")


def test_names_are_the_converters(granite):
    """Every tensor is one gguf-py lists for MODEL_ARCH.GRANITE / GRANITE_MOE (output tied, as
    Granite 3.x); the multipliers are under the keys llama.cpp reads."""
    import gguf
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
    name, path, _ = granite
    arch = {"tiny-granite": MODEL_ARCH.GRANITE, "tiny-granitemoe": MODEL_ARCH.GRANITE_MOE}[name]
    reader = gguf.GGUFReader(path)
    names = {TENSOR_NAMES[t].format(bid=il) for t in MODEL_TENSORS[arch] for il in range(2)}
    assert all(t.name.rsplit(".", 1)[0] in names for t in reader.tensors)
    prefix = name.removeprefix("tiny-")
    for key in ("embedding_scale", "residual_scale", "attention.scale", "logit_scale", "feed_forward_length"):
        assert f"{prefix}.{key}" in reader.fields, key
