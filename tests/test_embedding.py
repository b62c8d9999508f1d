"""Embedding: nn.Embedding's twin -- same table under one seed, same lookups, the scatter-add backward."""

import pytest
import torch
from torch import nn

from gradcheck import check_layer
from layers import Embedding, from_torch
from tests.conftest import assert_all_pass

F64 = torch.float64


@pytest.mark.parametrize("padding_idx", [None, 0, 3, -2])
def test_same_table_as_nn_embedding_under_one_seed(padding_idx):
    torch.manual_seed(5)
    ours = Embedding(7, 4, padding_idx=padding_idx)
    torch.manual_seed(5)
    theirs = nn.Embedding(7, 4, padding_idx=padding_idx)
    assert torch.equal(ours.weight, theirs.weight)
    assert ours.padding_idx == theirs.padding_idx
    assert ours.state_dict().keys() == theirs.state_dict().keys() == {"weight"}


@pytest.mark.parametrize("shape", [(5,), (2, 6), (2, 3, 4), ()])
@pytest.mark.parametrize("padding_idx", [None, 1])
def test_forward_and_scatter_add_backward_equal_autograd(shape, padding_idx):
    torch.manual_seed(0)
    ours = Embedding(6, 3, padding_idx=padding_idx, dtype=F64)
    theirs = ours.to_torch()
    idx = torch.randint(0, 6, shape)
    if idx.numel() > 2:
        idx.view(-1)[:3] = torch.tensor([2, 2, 1])  # a repeated id and the padding row
    out = ours(idx)
    ref = theirs(idx)
    assert out.shape == (*shape, 3) and torch.equal(out, ref.detach())
    dout = torch.randn_like(out)
    assert ours.backward(dout) is None  # token ids have no gradient
    ref.backward(dout)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=1e-15, atol=1e-15)
    if padding_idx is not None:
        assert not ours.weight.grad[padding_idx].any()


def test_repeated_ids_add_up_and_gradients_accumulate():
    emb = Embedding(4, 2, dtype=F64)
    idx = torch.tensor([[3, 3, 3]])
    emb(idx)
    emb.backward(torch.ones(1, 3, 2, dtype=F64))
    emb(idx)
    emb.backward(torch.ones(1, 3, 2, dtype=F64))
    assert emb.weight.grad[3].tolist() == [6.0, 6.0] and not emb.weight.grad[:3].any()


def test_gradcheck_int32_ids():
    """The padding row is left out of the ids here: its zero gradient is torch's convention, not the derivative
    of the lookup (central differences and autograd through index_select see a read row); the test above
    checks it against nn.Embedding."""
    torch.manual_seed(1)
    idx = torch.tensor([[0, 4, 4, 2], [1, 0, 2, 4]], dtype=torch.int32)
    results = check_layer(Embedding(5, 3, padding_idx=3, dtype=F64), idx)
    assert [r.tensor for r in results] == ["weight"]
    assert_all_pass(results)


def test_from_torch_and_back():
    theirs = nn.Embedding(9, 5, padding_idx=2, dtype=F64)
    ours = from_torch(theirs)
    assert isinstance(ours, Embedding) and ours.padding_idx == 2
    back = ours.to_torch()
    assert isinstance(back, nn.Embedding) and back.padding_idx == 2
    assert torch.equal(back.weight, theirs.weight)
    idx = torch.tensor([1, 2, 8])
    assert torch.equal(ours(idx), theirs(idx).detach())


def test_bad_input_is_named():
    emb = Embedding(10, 3)
    with pytest.raises(
        IndexError, match=r"index 10 is out of range for a table of 10 rows \(ids must be in \[0, 9\]\)"
    ):
        emb(torch.tensor([[1, 10]]))
    with pytest.raises(IndexError, match=r"index -1 is out of range for a table of 10 rows"):
        emb(torch.tensor([-1, 3]))
    with pytest.raises(
        ValueError, match=r"idx must hold integer token ids \(int64 or int32\), got dtype torch.float32"
    ):
        emb(torch.tensor([1.0]))
    with pytest.raises(TypeError, match="idx must be a torch.Tensor, got list"):
        emb([1, 2])
    with pytest.raises(ValueError, match=r"max_norm=1.0, sparse=True is not implemented by handgrad"):
        Embedding(4, 2, max_norm=1.0, sparse=True)
    with pytest.raises(ValueError, match=r"scale_grad_by_freq=True is not implemented"):
        from_torch(nn.Embedding(4, 2, scale_grad_by_freq=True))
    with pytest.raises(ValueError, match=r"padding_idx must be an int in \[-4, 3\] \(the table has 4 rows\), got 4"):
        Embedding(4, 2, padding_idx=4)
    with pytest.raises(ValueError, match="embedding_dim must be an int >= 1, got 0"):
        Embedding(4, 0)
    emb(torch.tensor([1]))
    with pytest.raises(ValueError, match=r"dout has shape \(2, 3\) but the forward output had shape \(1, 3\)"):
        emb.backward(torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        Embedding(3, 2).backward(torch.ones(1, 2))


@pytest.mark.usefixtures("kernels_on")
def test_the_scatter_add_goes_into_an_existing_grad_in_place():
    """The table's gradient is added into ``.grad`` where it exists (``index_add_``, no table-sized temporary): its
    storage stays, and repeated ids add up on top of what was there."""
    e = Embedding(5, 3, dtype=torch.float64)
    before = torch.randn(5, 3, dtype=torch.float64)
    e.weight.grad = before.clone()
    ptr = e.weight.grad.data_ptr()
    d = torch.randn(1, 3, 3, dtype=torch.float64)
    e(torch.tensor([[1, 1, 4]]))
    assert e.backward(d) is None
    expected = before.clone()
    expected[1] += d[0, 0]
    expected[1] += d[0, 1]
    expected[4] += d[0, 2]
    assert e.weight.grad.data_ptr() == ptr
    torch.testing.assert_close(e.weight.grad, expected, rtol=1e-15, atol=0)
