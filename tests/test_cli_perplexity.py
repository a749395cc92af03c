"""`vkrt perplexity` end to end on tiny models: llama-perplexity's output, the KL base file
written and read back, and clear refusals of bad input."""

import re
import struct

import numpy as np
import pytest
from click.testing import CliRunner

from models import tiny_model
from vkrt.cli.main import cli
from vkrt.engine.kl_file import decode_rows, row_words, scored_rows

TEXT = ("The quick brown fox jumps over the lazy dog. Once upon a time there was a small model that learned "
        "to count: one, two, three, four. Hello, world! The capital of France is Paris. ") * 12
N_CTX = 64


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_ppl")
    text = folder / "text.txt"
    text.write_text(TEXT)
    return {"llama": tiny_model("tiny-llama", folder), "qwen2": tiny_model("tiny-qwen2", folder),
            "text": str(text), "folder": folder}


def vkrt(*args):
    return CliRunner().invoke(cli, ["perplexity", *map(str, args)])


@pytest.fixture(scope="module")
def base(files, device):
    """tiny-llama's run that writes the KL base file: (result, path)."""
    path = files["folder"] / "base.kl"
    result = vkrt("-m", files["llama"], "-f", files["text"], "-c", N_CTX, "-b", 24, "--chunks", 4,
                  "--kl-divergence-base", path)
    assert result.exit_code == 0, result.output
    return result, path


def test_output_is_llama_perplexitys(base):
    result, _ = base
    assert re.fullmatch(r"(\[\d+\]\d+\.\d{4},){4}\n", result.stdout), result.stdout
    assert "perplexity: calculating perplexity over 4 chunks, n_ctx=64, batch_size=24, n_seq=1" in result.stderr
    assert re.search(r"perplexity: \d+\.\d\d seconds per pass - ETA \d+\.\d\d minutes", result.stderr)
    final = re.search(r"^Final estimate: PPL = (\d+\.\d{4}) \+/- \d+\.\d{5}$", result.stderr, re.M)
    assert final, result.stderr
    assert final.group(1) == re.findall(r"\[4\](\d+\.\d{4}),", result.stdout)[0]   # the running PPL of all chunks


def test_base_file_holds_the_tokens_and_log_probs(base, files, device):
    from vkrt.engine.engine import Engine
    from vkrt.engine.perplexity import chunk_logits
    from vkrt.model.loader import Model

    _, path = base
    raw = path.read_bytes()
    with Model(device, files["llama"]) as model:
        n_vocab = model.cfg.vocab_size
        tokens = model.tokenizer.encode(TEXT)
        assert raw[:8] == b"_logits_" and struct.unpack("<iii", raw[8:20]) == (N_CTX, n_vocab, 4)
        assert np.array_equal(np.frombuffer(raw[20:20 + 4 * 4 * N_CTX], "<i4"), tokens[:4 * N_CTX])
        rows = np.frombuffer(raw[20 + 16 * N_CTX:], "<u2").reshape(4, scored_rows(N_CTX), row_words(n_vocab))
        engine = Engine(model, n_ctx=N_CTX, n_batch=N_CTX)
        try:
            logits = chunk_logits(engine, np.array(tokens[N_CTX:2 * N_CTX]), N_CTX, None).astype(np.float64)
        finally:
            engine.close()
    lsm = logits - logits.max(1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(1, keepdims=True))
    stored = decode_rows(rows[1], n_vocab)
    near = lsm > -15
    assert np.abs(stored - lsm)[near].max() < 16 / 65535 + 1e-3


def _stat(output: str, name: str) -> float:
    return float(re.search(rf"^{re.escape(name)}\s*:\s*(-?[\d.]+)", output, re.M).group(1))


def test_kl_divergence_against_itself_and_another_model(base, files):
    _, path = base
    same = vkrt("-m", files["llama"], "-c", N_CTX, "--kl-divergence-base", path, "--kl-divergence")
    assert same.exit_code == 0, same.output
    assert same.stdout.count("chunk             PPL               ln(PPL(Q)/PPL(base))") == 4
    assert re.search(r"^   4 +\d+\.\d{4} ± +\d+\.\d{4} .* 100\.000 ± +0\.000 %$", same.stdout, re.M), same.stdout
    assert abs(_stat(same.stdout, "Mean    KLD")) < 1e-3 and _stat(same.stdout, "Maximum KLD") < 1e-2
    assert _stat(same.stdout, "Same top p") == 100.0
    for line in ("====== Perplexity statistics ======", "====== KL divergence statistics ======",
                 "====== Token probability statistics ======", "Mean PPL(Q)/PPL(base)", "99.9%   KLD:",
                 " 0.1%   Δp:", "RMS Δp    :"):
        assert line in same.stdout
    other = vkrt("-m", files["qwen2"], "-c", N_CTX, "--kl-divergence-base", path, "--kl-divergence")
    assert other.exit_code == 0, other.output
    assert _stat(other.stdout, "Mean    KLD") > 0.1 and _stat(other.stdout, "Same top p") < 100.0


def _refused(result, *needles):
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    for needle in needles:
        assert needle in result.output, result.output


def test_bad_input_is_refused_clearly(files, device, base):
    folder, llama = files["folder"], files["llama"]
    _refused(vkrt("-m", llama, "-f", folder / "nope.txt"), "failed to open", "nope.txt")
    short = folder / "short.txt"
    short.write_text("a few words only")
    _refused(vkrt("-m", llama, "-f", short, "-c", N_CTX),
             "you need at least 128 tokens to evaluate perplexity with a context of 64", "tokenizes to only")
    _refused(vkrt("-m", llama, "-f", files["text"], "-c", 1024), "-c 1024", "trained on only 512 context tokens")
    _refused(vkrt("-m", llama, "-f", files["text"], "-c", N_CTX, "--chunks", 0), "--chunks 0")
    _refused(vkrt("-m", llama), "-f FILE")
    _refused(vkrt("-m", llama, "--kl-divergence"), "--kl-divergence-base FILE")
    _refused(vkrt("-m", llama, "--kl-divergence-base", folder / "none.kl", "--kl-divergence"),
             "failed to open", "none.kl")
    _, path = base
    _refused(vkrt("-m", llama, "-c", 32, "--kl-divergence-base", path, "--kl-divergence"),
             "has been computed with 64, while the current context is 32")
    corrupt = folder / "corrupt.kl"
    corrupt.write_bytes(b"_logits_" + struct.pack("<i", 64))
    _refused(vkrt("-m", llama, "--kl-divergence-base", corrupt, "--kl-divergence"),
             "corrupt.kl: failed reading n_ctx, n_vocab, n_chunk")
    other_vocab = folder / "vocab.kl"
    raw = bytearray(path.read_bytes())
    n_vocab = struct.unpack("<i", raw[12:16])[0]
    raw[12:16] = struct.pack("<i", n_vocab + 1)   # rows one word longer too: resize the body to fit
    body = np.frombuffer(bytes(raw[20 + 16 * N_CTX:]), "<u2").reshape(-1, row_words(n_vocab))
    wider = np.zeros((body.shape[0], row_words(n_vocab + 1)), np.uint16)
    wider[:, :body.shape[1]] = body
    other_vocab.write_bytes(bytes(raw[:20 + 16 * N_CTX]) + wider.tobytes())
    _refused(vkrt("-m", llama, "-c", N_CTX, "--kl-divergence-base", other_vocab, "--kl-divergence"),
             "vocab.kl: inconsistent vocabulary", f"n_vocab is {n_vocab + 1} in the file", f"{n_vocab} tokens")
