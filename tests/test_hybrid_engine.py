"""Engines of models with Gated DeltaNet layers (qwen35, qwen35moe): the recurrent-state cache
next to the KV cache -- several sequences decoding together, checkpoints, resets -- and the
lossless options (expert prefetch, expert cache, host experts, mask_opt) bit for bit."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from models import tiny_model
from vkrt.engine.engine import Engine
from vkrt.engine.recurrent_state import KEEP_MAX
from vkrt.errors import GGUFError, VkrtError
from vkrt.model.config import ConfigMissing, ModelConfig
from vkrt.model.gguf_file import GGUFFile
from vkrt.model.loader import Model
from vkrt.model.synthetic import write_model
from vkrt.model.tensors import check_tensors
from models import TINY

PROMPT_A = list(range(5, 60, 3))     # 19 tokens
PROMPT_B = list(range(100, 130, 2))  # 15 tokens


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid")
    return {n: tiny_model(n, d) for n in ("tiny-qwen35moe", "tiny-qwen35")}


def test_layers_and_state_sizes(device, paths):
    with Model(device, paths["tiny-qwen35moe"], progress=False) as m:
        cfg = m.cfg
        assert [layer.attn for layer in cfg.layers] == ["linear", "linear", "linear", "full"]
        assert cfg.kv_layers == [3] and cfg.linear_layers == [0, 1, 2]
        with Engine(m, n_ctx=64, n_ubatch=16, n_seq_max=3) as e:
            assert set(e.cache.k) == {3}   # only the attention layer keeps K and V
            assert e.recurrent and e.state.n_slots == 3
            states = 3 * 3 * 4 * ((4 - 1) * cfg.ssm_conv_dim + 4 * 16 * 16)   # 3 layers x 3 sequences
            kept = 3 * 16 * 4 * (2 * cfg.ssm_conv_dim + 4 * 16 + 2 * 4)   # a 16-token step's inputs and z, 3 layers
            assert e.state.nbytes == states + kept
            assert _estimated_state(m, paths["tiny-qwen35moe"], 16, 0) == e.state.nbytes
        # told its speculative steps' size (3 sequences x 6 tokens), the state keeps that many
        # columns, and the VRAM estimate counts them; never past the micro-batch or KEEP_MAX
        for ubatch, verify, columns in ((32, 18, 18), (16, 18, 16), (128, 100, KEEP_MAX), (32, 4, 16)):
            with Engine(m, n_ctx=64, n_ubatch=ubatch, n_seq_max=3, verify_tokens=verify) as e:
                assert e.state.keep_columns == columns
                assert e.state.nbytes == states + 3 * columns * 4 * (2 * cfg.ssm_conv_dim + 4 * 16 + 2 * 4)
                assert _estimated_state(m, paths["tiny-qwen35moe"], ubatch, verify) == e.state.nbytes


def _estimated_state(m, path, n_ubatch, verify_tokens):
    """The VRAM estimate's recurrent-state bytes for an engine of 3 sequences as configured."""
    from vkrt.engine.placement import estimate
    from vkrt.model.split_gguf import open_gguf
    with open_gguf(path, progress=False) as f:
        return estimate(m.cfg, dict(f.tensors), n_ctx=64, n_ubatch=n_ubatch, n_cpu_moe=0, n_seq_max=3,
                        verify_tokens=verify_tokens, device=m.device).recurrent


@pytest.mark.parametrize("name", ["tiny-qwen35moe", "tiny-qwen35"])
def test_sequences_decoding_together_match_each_alone(device, paths, name):
    """Continuous batching: two sequences at different positions in one decode step give what
    each gives alone (their states and KV cells do not mix)."""
    with Model(device, paths[name], progress=False) as m:
        alone = []
        for prompt in (PROMPT_A, PROMPT_B):
            with Engine(m, n_ctx=128, n_ubatch=32) as e:
                logits, steps = e.eval(prompt), []
                for _ in range(4):
                    logits = e.eval([int(np.argmax(logits))])
                    steps.append(logits)
                alone.append(np.stack(steps))
        with Engine(m, n_ctx=128, n_ubatch=32, n_seq_max=2) as e:
            last = [e.eval(PROMPT_A, seq_id=0), e.eval(PROMPT_B, seq_id=1)]
            together = [[], []]
            for _ in range(4):
                rows = e.decode([(s, int(np.argmax(last[s]))) for s in (0, 1)])
                for s in (0, 1):
                    together[s].append(rows[s])
                last = list(rows)
    for s in (0, 1):
        np.testing.assert_allclose(np.stack(together[s]), alone[s], rtol=0, atol=1e-4 * np.abs(alone[s]).max())
        assert (np.stack(together[s]).argmax(-1) == alone[s].argmax(-1)).all()


