"""The fast paths behind the layers' textbook backwards, one module per family of layers.

Each layer's own file is the textbook: its backward is the formula a learner writes (``layers/linear.py``'s
``dx = dout @ weight``, ``dweight = dout.T @ x``, ``dbias = dout.sum(0)``).  Speed lives here, behind it -- the same
formulas arranged for the machine: in-place chains on as few buffers as possible, the weight gradient added into
``.grad`` without a temporary, exp2 instead of exp, the convolution's weight gradient in the form that suits its
shape, FlashAttention's blocks, the recurrent layers' prepacked weights and factor blocks, the norms' backwards
compiled into one pass.  A layer's backward calls its family's kernel where one applies:

    if kernels.enabled():                                   # the same numbers, faster: kernels/elementwise.py
        return elementwise.relu_backward(dout, saved.out)
    mask = saved.out > 0
    ...

Every kernel is tied by a test to the textbook it replaces (``tests/test_kernels.py`` and the layers' tests:
float64 to 1e-12, each other dtype within its rounding).  On by default; ``HANDGRAD_KERNELS=off`` in the environment, or
the context ``kernels.disabled()``, runs every layer's textbook instead (slower, the same numbers to rounding), and
``kernels.enabled()`` says which is on.  ``docs/kernels.md`` says how each kernel follows from its layer's formula
and how to add one.

    elementwise   ReLU's mask as sign(out), GELU's backward in exp2 on as few buffers as possible
    linear        the Linear's weight gradient added into .grad in place, dx skipped when not asked for
    norms         LayerNorm's and BatchNorm's backward in place, in one buffer; BatchNorm's forward in C++
    softmax       cross-entropy's gradient rounded as autograd rounds it
    convolution   the convolution's input gradient as a transposed convolution, its weight gradient in three
                  forms by shape; max pooling through the channels-last kernel, ReLU -> MaxPool2d's backward as one
    attention     FlashAttention: keys in blocks, an online softmax, no (L, S) matrix kept
    recurrent     backpropagation through time with prepacked weights, out= buffers and factor blocks
    optimizers    parameters that tile one block of memory updated as one
    cpp           C++ kernels, built on first use: LayerNorm's, GELU's and cross-entropy's backwards, the LSTM's
                  and GRU's gates, max pooling's backward, attention, and the SGD/Adam/AdamW steps in one pass
                  each (``HANDGRAD_CPP_KERNELS=off``: these alone off)
    compiled      the norms' and GELU's backward compiled by Inductor into one loop (opt-in: ``compiled.enable()``)
    gradients     the forms a kernel gives a parameter gradient in (``Product``, ``IndexAdd``), for the template
"""

from __future__ import annotations

import contextlib

from .switch import Switch

_switch = Switch("kernels", "HANDGRAD_KERNELS")
_from_environment = _switch.from_environment


def enabled() -> bool:
    """Whether the layers call the kernels (True, the default) or run their textbook backwards."""
    return _switch.enabled()


def enable(on: bool = True) -> None:
    """Turn the kernels on (or, with False, off) for this process, whatever HANDGRAD_KERNELS said."""
    _switch.enable(on)


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within: every layer runs its textbook backward (and forward); as before after."""
    return _switch.disabled()
