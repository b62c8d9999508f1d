"""The case family of the mixture of experts: top-2 with tokens dropped past capacity, Mixtral's normalised gates,
and Switch's top-1.  The auxiliary loss's gradient (aux_coef > 0) is outside what check_layer differentiates,
sum(y * dout): tests/test_moe.py differences it on its own."""

from __future__ import annotations

from layers.moe import MixtureOfExperts

from .make import F64, Case, layer_case


def mixture() -> dict[str, list[Case]]:
    moe = lambda **kw: lambda: MixtureOfExperts(3, 4, 3, aux_coef=0.0, dtype=F64, **kw)  # noqa: E731
    return {
        "mixtureofexperts": [
            layer_case("MixtureOfExperts(top_k=2,capacity_factor=0.75)", moe(top_k=2, capacity_factor=0.75), 8, 3),
            layer_case(
                "MixtureOfExperts(top_k=2,normalize=True)", moe(top_k=2, capacity_factor=4.0, normalize=True), 2, 3, 3
            ),
            layer_case("MixtureOfExperts(top_k=1)", moe(top_k=1, capacity_factor=1.0), 6, 3),
        ],
    }
