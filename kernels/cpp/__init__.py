"""The C++ kernels: the layers' fused forwards and backwards on the CPU, built on first use and cached.

Each ``.cpp`` file here is one family's kernels, its comment deriving each from its layer's textbook formula
(docs/kernels.md has the same derivations side by side):

    norms.cpp        LayerNorm and BatchNorm, forward and backward: a row (a channel) in a few passes while in cache
    elementwise.cpp  GELU's backward, "none" (Phi read off the output, phi in exp2) and "tanh"
    softmax.cpp      softmax with cross-entropy: log p and the loss in one pass a row; the gradient in one more
    optimizers.cpp   SGD with momentum, Adam and AdamW: each parameter read and written once per step
    recurrent.cpp    the LSTM's and the GRU's gates, one time step forward and backward, in one pass each
    pool.cpp         max pooling's backward: each plane's gradient scattered to its argmaxes while in cache
    attention.cpp    attention without masks or dropout (causal or not): FlashAttention-2's blocks, one gemm each

Called by the layers (through kernels/norms.py, kernels/elementwise.py, kernels/softmax.py, kernels/recurrent/bptt.py,
kernels/convolution.py, kernels/attention.py, optimizers/sgd.py and adam.py): LayerNorm's backward, BatchNorm's
forward and backward in training (its statistics this process's own), GELU's backward,
cross-entropy's backward (class indices, no ignored position), the LSTM's and GRU's gates in each step forward and
backward, max pooling's backward, attention's forward and backward (no mask, bias or dropout), the
SGD-with-momentum and Adam/AdamW steps.  LayerNorm's forward stays ATen's ``native_layer_norm`` (already one fused
pass, as fast as this one); it and the cross-entropy forward are built and tested (tests/test_kernels_cpp.py)
but no layer calls them.

They are ``torch.library`` operators in the ``handgrad`` namespace (``ops.cpp`` has their schemas): defined and
implemented in C++ (``TORCH_LIBRARY``), each with a fake implementation registered here (``register_fake``), so
``torch.compile(fullgraph=True)`` traces a step that calls them as one graph, and ``torch.library.opcheck`` checks
them (tests/test_kernels_cpp.py).  Eager calls go through the dispatcher from C++, a few microseconds each.

Built with ``torch.utils.cpp_extension.load`` the first time a kernel is asked for, into ``TORCH_EXTENSIONS_DIR``
(default: torch's, ~/.cache/torch_extensions/<python>_<cuda>), with the vector width torch itself uses on
this CPU (``torch.backends.cpu.get_cpu_capability()``, which names the build); later processes load the built
library in about a second.  A build says so in one line on stderr, with about how long it takes.
Where there is no C++ compiler or ninja, or the build fails, one warning says so and every layer runs the eager
kernels of kernels/ instead (the same numbers to rounding).

``usable(*tensors)`` says whether a kernel may run on its tensors: the kernels on (``kernels.enabled()``) and the
C++ ones too (``enabled()``; ``HANDGRAD_CPP_KERNELS=off``, ``enable(False)`` or ``disabled()`` turn them off
alone), CPU tensors of one dtype, float32 or float64, and nothing for autograd to record (the operators have no
derivative of their own: gradcheck's autograd oracle records the eager math instead).  ``ops`` is
``torch.ops.handgrad``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor

from .. import enabled as kernels_on
from ..switch import Switch

HERE = Path(__file__).resolve().parent
SOURCES = (
    "ops.cpp",
    "norms.cpp",
    "elementwise.cpp",
    "softmax.cpp",
    "optimizers.cpp",
    "recurrent.cpp",
    "pool.cpp",
    "attention.cpp",
)
HEADERS = ("common.h",)
_DTYPES = (torch.float32, torch.float64)
# torch's own vector width on this CPU -> the compiler flags that select it in ATen's vector headers
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
}

_switch = Switch("kernels.cpp", "HANDGRAD_CPP_KERNELS")
_from_environment = _switch.from_environment
_loaded: bool | None = None  # None: not tried yet; True: the operators are registered; False: no build here


def enabled() -> bool:
    """Whether the kernels of kernels/ call the C++ kernels where they apply (True, the default)."""
    return _switch.enabled()


def enable(on: bool = True) -> None:
    """Turn the C++ kernels on (or, with False, off) for this process; the rest of kernels/ is unaffected."""
    _switch.enable(on)


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within: the eager kernels of kernels/ run where a C++ one would; as before after."""
    return _switch.disabled()


