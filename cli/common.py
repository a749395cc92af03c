"""Options and set-up shared by the commands that load a model."""

from __future__ import annotations

import math
import os

import click

# -ctk / -ctv: vkrt.ops.kv_quant.KV_TYPES (spelt out: the CLI imports vkrt lazily)
KV_CACHE_TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")

INT32_MAX = 2 ** 31 - 1   # the largest count the engine indexes buffers and shaders with


def count(low: int = 0, high: int = INT32_MAX) -> click.IntRange:
    """An integer option's type: low..high, by default at most 2^31-1 (refused with a usage
    error past it, as past what the engine's 32-bit indices reach)."""
    return click.IntRange(low, high)


class FiniteFloat(click.FloatRange):
    """A FloatRange that also refuses nan and inf."""

    name = "finite float range"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def default_model() -> str:
    """The embedded default model's path (imported when used: the CLI starts without Vulkan)."""
    from vkrt.model.default_model import default_model as embedded
    return embedded()

def hub_model(hf_repo: str, hf_file: str | None, hf_token: str | None) -> str:
    """-hf owner/name[:quant] (and --hf-file, --hf-token): the local path of the model, downloaded
    into the Hugging Face cache where it is not there yet."""
    from vkrt.model.hub import resolve
    return resolve(hf_repo, hf_file, hf_token)


def check_hub_names(ctx, param, value):
    """-hf's callback: every repository named (comma-separated where repeated) follows Hugging
    Face's owner/name[:quant] rules, else a usage error before any network access."""
    from vkrt.errors import HubError
    from vkrt.model.hub_files import split_repo_tag
    if param.multiple:   # bench: -hf repeated or comma-separated, empty items skipped as bench skips them
        repos = [repo for spec in value for repo in spec.split(",") if repo]
    else:
        repos = [] if value is None else [value]
    for repo in repos:
        try:
            split_repo_tag(repo)
        except HubError as exc:
            raise click.UsageError(str(exc), ctx) from None
    return value


def take_model(model_kw: dict, fetch_mmproj: bool = True) -> dict:
    """Replace -m / -hf / --hf-file / --hf-token in `model_kw` by the local model path (`model`);
    with mmproj_options, --mmproj / --no-mmproj by the projector's path (`mmproj`, None: none):
    -hf also fetches the repository's mmproj file unless --no-mmproj (or not `fetch_mmproj`)."""
    model, hf_repo = model_kw.pop("model"), model_kw.pop("hf_repo")
    hf_file, hf_token = model_kw.pop("hf_file"), model_kw.pop("hf_token")
    if model and hf_repo:
        raise click.UsageError("give the model as -m FILE or as -hf REPO[:QUANT], not both")
    if hf_file and not hf_repo:
        raise click.UsageError("--hf-file names a file of the repository given by -hf REPO")
    named = "no_mmproj" in model_kw   # the command has mmproj_options
    mmproj = _mmproj(model_kw) if named else None
    model_kw["model"] = hub_model(hf_repo, hf_file, hf_token) if hf_repo else model or default_model()
    if mmproj is True:   # neither option: the projector beside a -hf model
        mmproj = None
        if hf_repo and fetch_mmproj:
            from vkrt.model.hub import resolve_mmproj
            mmproj = resolve_mmproj(hf_repo, hf_file, hf_token)
    if named:
        model_kw["mmproj"] = mmproj or None
    return model_kw


def _mmproj(model_kw: dict):
    """Pop --mmproj / --no-mmproj: the file (checked), False (--no-mmproj) or True (neither)."""
    path, off = model_kw.pop("mmproj"), model_kw.pop("no_mmproj")
    if path is not None and off:
        raise click.UsageError("give --mmproj FILE or --no-mmproj, not both")
    if path is not None and not os.path.isfile(path):
        raise click.BadParameter(f"{path}: no such file", param_hint="--mmproj")
    return path if path is not None else not off


