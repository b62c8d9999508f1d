"""Gradient checking: every hand-written backward against central differences and torch.autograd, in float64.

``check_layer`` / ``check_loss`` (``checker.py``) check one layer or loss and return a ``GradResult`` per tensor;
``numeric.py`` has the central differences, the random projections and the relative error; ``cases/`` the
built-in cases in public families (``from checking import cases``; ``cases.FAMILIES``), which the command
``python gradcheck.py`` runs.  The cases import every layer and model, so they load only when asked for.
"""

from .checker import check_layer, check_loss
from .numeric import EPS, PROJECTIONS, RTOL, GradResult, directional_derivative, numeric_grad, rel_error

__all__ = [
    "check_layer",
    "check_loss",
    "GradResult",
    "rel_error",
    "numeric_grad",
    "directional_derivative",
    "EPS",
    "RTOL",
    "PROJECTIONS",
]
