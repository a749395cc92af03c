"""Layer split (-sm layer) over several logical devices on one GPU (a repeated --device index):
logits and greedy tokens bit-identical to one device for a dense model, a MoE with host experts
and a qwen35 hybrid; the server's steps; the plan from -ts / -mg; clear errors; no leaks."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from models import TINY
from vkrt.device.group import DeviceGroup, parse_device_list
from vkrt.engine.options import EngineOptions, open_engine
from vkrt.engine.placement import DoesNotFit
from vkrt.errors import ConfigError, DeviceNotFound
from vkrt.model.layer_split import LayerSplit, split_layers, split_order
from vkrt.model.synthetic import write_model
from vkrt.owned import live_objects

PROMPT = list(range(3, 40, 2))   # 19 tokens: 19 x 2 routed >= 2 x 8 experts, so prefetch applies


def deep(name: str, n_layer: int, folder) -> str:
    """TINY[name] with n_layer layers (enough to give each of three devices some)."""
    path = os.path.join(os.fspath(folder), f"{name}-{n_layer}.gguf")
    if not os.path.exists(path):
        write_model(path, dataclasses.replace(TINY[name], n_layer=n_layer))
    return path


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    return {"dense": deep("tiny-llama", 6, d), "moe": deep("tiny-qwen3moe", 6, d),
            "hybrid": deep("tiny-qwen35moe", 8, d), "tied": deep("tiny-qwen2", 4, d)}


@pytest.fixture(scope="module")
def group():
    with DeviceGroup(["0", "0", "0"]) as g:
        yield g


def run(group, path, n_devices, tensor_split=None, n_cpu_moe=0, main_gpu=None, traffic=None, **more):
    """(every prompt token's logits, 5 greedy tokens on the GPU) on the first n_devices;
    traffic(engine) is called before it closes."""
    opts = EngineOptions(n_ctx=128, n_ubatch=32, n_cpu_moe=n_cpu_moe, tensor_split=tensor_split, main_gpu=main_gpu,
                         progress=False, **more)
    m, e = open_engine(group.devices[:n_devices], path, opts)
    try:
        assert e.split == (n_devices > 1)
        logits = e.eval(PROMPT, all_logits=True)
        tokens = list(e.greedy(int(np.argmax(logits[-1])), n=5))
        if traffic is not None:
            traffic(e)
        return logits, tokens
    finally:
        e.close()
        m.close()


@pytest.mark.parametrize("kind, n_cpu_moe", [("dense", 0), ("moe", 3), ("hybrid", 3), ("tied", 0)])
def test_split_equals_one_device(group, paths, kind, n_cpu_moe):
    ref_logits, ref_tokens = run(group, paths[kind], 1, n_cpu_moe=n_cpu_moe)
    for ts, mg in (((1, 1), None), ((3, 1), 0), ((1, 1, 1), None), ((1, 0), None)):
        logits, tokens = run(group, paths[kind], len(ts), ts, n_cpu_moe, mg)
        np.testing.assert_array_equal(logits.view(np.uint32), ref_logits.view(np.uint32), err_msg=str(ts))
        assert tokens == ref_tokens, ts


@pytest.mark.parametrize("kind", ["moe", "hybrid"])
def test_split_with_cpu_experts_equals_one_device(group, paths, kind):
    """--cpu-experts all on a layer split: each stage's host plans its own layers' experts and
    its CPU computes them; the logits and tokens are one device's, bit for bit."""
    def traffic(e):
        hosts = [st.host_experts for st in e.stages if st.staging.layers]
        assert hosts and all(h is not None and h.traffic.pairs_cpu for h in hosts)
        assert len(hosts) == (2 if kind == "moe" else 1)   # layer 3 of the moe model is on the second stage
        total = e.expert_traffic()
        assert total.tokens == hosts[0].traffic.tokens and total.pairs_cpu == sum(h.traffic.pairs_cpu for h in hosts)

    ref_logits, ref_tokens = run(group, paths[kind], 1, n_cpu_moe=4, cpu_experts="all", expert_cache=0)
    logits, tokens = run(group, paths[kind], 2, (1, 1), 4, cpu_experts="all", expert_cache=0, traffic=traffic)
    np.testing.assert_array_equal(logits.view(np.uint32), ref_logits.view(np.uint32))
    assert tokens == ref_tokens


@pytest.mark.parametrize("kind, n_cpu_moe", [("dense", 0), ("hybrid", 4)])
def test_pipelined_prefill_equals_one_device(group, paths, kind, n_cpu_moe):
    """A prompt of several micro-batches runs through the stages as a pipeline (stage k on
    micro-batch i while stage k-1 reads micro-batch i+1): the logits are those of one device."""
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 200, 100)]   # 4 micro-batches of 32
    out = []
    for n in (1, 2, 3):
        opts = EngineOptions(n_ctx=256, n_ubatch=32, n_cpu_moe=n_cpu_moe, progress=False)
        m, e = open_engine(group.devices[:n], paths[kind], opts)
        try:
            out.append((e.eval(prompt, all_logits=True), e.eval([5, 6])))
            assert any(key.parity == 1 for key in e.steps.graphs) == (n > 1)   # micro-batches alternated
            assert e.stats.tokens == len(prompt) + 2
        finally:
            e.close()
            m.close()
    for logits, last in out[1:]:
        np.testing.assert_array_equal(logits.view(np.uint32), out[0][0].view(np.uint32))
        np.testing.assert_array_equal(last, out[0][1])


