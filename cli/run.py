"""`vkrt run`: generate a continuation of a prompt and print it with a timing line."""

from __future__ import annotations

import json
import sys

import click

from .common import (
    FiniteFloat,
    count,
    mmproj_options,
    model_options,
    open_devices,
    open_drafting,
    open_engine,
    spec_options,
    take_model,
    take_spec,
    verify_tokens,
)


@click.command()
@model_options
@mmproj_options
@click.option("-p", "--prompt", default="The capital of France is", show_default=True, help="Prompt text.")
@click.option("--image", "images", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="Image file (PNG, JPEG, WebP, GIF, BMP) for the prompt; repeatable. Each goes where the prompt "
                   "has a <__media__> marker, or, without markers, all before the prompt (as llama-mtmd-cli). "
                   "Needs a vision projector (--mmproj, or -hf's).")
@click.option("-n", "--n-predict", type=count(0), default=64, show_default=True, help="Tokens to generate.")
@click.option("--temp", type=FiniteFloat(), default=0.8, show_default=True, help="Temperature (0 = greedy).")
@click.option("--top-k", type=count(-2 ** 31), default=40, show_default=True)
@click.option("--top-p", type=FiniteFloat(), default=0.95, show_default=True)
@click.option("--min-p", type=FiniteFloat(), default=0.05, show_default=True)
@click.option("--repeat-penalty", type=FiniteFloat(), default=1.0, show_default=True)
@click.option("--seed", type=count(-1, 2 ** 32 - 1), default=None, help="Sampling seed (-1 or default: random).")
@click.option("--samplers", default=None,
              help="Sampler chain, in order, ';'-separated (llama.cpp's names, e.g. "
                   "'penalties;dry;top_k;top_p;min_p;temperature'); only these run. Default: llama.cpp's chain.")
@click.option("--sampling-seq", default=None, help="The same as letters, e.g. 'edskypmxt' (llama.cpp's).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--grammar", default=None, help="GBNF grammar (or Lark) the output must fit.")
@click.option("--grammar-file", type=click.File("r"), default=None, help="File holding the GBNF grammar.")
@click.option("-j", "--json-schema", default=None, help="JSON schema (its JSON text) the output must fit.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (tokens, text, timings).")
@spec_options
def run(prompt, images, n_predict, temp, top_k, top_p, min_p, repeat_penalty, seed, samplers, sampling_seq, ignore_eos,
        grammar, grammar_file, json_schema, as_json, **model_kw):
    """Generate a continuation of PROMPT with a GGUF model."""
    from vkrt.engine.generate import TextStream, generate
    from vkrt.engine.grammar import Constraint, grammar_tokenizer
    from vkrt.engine.sampler import SamplingParams

    constraint = _grammar(grammar, grammar_file, json_schema)

    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                            repeat_penalty=repeat_penalty, seed=None if seed == -1 else seed, order=_order(samplers, sampling_seq))
    spec, draft_path, ngld, devd = take_spec(model_kw)
    take_model(model_kw, fetch_mmproj=bool(images))
    if images and model_kw["mmproj"] is None:
        raise click.UsageError("--image needs the model's vision projector: give --mmproj FILE (-hf fetches the "
                               "repository's mmproj file)")
    if images and spec is not None and spec.type != "mtp":
        raise click.UsageError(f"--image does not go with --spec-type {spec.type} (it would draft the image's "
                               "placeholder ids); the MTP head drafts with images (--spec-type mtp)")
    with open_devices(model_kw["device"]) as devices:
        model, engine = open_engine(devices, progress=None if not as_json else False,
                                    verify_tokens=verify_tokens(spec), **model_kw)
        drafting = None
        try:
            drafting = open_drafting(spec, engine, model, draft_path, ngld, devd)
            tokens = _prompt(engine, model, prompt, images)
            if len(tokens) + n_predict > engine.n_ctx:
                raise click.UsageError(f"prompt plus -n {n_predict} exceed the context of {engine.n_ctx} tokens "
                                       "(raise -c)")
            stream = TextStream(model.tokenizer)

            def show(token):
                if not as_json:
                    sys.stdout.write(stream.push(token))
                    sys.stdout.flush()

            if not as_json:
                sys.stdout.write(prompt)
            if constraint is not None:
                constraint = Constraint(grammar_tokenizer(model.tokenizer, model.cfg.vocab_size), constraint)
            gen = generate(engine, tokens, n_predict, params, on_token=show,
                           stop_tokens=() if ignore_eos else model.tokenizer.eog_ids, grammar=constraint,
                           speculation=drafting.speculation() if drafting is not None else None)
            text = model.tokenizer.decode(gen.tokens, skip_special=True)
            t = gen.timings
            hits = engine.expert_cache_hit_rate()
            if as_json:
                out = {"prompt_tokens": gen.prompt_tokens, "tokens": gen.tokens, "text": text,
                       "stop_reason": gen.stop_reason, "timings": t.to_dict()}
                if hits is not None:
                    out["expert_cache_hit_rate"] = hits
                click.echo(json.dumps(out))
            else:
                sys.stdout.write(stream.flush() + "\n")
                cache = f" | expert cache {100 * hits:.0f}% hits" if hits is not None else ""
                drafts = f" | drafts {t.draft_n_accepted}/{t.draft_n} accepted" if drafting is not None else ""
                click.echo(f"\nprompt: {t.prompt_n} tokens, {t.prompt_per_second:.2f} t/s | "
                           f"generation: {t.predicted_n} tokens, {t.predicted_per_second:.2f} t/s{cache}{drafts} | "
                           f"{' + '.join(st.device.profile.name for st in engine.stages)}", err=True)
        finally:
            for obj in (drafting, engine, model):
                if obj is not None:
                    obj.close()


def _prompt(engine, model, prompt: str, images: tuple):
    """The prompt's tokens; with --image a MediaPrompt, each image encoded at its marker."""
    if not images:
        return model.tokenizer.encode(prompt)
    from vkrt.model.media_prompt import MARKER
    if MARKER not in prompt:
        prompt = MARKER * len(images) + prompt
    data = []
    for path in images:
        with open(path, "rb") as f:
            data.append(f.read())
    return engine.vision.prompt(model.tokenizer, prompt, data, MARKER, names=list(images))


def _order(samplers, sampling_seq) -> tuple:
    from vkrt.engine.sampler_order import DEFAULT_ORDER, parse_order
    from vkrt.errors import ConfigError
    if samplers is not None and sampling_seq is not None:
        raise click.UsageError("give the sampler chain as --samplers or as --sampling-seq, not both")
    text, hint = (samplers, "--samplers") if samplers is not None else (sampling_seq, "--sampling-seq")
    if text is None:
        return DEFAULT_ORDER
    try:
        return parse_order(text, hint, letters=hint == "--sampling-seq")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _grammar(grammar, grammar_file, json_schema) -> str | None:
    """The llguidance grammar of --grammar, --grammar-file or --json-schema (at most one)."""
    from vkrt.engine.grammar_compile import GrammarError, gbnf_grammar, json_schema_grammar

    given = [(name, v) for name, v in (("--grammar", grammar), ("--grammar-file", grammar_file),
                                       ("--json-schema", json_schema)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise click.UsageError(f"give one of --grammar, --grammar-file and --json-schema, not {given[0][0]} and "
                               f"{given[1][0]}")
    name, value = given[0]
    try:
        if name == "--json-schema":
            return json_schema_grammar(value)
        return gbnf_grammar(value.read() if name == "--grammar-file" else value)
    except GrammarError as exc:
        raise click.BadParameter(str(exc), param_hint=name) from None
