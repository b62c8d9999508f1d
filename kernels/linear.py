"""Linear's and Embedding's backwards, arranged for speed: the weight gradient added into ``.grad`` in place.

layers/linear.py writes dx = dout @ weight, dweight = dout.T @ x, dbias = dout.sum(0); layers/embedding.py adds
dout's rows into a zero table at their ids.  The same numbers here, without the temporaries:

    linear_backward     dweight as ``Product(dout.T, x)``: one GEMM added into ``.grad`` with ``addmm_`` (and not
                        computed at all for a frozen weight); dx only when asked for (the first layer of a network)
    embedding_backward  dweight as ``IndexAdd(ids, rows)``: ``index_add_`` straight into ``.grad``
"""

from __future__ import annotations

from torch import Tensor

from .gradients import IndexAdd, Product


def linear_backward(
    dout: Tensor, x: Tensor, weight: Tensor, *, needs_dx: bool
) -> tuple[Tensor | None, Product, Tensor]:
    """dout (N, H), x (N, D), weight (H, D) -> (dx (N, D) or None, dweight (H, D) as a Product, dbias (H,))."""
    dx = dout @ weight if needs_dx else None
    return dx, Product(dout.t(), x), dout.sum(0)


def embedding_backward(dout: Tensor, idx: Tensor) -> IndexAdd:
    """dout (P, D) rows, idx (P,) their ids -> dweight as an IndexAdd: row idx[p] += dout[p], repeats adding up."""
    return IndexAdd(idx, dout)