def test_host_experts_imported_once_by_their_device(group, paths):
    """Each device imports only its own layers' host experts: every host tensor is read in
    place (no host-visible copies), and the stages that hold host expert layers prefetch them."""
    opts = EngineOptions(n_ctx=128, n_ubatch=32, n_cpu_moe=6, progress=False)
    m, e = open_engine(group.devices[:2], paths["moe"], opts)
    try:
        assert m.placement.host_copied == 0 and m.placement.host_imported == m.placement.host_bytes > 0
        for st in e.stages:
            assert st.prefetch.layers == list(st.layers)
            for il in st.layers:
                w = m.weights[f"blk.{il}.ffn_up_exps.weight"]
                assert w.range().buffer.device is st.device
        e.eval(PROMPT)
        assert e.stats.layers_prefetched == 6
    finally:
        e.close()
        m.close()


def test_host_copied_handoff(group, paths, monkeypatch):
    """Without host import the activations cross through a readback buffer and a host copy."""
    ref = run(group, paths["dense"], 1)
    monkeypatch.setenv("VKRT_REGISTER_HOST", "0")
    out = run(group, paths["dense"], 2, (1, 1))
    np.testing.assert_array_equal(out[0], ref[0])
    assert out[1] == ref[1]


def server_steps(e):
    """A server's steps: two prompts, then a mixed step and candidates of both sequences."""
    out = [e.mixed([(0, PROMPT[:7])], top=True), e.mixed([(0, [5]), (1, PROMPT[:9])], top=True)]
    out.append(e.decode_candidates([(0, 6), (1, 7)]))
    out.append(e.decode([(0, 8), (1, 9)]))
    return out


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_server_steps_on_a_split_engine(group, paths, kind):
    results = []
    for n in (1, 2):
        opts = EngineOptions(n_ctx=256, n_ubatch=32, n_seq_max=2, n_checkpoints=2, progress=False)
        m, e = open_engine(group.devices[:n], paths[kind], opts)
        try:
            if e.recurrent:   # one token a part: prompts are read by eval, then steps of single tokens
                e.eval(PROMPT[:7], seq_id=0)
                ckpt = e.save_state(0)
                e.eval(PROMPT[:9], seq_id=1)
                steps = [e.decode_candidates([(0, 6), (1, 7)]), e.decode([(0, 8), (1, 9)])]
                e.restore_state(0, ckpt)   # resume sequence 0 after its prompt: the same step again
                steps.append(e.decode_candidates([(0, 6)]))
            else:
                steps = server_steps(e)
            results.append(steps)
        finally:
            e.close()
            m.close()
    flat = [np.concatenate([np.ravel(a) for a in (s if isinstance(s, tuple) else (s,))]) for s in results[0]]
    for ref, got in zip(flat, [np.concatenate([np.ravel(a) for a in (s if isinstance(s, tuple) else (s,))])
                               for s in results[1]]):
        np.testing.assert_array_equal(ref, got)
    if kind == "hybrid":   # the restored state gives what the live one gave
        np.testing.assert_array_equal(results[1][2][0][0], results[1][0][0][0])


