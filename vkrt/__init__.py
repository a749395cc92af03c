"""vkrt: a Vulkan compute runtime in Python for GGUF language models.

    import vkrt
    with vkrt.load("model.gguf") as llm:
        print(llm.generate("Hello", max_tokens=16))
"""

__version__ = "0.1.0"


def load(model=None, **kwargs):
    """Open a GGUF model: see vkrt.llm.load."""
    from .llm import load as _load
    return _load(model, **kwargs)
