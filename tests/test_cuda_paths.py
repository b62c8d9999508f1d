"""Every path that trains on a GPU computes there what it computes on the CPU: the GPT, the recurrent layers,
multi-head attention, the compiled whole step, mixed precision with its loss scale, and train.py's text and CNN
runs. float64 to 1e-10; bfloat16 and float16 within their rounding. (Marked cuda: skipped without a device. The
float16 loss scale's overflow and recovery on a GPU: tests/test_precision.py, parametrized by device.)"""

import json

import pytest
import torch
import torch.nn.functional as F

import train
from layers import GRU, LSTM, RNN, MultiheadAttention
from losses import CrossEntropyLoss
from models import GPT, Net
from optimizers import SGD, Adam, AdamW
from tests.conftest import named_grads, train_step, write_tiny_mnist
from training.precision.master import MasterWeights

pytestmark = pytest.mark.cuda
F64 = torch.float64
CUDA = torch.device("cuda")


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| relative to the larger magnitude, floored at 1e-3; both on the CPU."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item() / max(a.abs().max().item(), b.abs().max().item(), 1e-3)


def gpt_pair(**cfg):
    torch.manual_seed(0)
    cfg = {**dict(vocab_size=41, block_size=24, n_layer=2, n_head=2, n_embd=16), **cfg}
    cpu = GPT(**cfg, dtype=F64)
    gpu = GPT(**cfg, dtype=F64)
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu.to(CUDA)


def test_gpt_float64_on_cuda_equals_cpu_over_three_adamw_steps():
    cpu, gpu = gpt_pair()
    opts = [AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (cpu, gpu)]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        idx, tgt = torch.randint(0, 41, (3, 24), generator=g), torch.randint(0, 41, (3, 24), generator=g)
        losses, grads = [], []
        for model, opt, dev in ((cpu, opts[0], "cpu"), (gpu, opts[1], CUDA)):
            opt.zero_grad()
            crit = CrossEntropyLoss()
            logits = model(idx.to(dev))
            losses.append(crit(logits.view(-1, 41), tgt.to(dev).view(-1)))
            model.backward(crit.backward().view_as(logits))
            grads.append(named_grads(model))
            opt.step()
        assert err(losses[1], losses[0]) < 1e-12
        for name, g_cpu in grads[0].items():
            assert grads[1][name].device.type == "cuda"
            assert err(grads[1][name], g_cpu) < 1e-10, name
    sd = cpu.state_dict()
    for name, v in gpu.state_dict().items():
        assert err(v, sd[name]) < 1e-10, name


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_gpt_low_precision_on_cuda_is_its_twin_within_rounding(dtype, tol):
    """The GPT and its nn.Module twin, both in ``dtype`` on the GPU: the same loss and gradients within the
    dtype's rounding (the float64 CPU model is the referee for both)."""
    ref, _ = gpt_pair()
    model = GPT(vocab_size=41, block_size=24, n_layer=2, n_head=2, n_embd=16, dtype=dtype, device=CUDA)
    model.load_state_dict({k: v.to(dtype) for k, v in ref.state_dict().items()})
    twin = model.to_torch()
    g = torch.Generator().manual_seed(2)
    idx, tgt = torch.randint(0, 41, (4, 24), generator=g), torch.randint(0, 41, (4, 24), generator=g)
    crit = CrossEntropyLoss()
    logits = model(idx.to(CUDA))
    loss = crit(logits.view(-1, 41), tgt.to(CUDA).view(-1))
    model.backward(crit.backward().view_as(logits))
    loss_t = F.cross_entropy(twin(idx.to(CUDA)).view(-1, 41).float(), tgt.to(CUDA).view(-1))
    loss_t.backward()
    crit64 = CrossEntropyLoss()
    logits64 = ref(idx)
    loss64 = crit64(logits64.view(-1, 41), tgt.view(-1))
    assert err(loss, loss64) < tol and err(loss_t, loss64) < tol
    ours, theirs = named_grads(model), dict(twin.named_parameters())
    for name, p in theirs.items():
        assert ours[name].device.type == "cuda"
        assert err(ours[name], p.grad) < 10 * tol, name


