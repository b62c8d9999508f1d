"""Losses: gradients (numeric + autograd), parity with torch.nn.functional, stability, bad input."""

import pytest
import torch
import torch.nn.functional as F

from gradcheck import check_loss
from losses import CrossEntropyLoss, MSELoss
from tests.conftest import assert_all_pass

f64 = torch.float64


def torch_ce(logits, target, reduction, smoothing):
    x = logits.clone().requires_grad_()
    loss = F.cross_entropy(x, target, reduction=reduction, label_smoothing=smoothing)
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("n,c", [(1, 3), (5, 4), (32, 10)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("kind", ["index", "probs"])
def test_cross_entropy_matches_torch_and_gradchecks(n, c, reduction, smoothing, kind):
    torch.manual_seed(n + c)
    logits = torch.randn(n, c, dtype=f64) * 3
    target = torch.randint(0, c, (n,)) if kind == "index" else torch.softmax(torch.randn(n, c, dtype=f64), 1)
    crit = CrossEntropyLoss(reduction, label_smoothing=smoothing)
    loss = crit(logits, target)
    grad = crit.backward()
    ref_loss, ref_grad = torch_ce(logits, target, reduction, smoothing)
    assert loss.shape == ()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)
    if n <= 5:
        assert_all_pass(check_loss(CrossEntropyLoss(reduction, label_smoothing=smoothing), logits, target))


def test_cross_entropy_unnormalised_probability_target():
    """Targets that do not sum to 1 still get torch's gradient (softmax * sum(q) - q)."""
    logits, target = torch.randn(3, 4, dtype=f64), torch.rand(3, 4, dtype=f64)
    crit = CrossEntropyLoss()
    loss = crit(logits, target)
    ref_loss, ref_grad = torch_ce(logits, target, "mean", 0.0)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(crit.backward(), ref_grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, f64])
def test_cross_entropy_is_stable_for_huge_logits(dtype):
    logits = torch.tensor([[1e4, -1e4, 0.0], [-1e4, 1e4 - 1.0, 1e4]], dtype=dtype)
    target = torch.tensor([0, 1])
    crit = CrossEntropyLoss()
    loss = crit(logits, target)
    grad = crit.backward()
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    # row 0: loss ~0 (e^-1e4 underflows); row 1: lse - (1e4 - 1) = 1 + log(1 + e^-1)
    expected = (0.0 + 1.0 + torch.log1p(torch.exp(torch.tensor(-1.0, dtype=f64))).item()) / 2
    tol = 1e-12 if dtype == f64 else 2e-3  # float32 cannot resolve better than ~1e-3 at magnitude 1e4
    assert abs(loss.item() - expected) < tol
    torch.testing.assert_close(grad, torch_ce(logits, target, "mean", 0.0)[1])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64])
def test_cross_entropy_accepts_any_integer_target_dtype(dtype):
    logits, target = torch.randn(4, 3, dtype=f64), torch.tensor([0, 2, 1, 1])
    crit = CrossEntropyLoss()
    loss = crit(logits, target.to(dtype))
    ref_loss, ref_grad = torch_ce(logits, target, "mean", 0.0)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(crit.backward(), ref_grad, rtol=1e-12, atol=1e-15)


def test_cross_entropy_dout_scales_gradient():
    logits, target = torch.randn(4, 3, dtype=f64), torch.tensor([0, 1, 2, 1])
    crit = CrossEntropyLoss()
    crit(logits, target)
    g1 = crit.backward()
    crit(logits, target)
    torch.testing.assert_close(crit.backward(2.5), 2.5 * g1)