def test_plan_from_tensor_split():
    assert split_layers(6, [1, 1]) == [range(0, 3), range(3, 6)]
    assert split_layers(6, [3, 1]) == [range(0, 5), range(5, 6)]
    assert split_layers(8, [1, 1, 2]) == [range(0, 2), range(2, 4), range(4, 8)]
    empty = split_layers(4, [1, 0])   # the main device runs the output only
    assert empty == [range(0, 4), range(4, 4)] and empty[1].start == 4
    assert split_order(3, 0) == [1, 2, 0]
    devs = ["a", "b", "c"]
    plan = LayerSplit.plan(devs, 6, [1, 1, 4], 0)   # -mg 0: device a runs the output, so the last layers
    assert plan.devices == ["b", "c", "a"] and plan.ranges == [range(0, 1), range(1, 5), range(5, 6)]
    assert plan.stage_of("token_embd.weight") == 0 and plan.stage_of("output.weight") == 2
    assert plan.stage_of("blk.3.attn_q.weight") == 1
    plan = LayerSplit.plan(devs, 6, [0, 1, 1], 2)   # a device given no layers is left out
    assert plan.devices == ["b", "c"]


def test_errors(group, paths):
    with pytest.raises(ConfigError, match="-ts gives 3 proportion"):
        open_engine(group.devices[:2], paths["dense"], EngineOptions(tensor_split=(1, 1, 1)))
    with pytest.raises(ConfigError, match="'row'.*not supported"):
        EngineOptions(split_mode="row")
    with pytest.raises(ConfigError, match="proportions must be >= 0"):
        open_engine(group.devices[:2], paths["dense"], EngineOptions(tensor_split=(0, 0)))
    with pytest.raises(ConfigError, match="-mg 2: the device list has 2"):
        open_engine(group.devices[:2], paths["dense"], EngineOptions(main_gpu=2))
    with pytest.raises(ConfigError, match="--vram-budget gives 3 sizes for 2"):
        open_engine(group.devices[:2], paths["dense"], EngineOptions(vram_budget=(1 << 30,) * 3))
    budget = (1 << 30, 1 << 20)
    try:
        with pytest.raises(DoesNotFit, match=r"Vulkan1 .* does not fit .* \(\d+ bytes\) more than its 1\.0 MiB "
                                             r"of --vram-budget"):
            open_engine(group.devices[:2], paths["dense"], EngineOptions(vram_budget=budget, tensor_split=(1, 1)))
    finally:
        for d in group.devices:
            d.vram_budget = None
    with pytest.raises(DeviceNotFound, match="--device=7"):
        DeviceGroup(["0", "7"])
    with pytest.raises(ConfigError, match="--device"):
        parse_device_list("0,,1")


def test_close_leaves_no_objects(paths):
    before = live_objects()
    with DeviceGroup(["0", "0"]) as g:
        m, e = open_engine(g, paths["moe"], EngineOptions(n_ctx=128, n_ubatch=32, n_cpu_moe=2, progress=False))
        e.eval(PROMPT)
        list(e.greedy(5, n=2))
        e.close()
        m.close()
    assert live_objects() == before


def test_cli_split(paths):
    from vkrt.cli.main import cli as main

    runner = CliRunner()
    args = ["run", "-m", paths["moe"], "-p", "Hello", "-n", "6", "--temp", "0", "--json", "-c", "128", "-ub", "32",
            "-ncmoe", "2"]
    one = runner.invoke(main, args)
    two = runner.invoke(main, args + ["--device", "0,0", "-ts", "1,2"])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    assert json.loads(one.output.splitlines()[-1])["tokens"] == json.loads(two.output.splitlines()[-1])["tokens"]
    plan = runner.invoke(main, ["devices", "-m", paths["moe"], "--device", "0,0,0", "-ts", "1,1,4", "-mg", "0",
                                "--json"])
    assert plan.exit_code == 0, plan.output
    devices = json.loads(plan.output)["devices"]
    assert [d["layers"] for d in devices] == [[0, 0], [1, 4], [5, 5]]
    assert [d["name"][:7] for d in devices] == ["Vulkan1", "Vulkan2", "Vulkan0"] and devices[2]["output"]
    bad = runner.invoke(main, ["run", "-m", paths["moe"], "-p", "Hi", "-n", "1", "--device", "0,0", "-sm", "row"])
    assert bad.exit_code != 0 and "not supported" in bad.output