def mmproj_options(f):
    """--mmproj, --no-mmproj, named as llama-server's (decorator)."""
    opts = [
        click.option("-mm", "--mmproj", "mmproj", type=click.Path(dir_okay=False), default=None,
                     help="Vision projector (mmproj-*.gguf) of the model: images in prompts (default: the "
                          "repository's mmproj file with -hf)."),
        click.option("--no-mmproj", "no_mmproj", is_flag=True,
                     help="Load no vision projector (not even the one -hf would fetch)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def hub_options(f, *, multiple: bool = False):
    """-hf, --hf-file, --hf-token, named as llama.cpp's (decorator)."""
    opts = [
        click.option("-hf", "-hfr", "--hf-repo", "hf_repo", default=None, multiple=multiple,
                     metavar="<user>/<model>[:quant]", callback=check_hub_names,
                     help="Hugging Face repository to load the model from; quant is case-insensitive, default "
                          "Q4_K_M, else Q8_0, else the first GGUF file (downloaded into the Hugging Face cache; "
                          "HF_HUB_OFFLINE=1: cached files only)."),
        click.option("-hff", "--hf-file", "hf_file", default=None,
                     help="File of the -hf repository to load, overriding the quant tag."),
        click.option("-hft", "--hf-token", "hf_token", envvar="HF_TOKEN", default=None,
                     help="Hugging Face access token (default: HF_TOKEN, else huggingface_hub's stored login)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def flag01(value: str) -> bool:
    """An on/off option's value, spelled as a flag variable's (vkrt.settings.FLAG_ON / FLAG_OFF)."""
    from vkrt.errors import ConfigError
    from vkrt.settings import parse_flag
    try:
        return parse_flag("value", str(value))
    except ConfigError:
        raise click.BadParameter(f"expected 0/1 or on/off, got {value!r}") from None


def cache_size(value: str) -> int | None:
    """--expert-cache: 'auto' (None: what VRAM is left), 0 (off) or a size such as 4G."""
    from vkrt.units import parse_size
    v = str(value).strip().lower()
    return None if v == "auto" else parse_size(v, "--expert-cache")


def model_options(f=None, *, n_ctx: int = 4096, ctx_help: str = "Context size (KV cache cells)."):
    """-m, -hf, -c, -b, -ub, -fa, -ngl, --no-mmap, --no-pin, --kv-type, -ctk, -ctv (decorator; called with
    keywords, a command's own -c default and help)."""
    if f is None:
        return lambda g: model_options(g, n_ctx=n_ctx, ctx_help=ctx_help)
    opts = [
        click.option("-m", "--model", "model", default=None,
                     help="GGUF model file; of a split model its first part (default: SmolLM2-135M)."),
        hub_options,
        click.option("-c", "--ctx-size", "n_ctx", type=count(16), default=n_ctx, show_default=True,
                     help=ctx_help),
        click.option("-b", "--batch-size", "n_batch", type=count(1), default=2048, show_default=True,
                     help="Logical batch size."),
        click.option("-ub", "--ub", "--ubatch-size", "n_ubatch", type=count(1), default=512, show_default=True,
                     help="Micro-batch size (tokens per forward pass)."),
        click.option("-fa", "--flash-attn", "flash_attn", default="1", show_default=True,
                     help="Flash attention: 1/on or 0/off."),
        click.option("-ngl", "--n-gpu-layers", "n_gpu_layers", type=count(0), default=999,
                     help="Layers whose weights go to VRAM; the rest stay in host memory (default: all)."),
        click.option("--no-mmap", is_flag=True, help="Read weights into anonymous memory instead of mapping the file."),
        click.option("--no-pin", is_flag=True, help="Do not import host-resident weights (VKRT_REGISTER_HOST=0)."),
        click.option("--kv-type", type=click.Choice(["f16", "f32"]), default="f16", show_default=True,
                     help="KV cache type."),
        click.option("-ctk", "--cache-type-k", "cache_type_k", type=click.Choice(KV_CACHE_TYPES), default=None,
                     help="K cache type (default: --kv-type); quantised types need flash attention."),
        click.option("-ctv", "--cache-type-v", "cache_type_v", type=click.Choice(KV_CACHE_TYPES), default=None,
                     help="V cache type (default: --kv-type); quantised types need flash attention."),
        click.option("-ncmoe", "--n-cpu-moe", "n_cpu_moe", type=count(0), default=None,
                     help="Keep the expert tensors of the first N layers in host memory (MoE models)."),
        click.option("--vram-budget", default=None,
                     help="Use at most this much VRAM (e.g. 8G; with several devices one size each, 8G,8G,4G); "
                          "without --n-cpu-moe, place experts to fit."),
        click.option("--expert-cache", default="auto", show_default=True,
                     help="VRAM for caching host-resident experts during decode (a size, auto = what is left, 0 = off)."),
        cpu_expert_options,
        device_options,
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def cpu_expert_options(f):
    """--cpu-experts, --cpu-moe-threads, --link-bandwidth (decorator)."""
    opts = [
        click.option("--cpu-experts", "cpu_experts", type=click.Choice(["off", "auto", "all"]), default="auto",
                     show_default=True,
                     help="Host-resident experts not in the expert cache: auto = on the CPU or copied to the GPU, "
                          "whichever the measured rates say is cheaper; all = on the CPU; off = copied to the GPU."),
        click.option("--cpu-moe-threads", "cpu_moe_threads", type=count(1), default=None,
                     help="Threads of the CPU expert kernels (default: the CPU's cores)."),
        click.option("--link-bandwidth", "link_bandwidth", type=FiniteFloat(min=0, min_open=True), default=None,
                     metavar="GB/s",
                     help="Pace host-to-device expert traffic to this rate, as a slower PCIe link would "
                          "(PCIe 3 x16 ~12, x4 ~3, x1 ~1; default VKRT_LINK_BANDWIDTH, else unpaced)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def device_options(f):
    """--device, -sm, -ts, -mg, named as llama.cpp's (decorator)."""
    opts = [
        click.option("-dev", "--device", "device", default=None, metavar="LIST",
                     help="Devices to use, comma-separated indices or name substrings as `vkrt devices` lists them "
                          "(a repeated index opens several logical devices on one GPU); default: one device "
                          "(VKRT_DEVICE, else the best)."),
        click.option("-sm", "--split-mode", "split_mode", type=click.Choice(["none", "layer", "row"]), default="layer",
                     show_default=True,
                     help="With several devices: layer = each runs a share of the layers; none = only the -mg one "
                          "(row is not supported)."),
        click.option("-ts", "--tensor-split", "tensor_split", default=None, metavar="N0,N1,...",
                     help="Share of the layers each device runs, e.g. 3,1 (default: by VRAM budget, else free VRAM)."),
        click.option("-mg", "--main-gpu", "main_gpu", type=count(0), default=None,
                     help="Device (index into --device) holding the output and sampling; with -sm layer it runs "
                          "the last layers (default: the last device), with -sm none the only one (default 0)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def parse_tensor_split(value: str | None, sep: str = ",") -> tuple[float, ...] | None:
    """-ts 3,1 as proportions: finite, none negative, not all 0."""
    if value is None:
        return None
    try:
        shares = tuple(float(v) for v in str(value).split(sep))
    except ValueError:
        shares = ()
    if not shares or not all(0 <= s < math.inf for s in shares) or not any(shares):
        raise click.BadParameter(f"{value!r}: give one proportion (a number 0 or more, not all 0) per device, "
                                 f"e.g. 3{sep}1", param_hint="-ts")
    return shares


def vram_budgets(value: str | None):
    """--vram-budget 8G (every device) or 8G,8G,4G (one per device)."""
    from vkrt.units import parse_size
    if value is None:
        return None
    sizes = tuple(parse_size(v.strip(), "--vram-budget") for v in str(value).split(","))
    return sizes[0] if len(sizes) == 1 else sizes


def open_devices(device: str | None):
    """The DeviceGroup --device names (one device when not given)."""
    from vkrt.device.group import DeviceGroup, parse_device_list
    from vkrt.errors import ConfigError, TuningOverrideError
    try:
        return DeviceGroup(parse_device_list(device), settings=settings())
    except TuningOverrideError as exc:
        raise click.ClickException(str(exc)) from None
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--device") from None


def check_device_options(model_kw: dict) -> None:
    """Refuse a bad --device list, -ts, -sm or --vram-budget before anything is loaded."""
    from vkrt.device.group import parse_device_list
    from vkrt.errors import ConfigError
    try:
        devices = parse_device_list(model_kw.get("device"))
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--device") from None
    options = engine_options(**{k: v for k, v in model_kw.items() if k not in ("device", "model")})
    try:
        options.budgets(len(devices) if devices else 1)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def engine_options(*, n_ctx, n_batch, n_ubatch, flash_attn, n_gpu_layers, no_mmap, no_pin, kv_type, n_cpu_moe=None,
                   vram_budget=None, expert_cache="auto", progress=None, n_seq_max=1, n_checkpoints=0,
                   split_mode="layer", tensor_split=None, main_gpu=None, pipeline_steps=False, cpu_experts="auto",
                   cpu_moe_threads=None, link_bandwidth=None, cache_type_k=None, cache_type_v=None, mmproj=None,
                   verify_tokens=0):
    """The library's EngineOptions from the CLI's model options (`verify_tokens`: the most tokens
    a speculative step takes, verify_tokens())."""
    from vkrt.engine.options import EngineOptions
    from vkrt.errors import ConfigError
    try:
        return EngineOptions(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, flash_attn=flag01(flash_attn),
                             n_gpu_layers=n_gpu_layers, mmap=not no_mmap, pin=False if no_pin else None,
                             kv_type=kv_type, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                             n_cpu_moe=n_cpu_moe, vram_budget=vram_budgets(vram_budget),
                             expert_cache=cache_size(expert_cache), n_seq_max=n_seq_max, n_checkpoints=n_checkpoints,
                             progress=progress, split_mode=split_mode, tensor_split=parse_tensor_split(tensor_split),
                             main_gpu=main_gpu, pipeline_steps=pipeline_steps, cpu_experts=cpu_experts,
                             cpu_moe_threads=cpu_moe_threads, link_bandwidth=link_bandwidth, mmproj=mmproj,
                             verify_tokens=verify_tokens)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def open_engine(devices, *, model=None, **options):
    """Open the model (default: the embedded one) and its engine from the CLI's model options on
    `devices` (a DeviceGroup, or one Device); `n_seq_max` sequences at once (the server's
    slots), with `n_checkpoints` recurrent-state checkpoints for models that keep a recurrent
    state."""
    from vkrt.engine.options import open_engine as open_with
    options.pop("device", None)   # --device: already opened as `devices`
    return open_with(devices, model or default_model(), engine_options(**options))


def check_settings(settings):
    """`settings`, once each layer that owns a variable's words has checked them: the device's
    architecture names (VKRT_ARCH) and tuning fields (VKRT_TUNE), the model's fusions (VKRT_FUSE).
    A bad value raises the error naming it that opening a device or building a model would, so
    the command stops at start with that one line. A layer is imported only where its variable
    is set (the CLI starts without Vulkan)."""
    from vkrt.settings import Settings
    if settings.arch:
        from vkrt.device.architecture import parse_arch
        parse_arch(settings.arch)
    if settings.tune:
        from vkrt.device.tune import parse_tune
        parse_tune(settings.tune)
    if settings.fuse != Settings().fuse:
        from vkrt.model.fuse import enabled
        enabled(settings.fuse)
    return settings


def settings():
    """The Settings `vkrt` read from the environment at start (the command group's object);
    read (and checked) now when a command runs outside the group (tests invoking one command)."""
    from vkrt.settings import Settings
    ctx = click.get_current_context(silent=True)
    found = ctx.find_root().obj if ctx is not None else None
    return found if isinstance(found, Settings) else check_settings(Settings.from_env())


# --spec-type values: vkrt's names and llama-server b10434's
SPEC_TYPE_NAMES = {"none": "none", "ngram": "ngram", "ngram-simple": "ngram", "draft": "draft",
                   "draft-simple": "draft", "mtp": "mtp", "draft-mtp": "mtp"}

def spec_options(f):
    """--spec-type, --draft-max, --draft-min, --draft-p-min, -md, -ngld, -devd: speculative
    decoding, named as llama-server's (decorator)."""
    opts = [
        click.option("--spec-type", "spec_type", type=click.Choice(list(SPEC_TYPE_NAMES)), default=None,
                     help="Speculative decoding: ngram (also ngram-simple) = draft by looking the last tokens up in "
                          "the prompt and output; draft (draft-simple) = a draft model (-md); mtp (draft-mtp) = the "
                          "model's own MTP block (Qwen3.5/3.6, Qwen3-Next files that carry one); none = off "
                          "(default; draft when -md is given)."),
        click.option("--draft-max", "--spec-draft-n-max", "--draft", "--draft-n", "draft_max", type=count(1, 256),
                     default=16, show_default=True, help="Most draft tokens a step verifies."),
        click.option("--draft-min", "--spec-draft-n-min", "draft_min", type=count(0, 256), default=0,
                     show_default=True, help="Fewest draft tokens worth a verification step (fewer: a plain step)."),
        click.option("--draft-p-min", "--spec-draft-p-min", "draft_p_min", type=FiniteFloat(min=0, max=1),
                     default=0.75, show_default=True,
                     help="A draft model or MTP head stops drafting below this probability of its best token."),
        click.option("-md", "--model-draft", "--spec-draft-model", "model_draft", type=click.Path(dir_okay=False),
                     default=None, help="Draft model (GGUF, the model's vocabulary) for --spec-type draft."),
        click.option("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl", "n_gpu_layers_draft",
                     type=count(0), default=None, help="Layers of the draft model in VRAM (default: all)."),
        click.option("-devd", "--device-draft", "--spec-draft-device", "device_draft", default=None, metavar="DEV",
                     help="Device of the draft model, as --device names one (default: the model's main device)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


SPEC_KEYS = ("spec_type", "draft_max", "draft_min", "draft_p_min", "model_draft", "n_gpu_layers_draft", "device_draft")


def take_spec(kw: dict):
    """Pop the spec_options values from a command's keywords: (SpecOptions or None, the draft
    model's path, its -ngld, its --device-draft), checked here with one-line errors."""
    from vkrt.engine.speculative import SpecOptions
    from vkrt.errors import VkrtError
    spec_type, draft_max, draft_min, p_min, path, ngld, devd = (kw.pop(k) for k in SPEC_KEYS)
    spec_type = SPEC_TYPE_NAMES[spec_type] if spec_type is not None else "draft" if path is not None else "none"
    if spec_type != "draft" and (path is not None or ngld is not None or devd is not None):
        raise click.UsageError(f"-md, -ngld and -devd are for a draft model; --spec-type is {spec_type}")
    if spec_type == "draft" and path is None:
        raise click.UsageError("--spec-type draft needs a draft model: -md FILE")
    if path is not None and not os.path.isfile(path):
        raise click.BadParameter(f"{path}: no such file", param_hint="-md")
    if spec_type == "none":
        return None, None, None, None
    try:
        return SpecOptions(spec_type, draft_max=draft_max, draft_min=draft_min, p_min=p_min), path, ngld, devd
    except VkrtError as exc:
        raise click.UsageError(str(exc)) from None


def verify_tokens(spec, sequences: int = 1) -> int:
    """The most tokens a speculative step of `sequences` takes under `spec` (SpecOptions.step_tokens;
    None: 0, no speculation)."""
    return 0 if spec is None else spec.step_tokens(sequences)


def open_drafting(spec, engine, model, path, ngld, devd):
    """The command's Drafting (None without speculation); the draft model goes on --device-draft
    (devices the Drafting owns) or the model's main device."""
    from vkrt.engine.drafting import open_drafting as open_with
    from vkrt.errors import ConfigError, GGUFError
    if spec is None:
        return None
    group = open_devices(devd) if devd is not None else None
    try:
        drafting = open_with(spec, model, engine, group.devices[0] if group is not None else engine.device, path, ngld)
    except BaseException as exc:
        if group is not None:
            group.close()
        if isinstance(exc, (ConfigError, GGUFError)):
            raise click.UsageError(str(exc)) from None
        raise
    drafting.devices = group
    return drafting
