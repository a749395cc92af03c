"""MTP drafting (vkrt/model/mtp.py, engine/mtp_head.py, mtp_drafter.py): the head's logits
against the float64 numpy reference, the trunk's states kept without changing a logit, greedy
generation with MTP drafts equal to generation without (qwen35, qwen35moe, glm4moe), the
drafter's catch-up after rejected drafts, and the refusals. GLM's NextN block (glm4moe) is its
attention with biases and partial RoPE, then its routed and shared experts; tiny-glm4moe's
carries its own nextn.embed_tokens and nextn.shared_head_head, tiny-glm4moe-air's reads the
trunk's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hybrid_reference import fresh_logits, load, mtp_forward, rms_norm
from models import TINY
from test_glm4moe import blocks as glm_blocks
from vkrt.engine.drafting import open_drafting
from vkrt.engine.engine import Engine
from vkrt.engine.generate import generate
from vkrt.engine.mtp_head import MtpHead
from vkrt.engine.sampler import GREEDY, SamplingParams
from vkrt.engine.speculative import SpecOptions
from vkrt.errors import ConfigError, GGUFError
from vkrt.model.arch import MOE_SHARED
from vkrt.model.loader import Model
from vkrt.model.mtp import EH_PROJ, EMBED_TOKENS, ENORM, HEAD, HEAD_NORM, HNORM, mtp_config
from vkrt.model.synthetic import write_model

QWEN = ["tiny-qwen35moe", "tiny-qwen35"]
GLM = {"tiny-glm4moe": dict(nextn_own_head=True), "tiny-glm4moe-air": {}}
NAMES = QWEN + list(GLM)
TOKENS = [5, 17, 99, 3, 250, 42, 42, 7, 130, 64, 11, 200]
PROMPT = list(range(5, 40)) * 3 + list(range(5, 12))


@pytest.fixture(scope="module")
def mtp_paths(tmp_path_factory):
    """The tiny qwen35 and glm4moe models with one MTP block each (the generator's n_nextn)."""
    d = tmp_path_factory.mktemp("mtp")
    return {n: write_model(d / f"{n}-mtp.gguf", dataclasses.replace(TINY[n], n_nextn=1, **GLM.get(n, {})))
            for n in NAMES}


def glm_mtp_forward(path: str, tokens: list[int], *, own: bool = True, swap: bool = False) -> np.ndarray:
    """float64 logits [len(tokens) - 1, vocab] of a glm4moe file's NextN block as mtp_forward's
    (vkrt/model/mtp.py), on test_glm4moe's GLM blocks; the block's own embedding and head where
    it has them. The keywords break one feature each: `own` False reads the trunk's embedding and
    output matrix instead, `swap` concatenates [h; e]."""
    cfg, w = load(path, hybrid=False)
    eps, L, ids = cfg.norm_eps, cfg.n_layer, np.asarray(tokens)
    h = rms_norm(glm_blocks(cfg, w, w["token_embd.weight"][ids]), w["output_norm.weight"], eps)[:-1]
    head = {k.replace(f"blk.{L}.", "blk.0.", 1): v for k, v in w.items() if k.startswith(f"blk.{L}.")}
    mine = head if own else {}
    e = rms_norm(mine.get("blk.0." + EMBED_TOKENS, w["token_embd.weight"])[ids[1:]], head["blk.0." + ENORM], eps)
    h = rms_norm(h, head["blk.0." + HNORM], eps)
    z = np.concatenate([h, e] if swap else [e, h], axis=1) @ head["blk.0." + EH_PROJ].T
    z = glm_blocks(mtp_config(cfg), head, z)
    output = mine.get("blk.0." + HEAD, w["output.weight"])
    return rms_norm(z, head.get("blk.0." + HEAD_NORM, w["output_norm.weight"]), eps) @ output.T


def reference(path: str, tokens: list[int]) -> np.ndarray:
    return glm_mtp_forward(path, tokens) if "glm4moe" in path else mtp_forward(path, tokens)


def _trunk_states(model, tokens, keep: bool):
    """The logits of every token of a fresh sequence, and the states the engine handed over."""
    got = []
    with Engine(model, n_ctx=64, n_ubatch=32) as e:
        if keep:
            e.keep_hidden(lambda seqs, pos, ids, rows: got.append((pos.copy(), rows.copy())))
        logits = e.eval(tokens, all_logits=True)
    return logits, got


@pytest.mark.parametrize("name", NAMES)
def test_mtp_head_matches_the_reference(device, mtp_paths, name):
    path = mtp_paths[name]
    with Model(device, path, progress=False) as m:
        plain, _ = _trunk_states(m, TOKENS, keep=False)
        logits, got = _trunk_states(m, TOKENS, keep=True)
        # keeping the states is lossless: every logit bit for bit as without
        np.testing.assert_array_equal(logits, plain)
        pos = np.concatenate([p for p, _ in got])
        states = np.concatenate([r for _, r in got])[np.argsort(pos, kind="stable")]
        assert sorted(pos.tolist()) == list(range(len(TOKENS)))
        with MtpHead(m, 16) as head, Engine(head, n_ctx=64, n_ubatch=16, pad_prompts=False) as e:
            head.write_hidden(states[:-1])
            out = e.eval(TOKENS[1:], all_logits=True)
    ref = reference(path, TOKENS)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=0, atol=0.03 * float(np.abs(ref).max()))
    assert (out.argmax(1) == ref.argmax(1)).mean() >= 0.9


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.9, top_k=20, seed=7)],
                         ids=["greedy", "sampled"])