@pytest.mark.parametrize("shape", [(1, 4), (5, 3), (2, 3, 4)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_mse_matches_torch_and_gradchecks(shape, reduction):
    torch.manual_seed(len(shape))
    x, y = torch.randn(*shape, dtype=f64), torch.randn(*shape, dtype=f64)
    crit = MSELoss(reduction)
    loss = crit(x, y)
    grad = crit.backward()
    xr = x.clone().requires_grad_()
    ref = F.mse_loss(xr, y, reduction=reduction)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, xr.grad, rtol=1e-12, atol=1e-15)
    assert_all_pass(check_loss(MSELoss(reduction), x, y))


# -- bad input -----------------------------------------------------------------------------------------


def test_target_out_of_range():
    with pytest.raises(ValueError, match=r"target contains class 3, outside \[0, 2\] for 3 classes"):
        CrossEntropyLoss()(torch.randn(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="target contains class -1"):
        CrossEntropyLoss()(torch.randn(2, 3), torch.tensor([-1, 0]))


def test_target_wrong_length():
    with pytest.raises(ValueError, match=r"integer class indices of shape \(2,\), got torch.int64 of shape \(3,\)"):
        CrossEntropyLoss()(torch.randn(2, 3), torch.tensor([0, 1, 2]))


def test_float_target_of_wrong_shape():
    with pytest.raises(ValueError, match=r"floating-point target holds class probabilities .* \(2, 3\), got \(2,\)"):
        CrossEntropyLoss()(torch.randn(2, 3), torch.tensor([0.0, 1.0]))


def test_logits_shapes_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"unbatched logits of shape \(3,\) need one class index"):
        CrossEntropyLoss()(torch.randn(3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"logits must have shape \(N, C\) with N >= 1 \(or \(N, C, d1, ...\)"):
        CrossEntropyLoss()(torch.tensor(1.0), torch.tensor(0))
    with pytest.raises(ValueError, match=r"logits of shape \(2, 3, 4\) need class indices of shape \(2, 4\)"):
        CrossEntropyLoss()(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long))


def test_bad_reduction_and_smoothing():
    with pytest.raises(ValueError, match=r"reduction must be one of \('mean', 'sum'\), got 'avg'"):
        CrossEntropyLoss("avg")
    with pytest.raises(ValueError, match=r"label_smoothing must be a probability in \[0, 1\], got 1.5"):
        CrossEntropyLoss(label_smoothing=1.5)
    with pytest.raises(ValueError, match="reduction must be one of"):
        MSELoss("none")


def test_mse_shape_mismatch_is_an_error_not_a_broadcast():
    with pytest.raises(ValueError, match=r"input has shape \(4, 1\) but target has shape \(4,\)"):
        MSELoss()(torch.randn(4, 1), torch.randn(4))


@pytest.mark.parametrize("crit", [CrossEntropyLoss(), MSELoss()])
def test_loss_backward_before_forward(crit):
    with pytest.raises(RuntimeError, match="backward called before forward"):
        crit.backward()


# -- ignore_index and (N, C, d1, ...) logits, as torch.nn.CrossEntropyLoss ---------------------------------


def _torch_ce(logits, target, **kw):
    z = logits.clone().requires_grad_(True)
    loss = torch.nn.CrossEntropyLoss(**kw)(z, target)
    loss.backward()
    return loss.detach(), z.grad


@pytest.mark.parametrize("shape", [(6, 5), (2, 5, 3), (2, 5, 3, 2), (5,)])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"reduction": "sum"},
        {"label_smoothing": 0.2},
        {"ignore_index": 1},
        {"ignore_index": -1, "label_smoothing": 0.1},
        {"ignore_index": 2, "reduction": "sum"},
    ],
)
def test_class_targets_match_torch_with_ignore_index_and_positions(shape, kw):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    tshape = (shape[0], *shape[2:]) if len(shape) > 1 else ()
    target = torch.randint(0, 5, tshape, generator=g)
    if "ignore_index" in kw and target.numel() > 1:
        target.view(-1)[::2] = kw["ignore_index"]  # half the positions ignored (-1 lies outside [0, C))
    crit = CrossEntropyLoss(**kw)
    loss = crit(logits, target)
    dz = crit.backward()
    ref_loss, ref_dz = _torch_ce(logits, target, **kw)
    assert dz.shape == logits.shape
    torch.testing.assert_close(loss, ref_loss, rtol=1e-13, atol=0, equal_nan=True)  # an unbatched ignored target: nan
    torch.testing.assert_close(dz, ref_dz, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("ignore_index", [-100, 0, 2, 4, 5])
@pytest.mark.parametrize("present", [False, True])
def test_ignore_index_inside_or_outside_the_targets_span_matches_torch(ignore_index, present):
    """The range check reads the smallest and largest class first: an ignore_index outside that span cannot be
    ignoring anything, one inside it (at an edge too) may or may not; each case equals torch's."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 5, generator=g, dtype=torch.float64)
    target = torch.tensor([1, 3, 1, 3, 2, 3, 1, 1])  # span [1, 3]
    if present:
        target[5] = ignore_index
    crit = CrossEntropyLoss(ignore_index=ignore_index)
    if present and not 0 <= ignore_index < 5:  # only an ignored position may hold an out-of-range value
        target[6] = 7
        with pytest.raises(
            ValueError,
            match=rf"target contains class 7, outside \[0, 4\] for 5 classes "
            rf"\(ignore_index={ignore_index}\)",
        ):
            crit(logits, target)
        target[6] = 1
    loss, dz = crit(logits, target), crit.backward()
    ref_loss, ref_dz = _torch_ce(logits, target, ignore_index=ignore_index)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-13, atol=0)
    torch.testing.assert_close(dz, ref_dz, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match=r"target contains class -3, outside \[0, 4\]"):
        crit(logits, torch.tensor([1, -3, 2, 2, 2, 2, 2, 2]))


def test_probability_targets_over_positions_match_torch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    target = torch.softmax(torch.randn(2, 4, 3, generator=g, dtype=torch.float64), 1)
    crit = CrossEntropyLoss(label_smoothing=0.1)
    loss, dz = crit(logits, target), crit.backward()
    ref_loss, ref_dz = _torch_ce(logits, target, label_smoothing=0.1)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-13, atol=0)
    torch.testing.assert_close(dz, ref_dz, rtol=1e-12, atol=1e-15)


def test_every_target_ignored_gives_what_torch_gives():
    logits = torch.randn(3, 4, dtype=torch.float64)
    target = torch.full((3,), -100)
    crit = CrossEntropyLoss()
    loss, dz = crit(logits, target), crit.backward()
    ref_loss, ref_dz = _torch_ce(logits, target)
    assert torch.isnan(loss) and torch.isnan(ref_loss)
    assert torch.equal(dz, ref_dz) and not dz.any()
    crit = CrossEntropyLoss(reduction="sum")
    assert crit(logits, target).item() == 0.0 and not crit.backward().any()


def test_out_of_range_class_is_named_even_beside_ignored_ones():
    with pytest.raises(
        ValueError, match=r"target contains class 7, outside \[0, 3\] for 4 classes \(ignore_index=-1\)"
    ):
        CrossEntropyLoss(ignore_index=-1)(torch.randn(3, 4), torch.tensor([-1, 7, 0]))
    with pytest.raises(ValueError, match="ignore_index must be an int"):
        CrossEntropyLoss(ignore_index=1.5)


@pytest.mark.parametrize("crit", [CrossEntropyLoss(), MSELoss()])
def test_backward_starts_from_one_by_default_and_says_so(crit):
    """``crit.backward()`` is ``crit.backward(1.0)``, and the signature help() shows says it."""
    import inspect

    assert inspect.signature(type(crit).backward).parameters["dout"].default == 1.0
    x = torch.randn(3, 4, dtype=f64)
    y = torch.tensor([0, 3, 1]) if isinstance(crit, CrossEntropyLoss) else torch.randn(3, 4, dtype=f64)
    crit(x, y)
    g1 = crit.backward()
    crit(x, y)
    assert torch.equal(crit.backward(1.0), g1)
    with pytest.raises(TypeError, match="dout .* must be a number or a one-element tensor"):
        crit(x, y)
        crit.backward("1")