def usable(*tensors: Tensor) -> bool:
    """Whether a C++ kernel may run on ``tensors`` (the module docstring's rule); builds the kernels on first use."""
    if not (_switch.enabled() and kernels_on()):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):  # autograd would record this
        return False
    dtype = tensors[0].dtype
    if dtype not in _DTYPES or any(t.device.type != "cpu" or t.dtype != dtype for t in tensors):
        return False
    if torch.compiler.is_compiling():  # traced: only a library already loaded (no build inside a trace)
        return bool(_loaded)
    return available()


def available() -> bool:
    """Whether the operators are registered here: built (or loaded from the cache) on the first call."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
    return _loaded


ops = torch.ops.handgrad


def capability() -> str:
    """The vector width the kernels are built for: torch's own on this CPU (AVX512, AVX2, or DEFAULT)."""
    cap = torch.backends.cpu.get_cpu_capability()
    return cap if cap in _CAPABILITY_FLAGS else "DEFAULT"


def build_name() -> str:
    """The extension's name, and its folder under TORCH_EXTENSIONS_DIR: one build per vector width."""
    return f"handgrad_cpu_kernels_{capability().lower()}"


def _flags() -> list[str]:
    cap = capability()
    return [
        "-O3",
        "-fopenmp",  # at::parallel_for's threads: the same OpenMP runtime torch loaded (libgomp.so.1)
        "-ffp-contract=off",  # a * b + c rounded twice unless a kernel writes fmadd: the eager kernels' rounding
        *_CAPABILITY_FLAGS.get(cap, []),
        f"-DCPU_CAPABILITY={cap}",
        f"-DCPU_CAPABILITY_{cap}",
    ]


def _say(message: str) -> None:
    print(f"handgrad: {message}", file=sys.stderr, flush=True)


def _built(folder: Path) -> bool:
    """Whether a library newer than every source is in ``folder`` (then load() only loads it)."""
    library = folder / f"{build_name()}.so"
    if not library.exists():
        return False
    newest = max((HERE / name).stat().st_mtime for name in (*SOURCES, *HEADERS))
    return library.stat().st_mtime >= newest


def _load() -> bool:
    """Build (or load from the cache) the library and register the fake implementations: True, or False with one
    warning that says why."""
    compiler = os.environ.get("CXX", "c++")
    try:
        logger = logging.getLogger("torch.utils.cpp_extension")
        level = logger.level
        logger.setLevel(logging.ERROR)  # its import warns that no CUDA is found: this build needs none
        try:
            from torch.utils import cpp_extension
        finally:
            logger.setLevel(level)
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler ({compiler!r} is not on PATH)")
        if not cpp_extension.is_ninja_available():
            raise RuntimeError("ninja is not installed (pip install ninja)")
        root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension._get_build_directory("", False))
        folder = root / build_name()
        folder.mkdir(parents=True, exist_ok=True)
        building = not _built(folder)
        start = time.perf_counter()
        if building:
            _say(
                f"building the C++ kernels (kernels/cpp/, {len(SOURCES)} files, {capability()}) into {folder}: "
                f"up to 2 minutes on 2 cores, once; later runs load them from there"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (its own notes on the compiler's version and ABI)
            cpp_extension.load(
                name=build_name(),
                sources=[str(HERE / name) for name in SOURCES],
                extra_cflags=_flags(),
                extra_ldflags=["-fopenmp"],
                build_directory=str(folder),
                with_cuda=False,
                is_python_module=False,
                verbose=False,
            )
        if building:
            _say(f"built the C++ kernels in {time.perf_counter() - start:.0f} s")
    except Exception as e:  # no compiler, no ninja, a failed build: the eager kernels run, said once
        lines = str(e).strip().splitlines()
        errors = [line for line in lines if "error:" in line]  # a failed build: the compiler's first error
        message = errors[:1] or lines[-1:]
        warnings.warn(
            f"handgrad: the C++ kernels are not available here ({type(e).__name__}: "
            f"{message[0] if message else ''}); the eager kernels of kernels/ run instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    from . import fakes  # noqa: F401  (registers the shape-only implementations torch.compile traces)

    return True