@pytest.mark.parametrize("name,n_cpu_moe", [("tiny-qwen35moe", 0), ("tiny-qwen35moe", 4), ("tiny-qwen35", 0)])
def test_prompts_read_together_match_each_alone(device, paths, name, n_cpu_moe):
    """Engine.mixed on a recurrent model: several sequences' prompt chunks of one length in one
    step (the DeltaNet layers read them as equal runs, a sequence each) give each sequence what
    reading its prompt alone gives (experts in VRAM or in host memory), the states carry on as
    one sequence's would, and parts of different lengths are refused."""
    prompts = [PROMPT_A[:12], PROMPT_B[:12], PROMPT_A[7:19]]
    with Model(device, paths[name], n_cpu_moe=n_cpu_moe, progress=False) as m:
        alone = []
        for p in prompts:
            with Engine(m, n_ctx=128, n_ubatch=64) as e:
                rows = [e.eval(p[:5]), e.eval(p[5:])]
                rows.append(e.eval([int(np.argmax(rows[-1]))]))
                alone.append(np.stack(rows))
        with Engine(m, n_ctx=256, n_ubatch=64, n_seq_max=3) as e:
            firsts = e.mixed([(k, p[:5]) for k, p in enumerate(prompts)])
            lasts = e.mixed([(k, p[5:]) for k, p in enumerate(prompts)])   # runs of 7
            assert [e.sequence_length(k) for k in range(3)] == [12] * 3 and e.state.length.tolist() == [12] * 3
            steps = e.decode([(k, int(np.argmax(r))) for k, r in enumerate(lasts)])
            with pytest.raises(VkrtError, match="parts of one size"):
                e.mixed([(0, [1, 2]), (1, [3])])
            assert e.state.length.tolist() == [13] * 3
    for k in range(3):
        together = np.stack([firsts[k], lasts[k], steps[k]])
        np.testing.assert_allclose(together, alone[k], rtol=0, atol=1e-4 * np.abs(alone[k]).max())
        assert (together.argmax(-1) == alone[k].argmax(-1)).all()


def test_checkpoint_restore_is_bit_identical_to_a_fresh_sequence(device, paths):
    with Model(device, paths["tiny-qwen35moe"], progress=False) as m:
        with Engine(m, n_ctx=128, n_ubatch=32) as e:
            fresh = [e.eval(PROMPT_A), e.eval(PROMPT_B)]
        with Engine(m, n_ctx=128, n_ubatch=32, n_checkpoints=2) as e:
            e.eval(PROMPT_A)
            ckpt = e.save_state(0)
            assert ckpt.length == len(PROMPT_A)
            e.eval([7, 8, 9])                      # wander off
            e.restore_state(0, ckpt)
            assert e.sequence_length(0) == len(PROMPT_A)
            resumed = e.eval(PROMPT_B)
            e.release_state(ckpt)
    np.testing.assert_array_equal(resumed, fresh[1])


def test_recurrent_state_cannot_be_rewound(device, paths):
    with Model(device, paths["tiny-qwen35"], progress=False) as m, Engine(m, n_ctx=64, n_ubatch=16) as e:
        first = e.eval(PROMPT_A)
        with pytest.raises(VkrtError, match="cannot keep 5 of the 19 tokens of a recurrent state"):
            e.reset(0, 5)
        e.reset(0, len(PROMPT_A))      # keeping all of it is fine
        with pytest.raises(VkrtError, match="sequence 1 has no recurrent state: this engine holds 1"):
            e.eval(PROMPT_A, seq_id=1)
        e.reset(0)
        np.testing.assert_array_equal(e.eval(PROMPT_A), first)   # a cleared state starts afresh


def greedy_logits(device, path, *, n_cpu_moe=0, slots=None, cache=None, prompt=PROMPT_A, n=6, **kw):
    with Model(device, path, n_cpu_moe=n_cpu_moe, progress=False) as m, \
            Engine(m, n_ctx=128, n_ubatch=32, prefetch_slots=slots, expert_cache=cache, **kw) as e:
        out = [e.eval(prompt, all_logits=True)]
        for _ in range(n):
            out.append(e.eval([int(np.argmax(out[-1][-1]))])[None])
        return np.concatenate(out), e.stats.layers_prefetched


def test_host_experts_prefetch_and_cache_are_bit_identical(device, paths):
    """--n-cpu-moe, the prefetch ring and the decode expert cache on the hybrid MoE: same bits."""
    path = paths["tiny-qwen35moe"]
    reference, _ = greedy_logits(device, path)
    for n_cpu_moe, slots, cache in itertools.product((2, 4), (0, 3), (0, None)):
        logits, prefetched = greedy_logits(device, path, n_cpu_moe=n_cpu_moe, slots=slots, cache=cache)
        np.testing.assert_array_equal(logits.view(np.uint32), reference.view(np.uint32), (n_cpu_moe, slots, cache))
        assert (prefetched > 0) == (slots > 0)


def test_mask_opt_is_bit_identical(device, paths, device_env):
    """A 600-token prompt in ubatches of 256 over 1024 cells: mask_opt classifies the full
    attention layer's mask blocks; the logits do not change."""
    prompt = list(range(3, 203)) * 3
    logits, dispatches = [], []
    for flag in ("0", "1"):
        device_env("VKRT_FA_MASK_OPT", flag)
        with Model(device, paths["tiny-qwen35moe"], progress=False) as m, Engine(m, n_ctx=1024, n_ubatch=256) as e:
            logits.append(e.eval(prompt, all_logits=True))
            graph = next(g for g in e.steps.graphs.values() if g.opts.n_tokens == 256)
            dispatches.append(sum(seq.dispatch_count for seq in graph.seqs))
    assert dispatches[1] == dispatches[0] + 1   # the pre-pass
    np.testing.assert_array_equal(logits[0].view(np.uint32), logits[1].view(np.uint32))