@pytest.mark.parametrize(
    "cls,kw",
    [(LSTM, {}), (LSTM, {"proj_size": 3}), (GRU, {}), (RNN, {"nonlinearity": "relu"})],
    ids=["lstm", "lstm_proj", "gru", "rnn_relu"],
)
def test_recurrent_float64_on_cuda_equals_cpu(cls, kw):
    torch.manual_seed(3)
    cpu = cls(5, 7, num_layers=2, bidirectional=True, dtype=F64, **kw)
    gpu = cls(5, 7, num_layers=2, bidirectional=True, dtype=F64, **kw)
    gpu.load_state_dict(cpu.state_dict())
    gpu.to(CUDA)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 3, 5, generator=g, dtype=F64)
    out, hn = cpu(x)
    out_g, hn_g = gpu(x.to(CUDA))
    assert out_g.device.type == "cuda" and err(out_g, out) < 1e-12
    flat = lambda h: list(h) if isinstance(h, tuple) else [h]  # noqa: E731
    for a, b in zip(flat(hn_g), flat(hn), strict=True):
        assert err(a, b) < 1e-12
    dout = torch.randn(out.shape, generator=g, dtype=F64)
    dhn = tuple(torch.randn(h.shape, generator=g, dtype=F64) for h in flat(hn))
    dx = cpu.backward(dout, dhn if isinstance(hn, tuple) else dhn[0])
    dx_g = gpu.backward(dout.to(CUDA), tuple(d.to(CUDA) for d in dhn) if isinstance(hn, tuple) else dhn[0].to(CUDA))
    dx, dx_g = (dx[0], dx_g[0]) if isinstance(dx, tuple) else (dx, dx_g)
    assert err(dx_g, dx) < 1e-10
    grads = named_grads(cpu)
    for name, g_gpu in named_grads(gpu).items():
        assert g_gpu.device.type == "cuda" and err(g_gpu, grads[name]) < 1e-10, name


def test_multihead_attention_float64_on_cuda_equals_cpu():
    torch.manual_seed(5)
    cpu = MultiheadAttention(8, 2, dtype=F64)
    gpu = MultiheadAttention(8, 2, dtype=F64)
    gpu.load_state_dict(cpu.state_dict())
    gpu.to(CUDA)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(5, 3, 8, generator=g, dtype=F64) for _ in range(3))
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[1, 3:] = True
    out, w = cpu(q, k, v, key_padding_mask=mask)
    out_g, w_g = gpu(q.to(CUDA), k.to(CUDA), v.to(CUDA), key_padding_mask=mask.to(CUDA))
    assert err(out_g, out) < 1e-12 and err(w_g, w) < 1e-12
    dout = torch.randn(out.shape, generator=g, dtype=F64)
    for a, b in zip(gpu.backward(dout.to(CUDA)), cpu.backward(dout), strict=True):
        assert err(a, b) < 1e-10
    grads = named_grads(cpu)
    for name, g_gpu in named_grads(gpu).items():
        assert err(g_gpu, grads[name]) < 1e-10, name