def test_generation_with_mtp_drafts_equals_generation_without(device, mtp_paths, name, params):
    with Model(device, mtp_paths[name], progress=False) as m:
        with Engine(m, n_ctx=256, n_ubatch=64) as e:
            base = generate(e, PROMPT, 20, params)
        with Engine(m, n_ctx=256, n_ubatch=64) as e, \
                open_drafting(SpecOptions("mtp", draft_max=4, p_min=0.0), m, e, device) as d:
            spec = d.speculation(0)
            gen = generate(e, PROMPT, 20, params, speculation=spec)
            assert gen.tokens == base.tokens
            assert gen.timings.draft_n > 0
            # the head holds one entry a trunk position up to the last draft (the chained drafts' taken back)
            assert len(PROMPT) <= d.engine.sequence_length(0) <= e.sequence_length(0)


def test_first_draft_is_the_heads_argmax_after_a_rejection(device, mtp_paths):
    """A draft after a history that rewrote its tail: the head keeps the shared entries, makes the
    new ones from the trunk's states, and its first draft is the reference head's argmax."""
    path = mtp_paths["tiny-qwen35moe"]
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=64, n_ubatch=32) as e, \
            open_drafting(SpecOptions("mtp", draft_max=3, p_min=0.0), m, e, device) as d:
        drafter = d.drafter(0)
        e.eval(TOKENS[:-2])
        first = drafter.draft(TOKENS[:-1], 3)
        assert len(first) == 3 and d.engine.sequence_length(0) == len(TOKENS) - 2
        other = TOKENS[:6] + [8, 9]   # the trunk reads the sequence again with two other tokens at the end
        e.reset(0)
        e.eval(other)
        again = drafter.draft(other + [10], 1)
        assert d.engine.sequence_length(0) == len(other)
    ref = mtp_forward(path, other + [10])
    assert again == [int(ref[-1].argmax())]
    assert first[0] == int(mtp_forward(path, TOKENS[:-1])[-1].argmax())


