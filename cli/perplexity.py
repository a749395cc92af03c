"""`vkrt perplexity`: llama-perplexity's perplexity and KL-divergence modes, options and output
(results on stdout, progress and the final estimate on stderr, as llama.cpp's log)."""

from __future__ import annotations

import sys
import time

import click

from vkrt.errors import VkrtError

from .common import count, model_options, open_devices, open_engine, take_model
from .perplexity_report import KL_HEADER, chunk_ppl, eta, final_estimate, kl_chunk, kl_summary


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _info(text: str) -> None:
    click.echo(text, err=True)


def _read_text(path: str) -> str:
    try:
        data = open(path, "rb").read()
    except OSError as exc:
        raise VkrtError(f"failed to open {path}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VkrtError(f"{path}: not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})") from None


@click.command()
@model_options(n_ctx=512, ctx_help="Tokens per chunk; each chunk is scored on its second half.")
@click.option("-f", "--file", "text_file", default=None, help="Text to evaluate perplexity on.")
@click.option("--chunks", "n_chunks", type=count(-1), default=-1, show_default=True,
              help="Evaluate at most this many chunks (-1: all the text makes).")
@click.option("--kl-divergence-base", "kl_base", default=None,
              help="Logits file: written with the base model's log-probabilities (perplexity mode), "
                   "read with --kl-divergence.")
@click.option("--kl-divergence", "kl", is_flag=True,
              help="Compare against the --kl-divergence-base file (its tokens; -f is not read).")
def perplexity(text_file, n_chunks, kl_base, kl, **model_kw):
    """Perplexity of a text, or KL divergence against a base model's logits file (llama-perplexity's method)."""
    from vkrt.engine.kl_file import LogitsReader

    model_kw = take_model(model_kw)
    if kl and not kl_base:
        raise click.UsageError("--kl-divergence: you must provide a name of a file containing the log "
                               "probabilities of the base model (--kl-divergence-base FILE)")
    if not kl and not text_file:
        raise click.UsageError("-f FILE: give the text to evaluate perplexity on")
    reader = LogitsReader(kl_base) if kl else None
    text = None if kl else _read_text(text_file)
    n_ctx = model_kw["n_ctx"]
    if reader is not None and reader.n_ctx > n_ctx:
        reader.close()
        raise VkrtError(f"{kl_base} has been computed with {reader.n_ctx}, while the current context is {n_ctx}. "
                        "Increase it with -c and retry")
    model_kw["n_batch"] = min(model_kw["n_batch"], n_ctx)
    try:
        with open_devices(model_kw["device"]) as devices:
            model, engine = open_engine(devices, **model_kw)
            try:
                if n_ctx > model.cfg.n_ctx_train:
                    raise VkrtError(f"-c {n_ctx}: the model was trained on only {model.cfg.n_ctx_train} context "
                                    f"tokens ({n_ctx} specified); lower -c")
                bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
                if reader is not None:
                    _kl_divergence(engine, reader, bos, model_kw["n_batch"])
                else:
                    _perplexity(engine, model.tokenizer, text, n_ctx, model_kw["n_batch"], n_chunks, bos, kl_base)
            finally:
                engine.close()
                model.close()
    finally:
        if reader is not None:
            reader.close()


def _perplexity(engine, tokenizer, text, n_ctx, n_batch, n_chunks, bos, logits_path) -> None:
    from vkrt.engine.kl_file import LogitsWriter
    from vkrt.engine.perplexity import NllSums, chunk_count, chunk_scores, row_nll

    _info("perplexity: tokenizing the input ..")
    t0 = time.perf_counter()
    tokens = tokenizer.encode(text, add_special=True)
    _info(f"perplexity: tokenization took {1e3 * (time.perf_counter() - t0):g} ms")
    n_chunk = chunk_count(len(tokens), n_ctx, n_chunks)
    n_vocab = engine.model.cfg.vocab_size
    writer = None
    if logits_path:
        writer = LogitsWriter(logits_path, n_ctx, n_vocab, n_chunk, tokens)
        _info(f"perplexity: saving all logits to {logits_path}")
    _info(f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, "
          "n_seq=1")
    sums = NllSums()
    try:
        t0 = time.perf_counter()
        for i, logits, targets in chunk_scores(engine, tokens, n_ctx, n_batch, n_chunk, bos):
            if i == 0:
                _info(eta("perplexity", time.perf_counter() - t0, n_chunk))
            if writer is not None:
                writer.write_chunk(logits)
            sums.add(row_nll(logits, targets))
            _out(chunk_ppl(i, sums))
        _out("\n")
    finally:
        if writer is not None:
            writer.close()
    _info(final_estimate(sums))


def _kl_divergence(engine, reader, bos, n_batch) -> None:
    from vkrt.engine.kl_divergence import KLStats
    from vkrt.engine.perplexity import chunk_scores

    n_vocab = engine.model.cfg.vocab_size
    if reader.n_vocab != n_vocab:
        raise VkrtError(f"{reader.path}: inconsistent vocabulary: n_vocab is {reader.n_vocab} in the file, "
                        f"the model has {n_vocab} tokens")
    kl = KLStats()
    t0 = time.perf_counter()
    for i, logits, targets in chunk_scores(engine, reader.tokens, reader.n_ctx, min(n_batch, reader.n_ctx),
                                           reader.n_chunk, bos):
        base = reader.read_chunk(i)
        if i == 0:
            _info(eta("kl_divergence", time.perf_counter() - t0, reader.n_chunk))
        kl.add(logits, targets, base)
        _out(f"\n{KL_HEADER}\n{kl_chunk(i, kl)}\n")
    _out("\n")
    if kl.count < 100:
        _info(f"kl_divergence: only {kl.count} tokens scored: no statistics below 100 (as llama-perplexity)")
        return
    _out("\n".join(kl_summary(kl)) + "\n")