@pytest.mark.parametrize("fast", [False, True], ids=["compiled", "compiled-fast"])
def test_compiled_whole_step_on_cuda_equals_eager_over_ten_steps(fast):
    torch.manual_seed(7)
    eager_net = Net(hidden_size=32, depth=2, device=CUDA, dtype=F64)
    comp_net = Net(hidden_size=32, depth=2, device=CUDA, dtype=F64)
    comp_net.load_state_dict(eager_net.state_dict())
    eager = train_step(eager_net, Adam(eager_net.parameters(), lr=1e-2))
    comp_opt = Adam(comp_net.parameters(), lr=1e-2)
    compiled = torch.compile(train_step(comp_net, comp_opt), fullgraph=True)
    if fast:
        from training.compiled_fast import GuardFreeStep

        compiled = GuardFreeStep(compiled, comp_net, comp_opt)
    g = torch.Generator().manual_seed(8)
    for _ in range(10):
        x = torch.randn(16, 784, generator=g, dtype=F64).to(CUDA)
        y = torch.randint(0, 10, (16,), generator=g).to(CUDA)
        assert err(compiled(x, y), eager(x, y)) < 1e-10
    for (name, a), (_, b) in zip(comp_net.named_parameters(), eager_net.named_parameters(), strict=True):
        assert err(a, b) < 1e-10, name


def test_bfloat16_master_weights_on_cuda_follow_the_autocast_twin():
    torch.manual_seed(0)
    twin = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)).to(CUDA)
    from layers import from_torch

    net = from_torch(twin)
    master = MasterWeights(net, cast_to=torch.bfloat16)
    opt = SGD(master.parameters(), lr=0.1, momentum=0.9)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    crit = CrossEntropyLoss()
    for _ in range(8):
        x, y = torch.randn(64, 20, device=CUDA), torch.randint(0, 5, (64,), device=CUDA)
        master.zero_grad()
        loss = crit(net(x.to(torch.bfloat16)), y)
        net.backward(crit.backward())
        master.grads_to_master()
        opt.step()
        master.master_to_model()
        opt_twin.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_twin = F.cross_entropy(twin(x), y)
        loss_twin.backward()
        opt_twin.step()
        assert err(loss, loss_twin) < 1e-2
    state = twin.state_dict()
    for name, m in master.named_parameters():
        assert m.device.type == "cuda" and err(m, state[name]) < 1e-2, name


def test_cross_entropy_ignore_index_inside_the_targets_span_on_cuda():
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(12, 7, generator=g, dtype=F64).to(CUDA)
    y = torch.randint(0, 7, (12,), generator=g).to(CUDA)
    y[[2, 5]] = 3
    crit = CrossEntropyLoss(ignore_index=3, label_smoothing=0.1)
    loss = crit(logits, y)
    dx = crit.backward()
    xr = logits.clone().requires_grad_()
    ref = F.cross_entropy(xr, y, ignore_index=3, label_smoothing=0.1)
    ref.backward()
    assert err(loss, ref) < 1e-13 and err(dx, xr.grad) < 1e-12
    with pytest.raises(ValueError, match="target contains class 9"):
        crit(logits, torch.tensor([1, 9] * 6, device=CUDA))


def test_train_py_gpt_and_cnn_on_cuda_equal_their_twins(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("First Citizen: Before we proceed any further, hear me speak.\nAll: Speak, speak.\n" * 40)
    out = tmp_path / "gpt"
    assert (
        train.main(
            [
                "--data-file",
                str(corpus),
                "--out",
                str(out),
                "--device",
                "cuda",
                "--dtype",
                "float64",
                "--model",
                "gpt",
                "--n-layer",
                "2",
                "--n-head",
                "2",
                "--n-embd",
                "16",
                "--block-size",
                "16",
                "--batch-size",
                "4",
                "--eval-iters",
                "2",
                "--max-iters",
                "4",
                "--eval-interval",
                "2",
                "--quiet",
                "--no-plots",
            ]
        )
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["max_param_abs_diff"] < 1e-10
    write_tiny_mnist(tmp_path / "data")
    out = tmp_path / "cnn"
    assert (
        train.main(
            [
                "--data-dir",
                str(tmp_path / "data"),
                "--out",
                str(out),
                "--device",
                "cuda",
                "--model",
                "cnn",
                "--epochs",
                "1",
                "--dtype",
                "float64",
                "--batch-size",
                "32",
                "--no-download",
                "--quiet",
            ]
        )
        == 0
    )
    assert json.loads((out / "summary.json").read_text())["max_param_abs_diff"] < 1e-10