@pytest.mark.parametrize("name", ["tiny-qwen35moe", "tiny-glm4moe"])
def test_mtp_is_refused_without_an_mtp_block(device, tmp_path, name):
    path = write_model(tmp_path / "plain.gguf", TINY[name])
    with Model(device, path, progress=False) as m, Engine(m, n_ctx=64, n_ubatch=32) as e:
        with pytest.raises(ConfigError, match="no MTP block"):
            open_drafting(SpecOptions("mtp"), m, e, device)
        with pytest.raises(ConfigError, match="does not use"):
            open_drafting(SpecOptions("mtp"), m, e, device, draft_path=path)


@pytest.mark.parametrize("name,missing", [("tiny-qwen35", "blk.4.nextn.eh_proj.weight"),
                                          ("tiny-glm4moe", "blk.3.exp_probs_b.bias"),
                                          ("tiny-glm4moe-air", "blk.3.ffn_up_shexp.weight")])
def test_mtp_names_missing_tensors(device, mtp_paths, monkeypatch, name, missing):
    with Model(device, mtp_paths[name], progress=False) as m:
        monkeypatch.delitem(m.gguf.tensors, missing)
        with pytest.raises(GGUFError, match=missing.replace(".", r"\.")):
            MtpHead(m, 16)


@pytest.mark.parametrize("name", list(GLM))
def test_glm_trunk_ignores_the_nextn_block(device, mtp_paths, tmp_path, name):
    """block_count counts GLM's NextN block: the trunk is the blocks before it, every logit bit
    for bit the file's without one (the generator writes the same trunk for a seed)."""
    with Model(device, mtp_paths[name], progress=False) as m:
        assert (m.cfg.n_layer, m.cfg.n_layer_nextn, m.gguf.metadata["glm4moe.block_count"]) == (3, 1, 4)
        assert not [n for n in m.weights if n.startswith("blk.3.")]
        assert mtp_config(m.cfg).layers[0].ffn == MOE_SHARED   # past the leading dense block
    plain = write_model(tmp_path / "plain.gguf", TINY[name])
    np.testing.assert_array_equal(fresh_logits(device, mtp_paths[name], TOKENS, 8),
                                  fresh_logits(device, plain, TOKENS, 8))


@pytest.mark.parametrize("change", [dict(own=False), dict(swap=True)], ids=["trunk-head", "swapped"])
def test_the_glm_reference_is_sensitive(mtp_paths, change):
    """The head's own embedding and output matrix, and the [e; h] order, each move the reference's
    logits past test_mtp_head_matches_the_reference's tolerance."""
    path = mtp_paths["tiny-glm4moe"]
    ref = glm_mtp_forward(path, TOKENS)
    assert np.abs(glm_mtp_forward(path, TOKENS, **change) - ref).max() > 0.1 * np.abs(ref).max()


def test_drafts_together_equal_drafts_alone(device, mtp_paths):
    """Two sequences' MTP drafts in shared head steps (the server's way) equal each drafted alone."""
    path = mtp_paths["tiny-qwen35moe"]
    histories = [TOKENS[:9], TOKENS[2:] + [77]]
    opts = SpecOptions("mtp", draft_max=3, p_min=0.0)

    def drafts(together: bool):
        with Model(device, path, progress=False) as m, Engine(m, n_ctx=128, n_ubatch=32, n_seq_max=2) as e, \
                open_drafting(opts, m, e, device) as d:
            drafters = [d.drafter(0), d.drafter(1)]
            for s, h in enumerate(histories):
                e.eval(h[:-1], s)
            requests = [(dr, h, 3) for dr, h in zip(drafters, histories)]
            out = d.draft_all(requests) if together else [dr.draft(h, n) for dr, h, n in requests]
            assert [d.engine.sequence_length(s) for s in (0, 1)] == [len(h) - 1 for h in histories]
            return out
    alone, together = drafts(False), drafts(True)
    assert together == alone and all(len(x) == 3 for x in alone)
    for h, x in zip(histories, alone):
        assert x[0] == int(mtp_forward(path, h)[-1].argmax())

