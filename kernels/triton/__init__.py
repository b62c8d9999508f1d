"""Hand-written Triton kernels for the GPU, forward and backward, each derived in its module's docstring from its
layer's formula (docs/kernels-triton.md): FlashAttention-2, layer norm, GELU, softmax with cross-entropy, AdamW.

Each kernel has a plain function around it, tensors in and tensors out, for the layers' kernel dispatch to call
on CUDA tensors (on a CPU, Triton's interpreter runs them when TRITON_INTERPRET=1 was set before their first
import: correctness only).  The math returns, the machinery accumulates: the backward functions return new
gradient tensors and the caller adds them where they belong.

Nothing here imports Triton until one of these functions is first asked for, so ``import kernels.triton``
works where Triton is not installed; ``available()`` says whether it is.

    from kernels import triton as tk
    if tk.available() and x.is_cuda:
        out = tk.gelu_forward(x)
"""

from __future__ import annotations

import importlib
import importlib.util

FAMILIES = {  # module -> the functions it exports
    "attention": ("flash_attention_forward", "flash_attention_backward"),
    "layernorm": ("layer_norm_forward", "layer_norm_backward"),
    "gelu": ("gelu_forward", "gelu_backward"),
    "cross_entropy": ("cross_entropy_forward", "cross_entropy_backward", "cross_entropy_forward_backward"),
    "adamw": ("adamw_step",),
}
_HOME = {name: module for module, names in FAMILIES.items() for name in names}
__all__ = ["available", *_HOME]


def available() -> bool:
    """Whether Triton can be imported here (it says nothing of a GPU: see torch.cuda.is_available())."""
    return importlib.util.find_spec("triton") is not None


def __getattr__(name: str):
    """A kernel function, its family's module imported (and Triton with it) on first use."""
    if name in _HOME:
        if not available():
            raise ImportError(
                f"kernels.triton.{name} needs Triton, which is not installed here (pip install triton;"
                f" torch's CUDA wheels bring it)"
            )
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    if name in FAMILIES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
