"""The gpt-4o (o200k) pre-tokenizer of gpt-oss files, and gpt-oss's end-of-generation tokens."""

import pytest

from vkrt.model.synthetic import _bpe_vocab, _gpt2_byte_decoder
from vkrt.model.tokenizer import TOKEN_CONTROL, Tokenizer

# llama.cpp's regex for tokenizer.ggml.pre = gpt-4o: capitalised words split from the next one,
# contractions kept on their word, digits in threes, a space leading the word it precedes,
# punctuation runs with their trailing newlines or slashes; its letter classes are "not a-z" and
# "not A-Z", so a non-ASCII capital opens a piece of its own before ASCII capitals
SPLITS = [
    ("HelloWorld HTTPServer", ["Hello", "World", " HTTPServer"]),
    ("don't STOP'S we'll", ["don't", " STOP'S", " we'll"]),
    ("12345 x3.14", ["123", "45", " x", "3", ".", "14"]),
    ("a...\n\n  b//c", ["a", "...\n\n", " ", " b", "//", "c"]),
    ("naïve ÉCOLE", ["naïve", " É", "COLE"]),
]


def gpt4o_tokenizer(tokens, types, merges, **more) -> Tokenizer:
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges, **more}
    return Tokenizer.from_metadata(meta)


@pytest.fixture(scope="module")
def vocab():
    return _bpe_vocab(200)


@pytest.mark.parametrize("text,pieces", SPLITS)
def test_gpt4o_pieces(vocab, text, pieces):
    tok = gpt4o_tokenizer(*vocab)
    byte_of = _gpt2_byte_decoder()
    got = [bytes(byte_of[c] for c in piece).decode() for piece, _ in tok.hf.pre_tokenizer.pre_tokenize_str(text)]
    assert got == pieces
    if text.isascii():   # the tiny vocabulary holds ASCII bytes only
        assert tok.decode(tok.encode(text)) == text


def test_harmony_end_is_not_end_of_generation(vocab):
    """With <|return|>, <|call|> and <|end|> all control tokens, generation ends on the first two
    only: harmony ends every message with <|end|> (llama.cpp drops it from its EOG list)."""
    tokens, types, merges = vocab
    harmony = ["<|return|>", "<|call|>", "<|end|>", "<|start|>"]
    tok = gpt4o_tokenizer(tokens + harmony, types + [TOKEN_CONTROL] * 4, merges)
    ids = {t: tokens.__len__() + i for i, t in enumerate(harmony)}
    assert {ids["<|return|>"], ids["<|call|>"]} <= tok.eog_ids and ids["<|end|>"] not in tok.eog_ids
    tok = gpt4o_tokenizer(tokens + ["<|end|>"], types + [TOKEN_CONTROL], merges)
    assert len(tokens) in tok.eog_ids   # alone (phi-3 style), <|end|> still ends generation
