"""The order of the sampler chain (llama.cpp's `samplers` / `--samplers` / `--sampling-seq`): names
or one letter each, canonical names out, with the checks vkrt's chain needs."""

from __future__ import annotations

from ..errors import ConfigError

# llama.cpp's default chain (common_params_sampling::samplers)
DEFAULT_ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
# the ones applied before any cut: on the GPU, to the whole row, ahead of the top-k candidates
ADJUSTING = ("penalties", "dry")
# llama.cpp's names and aliases (common_sampler_types_from_names) and letters (..._from_chars)
ALIASES = {
    "penalties": "penalties", "dry": "dry", "top_n_sigma": "top_n_sigma", "top-n-sigma": "top_n_sigma",
    "top_k": "top_k", "top-k": "top_k", "typ_p": "typ_p", "typ-p": "typ_p", "typ": "typ_p", "typical_p": "typ_p",
    "typical-p": "typ_p", "typical": "typ_p", "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p",
    "min_p": "min_p", "min-p": "min_p", "xtc": "xtc", "temperature": "temperature", "temp": "temperature",
    "infill": "infill",
}
LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
           "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill"}


def parse_order(value, what: str = "samplers", letters: bool = True) -> tuple[str, ...]:
    """A sampler chain from a list of names, or a string: letters (llama-server's string form,
    --sampling-seq, e.g. "edkypmxt"), or with letters=False names separated by ';' (llama-cli's
    --samplers). Unknown names, repeats, infill (a fill-in-the-middle sampler vkrt does not have)
    and penalties or DRY after another sampler (vkrt applies them to the whole row first) are
    refused with a ConfigError naming `what`."""
    if isinstance(value, str):
        text = value.strip()
        if not letters:
            names = [n.strip() for n in text.split(";") if n.strip()]
        else:
            unknown = sorted({c for c in text if c not in LETTERS})
            if unknown:
                raise ConfigError(f"{what} {value!r}: unknown sampler letter(s) {', '.join(unknown)} "
                                  f"(letters: {''.join(LETTERS)})")
            names = [LETTERS[c] for c in text]
    elif isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value):
        names = list(value)
    else:
        raise ConfigError(f"{what} must be a list of sampler names or a string of them, got {value!r}")
    order = []
    for name in names:
        canon = ALIASES.get(name.strip().lower())
        if canon is None:
            raise ConfigError(f"{what}: unknown sampler {name!r} (known: {', '.join(DEFAULT_ORDER)})")
        if canon == "infill":
            raise ConfigError(f"{what}: the infill sampler is not supported by vkrt (use /infill, which samples "
                              "with the usual chain)")
        if canon in order:
            raise ConfigError(f"{what}: {canon!r} is named twice")
        order.append(canon)
    cut = next((i for i, n in enumerate(order) if n not in ADJUSTING), len(order))
    late = [n for n in order[cut:] if n in ADJUSTING]
    if late:
        raise ConfigError(f"{what}: {', '.join(late)} must come before every other sampler (vkrt applies penalties "
                          "and DRY to the whole row of logits first)")
    return tuple(order)