def serving_steps(e):
    """A server's steps over four sequences (prompts first): mixed steps with candidates (logit
    adjustments and a token mask on some rows) and without, decode_candidates, decode. A model
    with a recurrent state takes one token a part."""
    from vkrt.engine.logit_adjust import logit_adjustments
    from vkrt.engine.sampler import SamplingParams
    from vkrt.ops.token_mask import mask_words

    vocab = e.model.cfg.vocab_size
    bias = logit_adjustments(SamplingParams(logit_bias=((11, 5.0), (12, -3.0))), [])
    mask = np.zeros(mask_words(vocab), np.uint32)
    mask[0] = 0b1011_0110   # tokens 1, 2, 4, 5 and 7 allowed
    for s in range(4):
        e.eval(PROMPT[s:s + 5 + 2 * s], seq_id=s)
    out = [e.mixed([(s, [20 + s]) for s in range(4)], [None, bias, None, None], top=True,
                   masks=[None, None, mask, None]),
           e.mixed([(s, [30 + s] * (1 if e.recurrent else 1 + s % 2)) for s in range(4)]),
           e.decode_candidates([(s, 40 + s) for s in range(4)], [bias, None, None, bias]),
           e.decode([(s, 50 + s) for s in range(4)]),
           e.decode([(2, 60), (0, 61), (3, 62)])]
    return [np.concatenate([np.ravel(a) for a in (s if isinstance(s, tuple) else (s,))]) for s in out]


@pytest.mark.parametrize("kind, n_cpu_moe", [("dense", 0), ("moe", 3), ("hybrid", 3)])
def test_pipelined_server_steps_equal_one_device(group, paths, kind, n_cpu_moe):
    """pipeline_steps: a step of several sequences runs as groups of whole sequences pipelined
    over the stages (group g on device k while group g + 1 runs on device k - 1); every output
    (logits, candidates of adjusted and masked rows) is the unpipelined split's and one device's,
    bit for bit."""
    results = []
    for n, pipelined in ((1, False), (2, False), (2, True), (3, True)):
        opts = EngineOptions(n_ctx=256, n_ubatch=32, n_seq_max=4, n_cpu_moe=n_cpu_moe, pipeline_steps=pipelined,
                             progress=False)
        m, e = open_engine(group.devices[:n], paths[kind], opts)
        try:
            results.append(serving_steps(e))
            # the groups alternate copies of the inputs and handoffs: only pipelined steps take copy 1
            assert any(key.parity == 1 for key in e.steps.graphs) == pipelined, (n, pipelined)
            results[-1].append(np.array([e.sequence_length(s) for s in range(4)], np.float32))
        finally:
            e.close()
            m.close()
    for k, got in enumerate(results[1:], 1):
        for step, (a, b) in enumerate(zip(results[0], got)):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"run {k}, step {step}")


