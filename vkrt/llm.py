"""The Python API: `vkrt.load(model, **options) -> LLM`, then generate / stream / chat /
tokenize / logits, and close (or use it as a context manager).

    import vkrt
    with vkrt.load("model.gguf", n_ctx=2048) as llm:
        print(llm.generate("The capital of France is", max_tokens=16, temperature=0))
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
from collections.abc import Iterator

import numpy as np

from .engine.generate import TextStream, generate
from .engine.options import EngineOptions, open_engine
from .engine.sampler import SamplingParams
from .engine.drafting import open_drafting
from .engine.sampler_order import parse_order
from .engine.speculative import SpecOptions
from .errors import ConfigError
from .model.default_model import default_model

_SAMPLING = {f.name for f in dataclasses.fields(SamplingParams)}
_OPTIONS = {f.name for f in dataclasses.fields(EngineOptions)}


def load(model: str | None = None, *, hf: str | None = None, hf_file: str | None = None,
         hf_token: str | None = None, device=None, settings=None, speculative: str | None = None,
         draft_model: str | None = None, draft_max: int = 16, draft_min: int = 0, draft_p_min: float = 0.75,
         **options) -> "LLM":
    """Open a GGUF model (a path; the first part of a split model; `hf="owner/name[:quant]"` to
    fetch it from Hugging Face as `-hf` does; neither: the embedded SmolLM2) on `device` (default:
    the first suitable Vulkan device that `settings` pick, as the CLI picks it; a Device, a list
    of them, or a spec as --device takes, e.g. "0,1": split by layers). `settings`: a
    vkrt.settings.Settings (default: read from the VKRT_* environment variables now); an open
    `device` brings its own. `options` are EngineOptions fields (n_ctx, n_batch, n_ubatch,
    flash_attn, n_gpu_layers, mmap, kv_type, n_cpu_moe, split_mode, tensor_split, main_gpu, ...).
    Speculative decoding (the same output, fewer steps where drafts land): `speculative` "ngram"
    (drafts looked up in the prompt and output), "mtp" (the model's own MTP block) or "draft" (a
    `draft_model` file of the same vocabulary, on the model's main device), with draft_max / draft_min / draft_p_min as
    llama-server's --draft-max / --draft-min / --draft-p-min."""
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ConfigError(f"vkrt.load: unknown option(s) {', '.join(unknown)} (options: {', '.join(sorted(_OPTIONS))})")
    if model and hf:
        raise ConfigError("vkrt.load: give the model as a path or as hf='owner/name[:quant]', not both")
    if device is not None and not isinstance(device, str) and settings is not None:
        raise ConfigError("vkrt.load: an open device brings its own settings (device.settings); pass one or the other")
    if hf_file and not hf:
        raise ConfigError("vkrt.load: hf_file names a file of the repository given by hf='owner/name'")
    if draft_model is not None and speculative is None:
        speculative = "draft"
    spec = SpecOptions(speculative, draft_max=draft_max, draft_min=draft_min, p_min=draft_p_min) \
        if speculative is not None else None
    if hf:
        from .model.hub import resolve
        path = resolve(hf, hf_file, hf_token)
    else:
        path = model or default_model()
    verify = spec.step_tokens(options.get("n_seq_max", 1)) if spec is not None else 0
    opts = EngineOptions(**{"progress": False, "verify_tokens": verify, **options})
    owned = device is None or isinstance(device, str)
    if owned:
        from .device.group import DeviceGroup, parse_device_list
        device = DeviceGroup(parse_device_list(device), settings=settings)
    m = engine = None
    try:
        m, engine = open_engine(device, path, opts)
        drafting = open_drafting(spec, m, engine, engine.device, draft_model)
    except BaseException:
        for obj in (engine, m, device if owned else None):
            if obj is not None:
                obj.close()
        raise
    return LLM(m, engine, device if owned else None, drafting)


class LLM:
    """A loaded model and its engine. Every call starts from an empty context (one sequence);
    `sampling` keywords are SamplingParams fields (temperature=0 is greedy)."""

    def __init__(self, model, engine, device=None, drafting=None):
        self.model, self.engine, self._device = model, engine, device
        self.drafting = drafting   # speculative decoding (engine/drafting.py), or None
        self.last_timings = None   # the Timings of the last generate / stream / chat
        self._template = None

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special=True)

    def logits(self, prompt: str | list[int], all_positions: bool = False) -> np.ndarray:
        """The logits after the prompt ([n_vocab]), or at every position ([n_tokens, n_vocab])."""
        tokens = self._tokens(prompt)
        self.engine.reset()
        out = self.engine.eval(tokens, all_logits=all_positions)
        return np.array(out, copy=True)

    def generate(self, prompt: str | list[int], max_tokens: int = 128, *, stop_at_eos: bool = True,
                 grammar: str | None = None, json_schema: dict | str | None = None, images: list | None = None,
                 **sampling) -> str:
        """The continuation of `prompt` (text or token ids), up to max_tokens tokens; with
        `grammar` (GBNF) or `json_schema` only text that fits it. `images` (files: paths or
        bytes; load with mmproj=): each where the text prompt has a "<__media__>" marker, or
        without markers all before it."""
        return "".join(self.stream(prompt, max_tokens, stop_at_eos=stop_at_eos, grammar=grammar,
                                   json_schema=json_schema, images=images, **sampling))

    def stream(self, prompt: str | list[int], max_tokens: int = 128, *, stop_at_eos: bool = True,
               grammar: str | None = None, json_schema: dict | str | None = None, images: list | None = None,
               **sampling) -> Iterator[str]:
        """The continuation of `prompt` as it is generated, in text pieces (`images` as generate
        takes them); closing the iterator early stops the generation."""
        tokens = self._media(prompt, images) if images else self._tokens(prompt)
        params = self._params(sampling)
        constraint = self._constraint(grammar, json_schema)
        if max_tokens < 0:
            raise ConfigError(f"max_tokens must not be negative, got {max_tokens}")
        if len(tokens) + max_tokens > self.engine.n_ctx:
            raise ConfigError(f"the prompt ({len(tokens)} tokens) plus max_tokens {max_tokens} exceed the context of "
                              f"{self.engine.n_ctx} tokens (load with a larger n_ctx)")
        pieces: queue.Queue = queue.Queue()
        stop = threading.Event()
        text = TextStream(self.tokenizer)

        def on_token(token: int) -> bool:
            piece = text.push(token)
            if piece:
                pieces.put(piece)
            return stop.is_set()

        def work():
            try:
                self.engine.reset()
                gen = generate(self.engine, tokens, max_tokens, params, on_token=on_token,
                               stop_tokens=self.tokenizer.eog_ids if stop_at_eos else (), grammar=constraint,
                               speculation=self.drafting.speculation() if self.drafting is not None else None)
                self.last_timings = gen.timings
                rest = text.flush()
                if rest:
                    pieces.put(rest)
                pieces.put(None)
            except BaseException as exc:   # raised again in the caller's thread
                pieces.put(exc)

        worker = threading.Thread(target=work, name="vkrt-generate", daemon=True)
        worker.start()
        try:
            while (item := pieces.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            worker.join()

    def chat(self, messages: list[dict], max_tokens: int = 256, **sampling) -> str:
        """The assistant's reply to `messages` ([{"role": ..., "content": ...}]), rendered with the
        model's chat template."""
        return self.generate(self.chat_prompt(messages), max_tokens, **sampling)

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The tokens the chat template makes of `messages`, ready for the assistant's reply."""
        from .server.chat_template import ChatTemplate, encode_chat
        if self._template is None:
            self._template = ChatTemplate.from_tokenizer(self.model.gguf.metadata, self.tokenizer)
        return encode_chat(self.tokenizer, self._template.render(messages, add_generation_prompt=True))

    def close(self) -> None:
        for owner in ("drafting", "engine", "model", "_device"):
            h = getattr(self, owner)
            if h is not None:
                h.close()
                setattr(self, owner, None)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _media(self, prompt, images: list):
        """A MediaPrompt of the text `prompt` and `images` (paths or bytes)."""
        from .model.media_prompt import MARKER
        if self.engine is None:
            raise ConfigError("this LLM is closed")
        if self.engine.vision is None:
            raise ConfigError("images need the model's vision projector: vkrt.load(..., mmproj='mmproj-F16.gguf')")
        if not isinstance(prompt, str):
            raise ConfigError("a prompt with images must be text (the images go at its <__media__> markers)")
        data, names = [], []
        for k, img in enumerate(images):
            if isinstance(img, (bytes, bytearray)):
                data.append(bytes(img))
                names.append(f"image {k}")
            else:
                with open(os.fspath(img), "rb") as f:
                    data.append(f.read())
                names.append(os.fspath(img))
        if MARKER not in prompt:
            prompt = MARKER * len(data) + prompt
        return self.engine.vision.prompt(self.tokenizer, prompt, data, MARKER, names=names)

    def _tokens(self, prompt) -> list[int]:
        if self.engine is None:
            raise ConfigError("this LLM is closed")
        if isinstance(prompt, str):
            tokens = self.tokenize(prompt)
        else:
            tokens = [int(t) for t in prompt]
            bad = [t for t in tokens if not 0 <= t < self.model.cfg.vocab_size]
            if bad:
                raise ConfigError(f"token id {bad[0]} is outside the vocabulary of {self.model.cfg.vocab_size}")
        if not tokens:
            raise ConfigError("the prompt is empty: no tokens to evaluate")
        return tokens

    def _constraint(self, grammar, json_schema):
        """The grammar state of a call (GBNF or a JSON schema), or None."""
        if grammar is None and json_schema is None:
            return None
        if grammar is not None and json_schema is not None:
            raise ConfigError("give grammar or json_schema, not both")
        from .engine.grammar import Constraint, grammar_tokenizer
        from .engine.grammar_compile import gbnf_grammar, json_schema_grammar
        text = gbnf_grammar(grammar) if grammar is not None else json_schema_grammar(json_schema)
        return Constraint(grammar_tokenizer(self.tokenizer, self.model.cfg.vocab_size), text)

    @staticmethod
    def _params(sampling: dict) -> SamplingParams:
        unknown = sorted(set(sampling) - _SAMPLING)
        if unknown:
            raise ConfigError(f"unknown sampling option(s) {', '.join(unknown)} (options: {', '.join(sorted(_SAMPLING))})")
        if "order" in sampling:   # a list of sampler names (or their letters), checked as the server checks them
            sampling = {**sampling, "order": parse_order(sampling["order"], "order")}
        return SamplingParams(**sampling)