def test_chunked_and_recurrent_delta_rule_agree_in_the_model(device, paths):
    """A 150-token prompt in one ubatch (the chunked delta rule) and in ubatches of 16 (the
    recurrent one, the state carried between ubatches)."""
    prompt = list(range(3, 153))
    out = {}
    for ub in (256, 16):
        with Model(device, paths["tiny-qwen35"], progress=False) as m, Engine(m, n_ctx=256, n_ubatch=ub) as e:
            out[ub] = e.eval(prompt, all_logits=True)
    np.testing.assert_allclose(out[256], out[16], rtol=0, atol=2e-4 * np.abs(out[16]).max())
    assert (out[256].argmax(-1) == out[16].argmax(-1)).mean() > 0.98


def test_multi_token_prediction_layers_are_skipped(device, tmp_path, paths):
    """Qwen3.5/3.6 files may append nextn (MTP) blocks past the trunk: block_count counts them,
    nextn_predict_layers says how many; vkrt runs the trunk only."""
    import gguf
    spec = dataclasses.replace(TINY["tiny-qwen35moe"], n_layer=5,
                               extra={"qwen35moe.nextn_predict_layers": (1, gguf.GGUFValueType.UINT32)})
    path = write_model(tmp_path / "mtp.gguf", spec)
    with Model(device, path, progress=False) as m:
        assert m.cfg.n_layer == 4 and m.cfg.n_layer_nextn == 1 and len(m.cfg.layers) == 4
        with Engine(m, n_ctx=64, n_ubatch=32) as e:
            assert np.isfinite(e.eval(PROMPT_A)).all()


def test_inconsistent_files_are_refused_clearly(paths):
    with GGUFFile(paths["tiny-qwen35moe"], progress=False) as f:
        meta, tensors = dict(f.metadata), f.tensors
        cfg = ModelConfig.from_metadata(meta, "m.gguf")
        with pytest.raises(GGUFError, match=r"blk\.3\.attn_q\.weight has shape \[64, 256\], expected \[64, 128\]"):
            check_tensors(dataclasses.replace(cfg, head_dim_k=16, head_dim_v=16), tensors, "m.gguf")
        conv = tensors["blk.0.ssm_conv1d.weight"]
        f16 = {**tensors, conv.name: dataclasses.replace(conv, type=tensors["token_embd.weight"].type)}
        with pytest.raises(GGUFError, match=r"blk\.0\.ssm_conv1d\.weight is Q8_0, expected F32"):
            check_tensors(cfg, f16, "m.gguf")
        meta["qwen35moe.ssm.inner_size"] = 100
        with pytest.raises(ConfigMissing, match="ssm.inner_size 100 != ssm.time_step_rank 4 x ssm.state_size 16"):
            ModelConfig.from_metadata(meta, "m.gguf")
        del meta["qwen35moe.ssm.conv_kernel"]
        with pytest.raises(ConfigMissing, match="qwen35moe.ssm.conv_kernel is missing"):
            ModelConfig.from_metadata(meta, "m.gguf")


def test_warm_up_creates_every_gemm_kernel_a_prompt_step_takes(paths):
    """After the server's warm-up, prompt steps of any size create no GEMM pipeline (NVIDIA's
    compiler took 27-37 s over each GCN-tiled one), where they run unpadded: a recurrent
    state, experts in host memory (staged or prefetched by the step's size). A device of its own,
    so that no other test's pipelines stand in for the warm-up's."""
    from vkrt.device import Device
    from vkrt.pipeline.kernel import KernelCache
    from vkrt.server.backend import Backend

    def gemms(kernels):
        return {key for key in kernels._kernels if key[0] == "mul_mm"}

    with Device() as dev, Model(dev, paths["tiny-qwen35moe"], n_cpu_moe=4, progress=False) as m, \
            Engine(m, n_ctx=512, n_ubatch=128, n_seq_max=3) as e:
        assert e.host_experts and not e.pads_prompts
        Backend(dev, m, e).warm_up(n_parallel=3)
        kernels = dev.service("kernels", KernelCache)
        created = gemms(kernels)
        for n in (2, 5, 9, 13, 17, 33, 40, 63, 64, 65, 100, 127, 128):
            e.mixed([(1, list(range(3, 3 + n)))], top=True)
            e.reset()
            if 2 * n <= e.n_ubatch:
                e.mixed([(0, list(range(3, 3 + n))), (2, list(range(4, 4 + n)))], top=True)
                e.reset()
        assert gemms(kernels) == created
        with pytest.raises(VkrtError, match="a prompt step takes 1 to 128 tokens, got 129"):
            e.record_prompt_step(129)