def test_balanced_groups_and_kernel_classes():
    from types import SimpleNamespace

    from vkrt.device.tuning import TABLE, Arch
    from vkrt.engine.wavefront import balanced_groups, same_kernels

    assert balanced_groups([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    assert balanced_groups([1, 1, 1], 3) == [range(0, 1), range(1, 2), range(2, 3)]
    assert balanced_groups([5, 1, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 6)]
    assert balanced_groups([1, 1, 9], 2) == [range(0, 2), range(2, 3)]
    t = SimpleNamespace(mv_max_n=8, mv_id_max_n=32, mv_dense_max_n=8, mv_chunk_n=16, fa_pack_max_q=16,
                        mm_split_groups=0, mm_bm=64, mm_bn=64, mm_split_max_tiles=4, mm_coopmat=False, mm_big_bn=0)
    assert same_kernels([t], True, 8, 4) and same_kernels([t], False, 16, 8)
    assert not same_kernels([t], True, 16, 8)   # mul_mat_id: the fused mat-vecs for 8 tokens, not for 16
    assert same_kernels([t], True, 24, 20)   # both the plain mat-vec
    assert not same_kernels([t], True, 40, 24) and same_kernels([t], False, 40, 24)   # the GEMM for 40
    assert not same_kernels([t], False, 32, 16) and same_kernels([t], False, 64, 32)
    assert not same_kernels([SimpleNamespace(mv_max_n=8, mv_id_max_n=32, mv_dense_max_n=8, mv_chunk_n=16,
                                             fa_pack_max_q=4, mm_split_groups=0, mm_bm=64, mm_bn=64,
                                             mm_split_max_tiles=4, mm_coopmat=False, mm_big_bn=0)], False, 8, 4)
    split = SimpleNamespace(**{**vars(t), "mm_split_groups": 72})   # split along K by token tiles up to 256 tokens
    assert same_kernels([split], False, 64, 32) and same_kernels([split], False, 128, 100)
    assert same_kernels([split], False, 600, 300)   # past mm_split_max_tiles: never split
    assert not same_kernels([split], False, 128, 64) and same_kernels([t], False, 128, 64)
    assert not same_kernels([split], False, 300, 256)
    # the GCN table's 128 x 128 tile past 64 tokens: 64 tokens take one 64 x 64 tile (split as
    # such), 65 and 100 one 128 x 128 tile, 200 two of them
    gcn = dataclasses.replace(TABLE[Arch.AMD_GCN], mm_split_groups=72)
    assert gcn.mm_big_bn == 128 and gcn.mm_bn == 64
    assert not same_kernels([gcn], False, 65, 64) and same_kernels([gcn], False, 128, 65)
    assert not same_kernels([gcn], False, 200, 128) and same_kernels([gcn], False, 256, 200)


def test_serve_refuses_pipeline_steps_without_a_split(paths):
    from vkrt.cli.main import cli as main

    out = CliRunner().invoke(main, ["serve", "-m", paths["dense"], "--pipeline-steps"])
    assert out.exit_code != 0 and "--pipeline-steps pipelines a step over the devices of a layer split" in out.output


@pytest.mark.parametrize("n_devices", [2, 3])
def test_pipelined_greedy_on_a_split(group, paths, n_devices):
    """Greedy decoding on a split, pipelined (the next step's inputs written while the last
    step ends, its last stage left running while a token is yielded) and not: the tokens of one
    device; stopped early, the cache holds the tokens evaluated for what was consumed."""
    ref = run(group, paths["moe"], 1, n_cpu_moe=2)
    first = int(np.argmax(ref[0][-1]))
    opts = EngineOptions(n_ctx=128, n_ubatch=32, n_cpu_moe=2, progress=False)
    m, e = open_engine(group.devices[:n_devices], paths["moe"], opts)
    try:
        for pipeline in (False, True):
            e.reset()
            e.eval(PROMPT)
            assert list(e.greedy(first, n=5, pipeline=pipeline)) == ref[1], pipeline
            assert e.sequence_length(0) == len(PROMPT) + 5
        e.reset()
        e.eval(PROMPT)
        gen = e.greedy(first, n=5, pipeline=True)
        assert [next(gen), next(gen)] == ref[1][:2]
        gen.close()   # the step submitted for a third token is waited for and forgotten
        assert e.sequence_length(0) == len(PROMPT) + 2
        assert list(e.greedy(ref[1][1], n=3, pipeline=True)) == ref[1][2:]
    finally:
        e.close()
        m.close()


def one_then_pipelined(group, path, n_seqs: int, n_ctx: int, n_ubatch: int):
    """(pipelined, engine) on one device, then split over two with pipelined steps, each engine
    holding n_seqs sequences of a 7-token prompt (host experts of 2 layers); closed after use."""
    for n, pipelined in ((1, False), (2, True)):
        opts = EngineOptions(n_ctx=n_ctx, n_ubatch=n_ubatch, n_seq_max=n_seqs, n_cpu_moe=2, pipeline_steps=pipelined,
                             progress=False)
        m, e = open_engine(group.devices[:n], path, opts)
        try:
            for s in range(n_seqs):
                e.eval(list(range(3 + s, 10 + s)), seq_id=s)
            yield pipelined, e
        finally:
            e.close()
            m.close()


def test_pipelined_large_steps_equal_one_device(group, paths):
    """Groups past the mat-vec sizes (the GEMM and mul_mat_id's routed path: a mixed step of 79
    tokens in groups of about 40): flash attention splits the KV cells as the whole step's would
    (on lavapipe a 40-row group alone would split them and a 79-row step not), so the rows are
    the whole step's bit for bit. Decode steps of 40 sequences run whole: a group's 20 tokens
    would take mul_mat_id's mat-vec (up to mv_id_max_n), the whole step the GEMM."""
    n_seqs, results = 40, []
    for pipelined, e in one_then_pipelined(group, paths["moe"], n_seqs, n_ctx=2048, n_ubatch=128):
        results.append([e.decode([(s, 20 + s) for s in range(n_seqs)]),
                        np.concatenate(e.decode_candidates([(s, 30 + s) for s in range(n_seqs)])),
                        e.mixed([(s, [40 + s] * (1 + s % 3)) for s in range(n_seqs)])])
        plans = {key.fa_plan for key in e.steps.graphs if key.fa_plan}
        assert plans == ({79} if pipelined else set())
        # 20 parts: 32 output rows take the GEMM, a group's 16 would take the mat-vec: not grouped
        before = set(e.steps.graphs)
        results[-1].append(e.mixed([(s, [50 + s, 51]) for s in range(20)]))
        assert not any(key.parity == 1 for key in set(e.steps.graphs) - before)
    for step, (a, b) in enumerate(zip(*results)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"step {step}")


def test_pipelined_steps_past_a_logits_slice(group, paths):
    """A pipelined decode of 72 sequences in groups of 36 against one device: the whole step's
    logits come in slices of 64 rows and 8, a group's in one of 36; every slice takes the
    whole's kernel (the GEMM here), so rows 64-71 get the same bits as in a group (they took the
    mat-vec as an 8-row slice before, and differed)."""
    n_seqs, results = 72, []
    for pipelined, e in one_then_pipelined(group, paths["moe"], n_seqs, n_ctx=4096, n_ubatch=256):
        results.append(e.decode([(s, 20 + s) for s in range(n_seqs)]))
        assert any(key.parity == 1 for key in e.steps.graphs) == pipelined   # grouped
    np.testing.assert_array_equal(results[0].view(np.uint32), results[1].view(np.uint32))


def test_a_tensor_of_another_device_is_not_bound(group):
    """Binding one logical device's tensor into another's dispatch is refused by name (a MoE layer
    before a split's boundary once bound the next device's norm weight: a segfault under
    validation, undefined behaviour without)."""
    from vkrt.errors import OutOfRange
    from vkrt.memory import Tensor
    from vkrt.ops.binding import bind_words
    a, b = group.devices[:2]
    t = Tensor.empty(b, "F32", (16,))
    try:
        with pytest.raises(OutOfRange, match="lives on .* not on the dispatch's device"):
            bind_words(t, "test operand", a)
        assert bind_words(t, "test operand", b)[1] == t.offset
    finally:
        t.close()


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_speculation_on_a_split_engine(group, paths, kind):
    """Verification steps, truncation and (hybrid) every stage's recurrent-state snapshot and
    rewind on a split over two devices: the tokens of plain decoding on the same split."""
    from test_speculative import OracleDrafter

    from vkrt.engine.generate import generate
    from vkrt.engine.sampler import GREEDY
    from vkrt.engine.speculative import SpecOptions, Speculation
    opts = EngineOptions(n_ctx=128, n_ubatch=32, progress=False)
    m, e = open_engine(group.devices[:2], paths[kind], opts)
    try:
        assert e.split
        base = generate(e, PROMPT, 12, GREEDY)
        e.reset()
        drafter = OracleDrafter(len(PROMPT), base.tokens, wrong=3)
        gen = generate(e, PROMPT, 12, GREEDY, speculation=Speculation(SpecOptions("ngram", draft_max=4), drafter))
        assert gen.tokens == base.tokens
        assert 0 < gen.timings.draft_n_accepted < gen.timings.draft_n
    finally:
        e.close()
        m.close()
