"""Helpers and fixtures shared by the test files.

Plain functions (``assert_all_pass``, ``rel``, ``twin_pair``, ``write_split``, ``wait_for``, and for the backward split
``seeded_pair``, ``assert_same``, ``assert_grads_same``) are imported with
``from tests.conftest import ...``; fixtures (``tiny``, ``bwrap``) are found by pytest.
"""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.utils._python_dispatch  # HostTraffic
import torch.utils._pytree

from gradcheck import RTOL

# One thread count for the whole suite, in this process and the ones it starts: a run that picked its threads from
# the load (training/threads.py) could sum in another order than the run it is compared with bit for bit.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))

# The Triton kernels (kernels/triton/, `pytest -m triton`) run in Triton's interpreter where there is no CUDA device.
# Triton reads TRITON_INTERPRET when it defines a kernel, its own library's helpers (tl.zeros, tl.sum) included when
# Triton is first imported, which a test module may do as it is collected: so it is set here, before any is.  On CPU
# tensors nothing else reads it (Inductor compiles C++ there).  tests/triton_support.py says the rest.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The slow files: real multi-process runs (torchrun, gloo), the compiled step, every benchmark script run once, an
# autograder installed into a fresh environment.  `pytest -q` leaves them out (pyproject's addopts), so the suite
# answers in minutes; `pytest -q -m slow` runs them, and CI runs both.
SLOW_FILES = {
    "test_benchmarks.py",
    "test_compile.py",
    "test_kernels_compiled.py",
    "test_distributed_train.py",
    "test_distributed_faults.py",
    "test_parallel_composition.py",
    "test_zero.py",
    "test_tensor_parallel.py",
    "test_context_parallel.py",
    "test_learn_teach_autograder.py",
    "test_train_model_parallel.py",
    "test_train_tensor_pipeline.py",
    "test_tp_backward_split.py",
    "test_home_isolation.py",
    "test_learn_teach_attacks.py",
}


# -- the user's own files stay out of reach ---------------------------------------------------------------------------
# A learner runs the suite in the home where `learn` keeps their exercises and progress: the whole session sees a
# fresh home of its own instead (the learner's folder, matplotlib's and Jupyter's folders, every cache under it), and
# the compilers' caches in one folder of the system's temporary directory, kept between sessions so that `pytest -q`
# and `pytest -q -m slow` build each kernel once.  Set when pytest is configured: before any test module is imported
# (matplotlib reads its folder at import), and inherited by every process a test starts.

_HOME_VARIABLES = (
    "HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "MPLCONFIGDIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "TORCH_EXTENSIONS_DIR",
    "IPYTHONDIR",
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_DATA_DIR",
    "JUPYTER_RUNTIME_DIR",
    "HANDGRAD_LEARN_DIR",
)
_isolated: dict[str, object] = {}


def _fingerprint(folder: Path) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime)} of everything under ``folder`` that a test could have touched; {} if there is none."""
    found = {}
    for root, dirs, files in os.walk(folder, onerror=lambda e: None):
        for name in dirs + files:
            path = Path(root, name)
            try:
                st = path.lstat()
            except OSError:
                continue
            found[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return found


def _the_users_folders() -> list[Path]:
    """The folders of the user's home that the suite's tools would write into if it ran in that home."""
    home = Path(os.path.expanduser("~"))
    learn = Path(os.environ["HANDGRAD_LEARN_DIR"]).expanduser() if os.environ.get("HANDGRAD_LEARN_DIR") else None
    return [
        p
        for p in (
            learn,
            home / "handgrad-learn",
            home / ".cache" / "torch_extensions",
            home / ".triton",
            home / ".config" / "matplotlib",
            home / ".cache" / "matplotlib",
        )
        if p is not None
    ]


def pytest_configure(config):
    session = Path(tempfile.mkdtemp(prefix="handgrad-tests-"))
    caches = Path(tempfile.gettempdir()) / f"handgrad-tests-cache-{os.getuid()}"
    folders = _the_users_folders()
    _isolated.update(
        session=session,
        saved={k: os.environ.get(k) for k in _HOME_VARIABLES},
        before={p: _fingerprint(p) for p in folders},
    )
    home = session / "home"
    values = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_STATE_HOME": home / ".local" / "state",
        "MPLCONFIGDIR": home / ".config" / "matplotlib",
        "IPYTHONDIR": home / ".ipython",
        "JUPYTER_CONFIG_DIR": home / ".jupyter",
        "JUPYTER_DATA_DIR": home / ".local" / "share" / "jupyter",
        "JUPYTER_RUNTIME_DIR": home / ".local" / "share" / "jupyter" / "runtime",
        "TORCHINDUCTOR_CACHE_DIR": caches / "inductor",
        "TRITON_CACHE_DIR": caches / "triton",
        "TORCH_EXTENSIONS_DIR": caches / "torch_extensions",
    }
    for key, folder in values.items():
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[key] = str(folder)
    os.environ.pop("HANDGRAD_LEARN_DIR", None)  # learn's default folder, ~/handgrad-learn, is now the session's


def pytest_unconfigure(config):
    for key, value in _isolated.get("saved", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if "session" in _isolated:
        shutil.rmtree(_isolated["session"], ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def the_users_files_untouched():
    """The session runs in its own home (pytest_configure); at its end, the user's own folders are as they were."""
    assert Path(os.path.expanduser("~")) == _isolated["session"] / "home"
    yield
    changed = [str(folder) for folder, before in _isolated["before"].items() if _fingerprint(folder) != before]
    assert not changed, (
        f"the test session (or another process on this machine meanwhile) changed the user's own files in {changed}"
    )


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)


# The real MNIST test split sits in shared/ beside the checkout (CI's clone has it there too).
SHARED_MNIST = next(
    (
        p
        for p in (Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist", Path("/work/shared/data/mnist"))
        if p.is_dir()
    ),
    Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist",
)


def assert_all_pass(results, rtol: float = RTOL) -> None:
    """Every gradient check passed against central differences *and* against torch.autograd."""
    assert results, "no tensor was checked"
    for r in results:
        assert r.rel_numeric < rtol, r.describe()
        assert r.rel_autograd is not None and r.rel_autograd < rtol, r.describe()


def train_step(model, opt):
    """The README's training step as a function of the batch (zero_grad, forward, cross-entropy, backward, step),
    returning the loss: what the compiled-step tests compile."""
    from losses import CrossEntropyLoss

    crit = CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = crit(model(x), y)
        model.backward(crit.backward())
        opt.step()
        return loss

    return step


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b|: the relative error of ``a`` against the reference ``b``."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def twin_pair(dtype: torch.dtype, seed: int = 0, **arch):
    """A hand-written Net and its nn.Module twin holding the same weights."""
    from models import Net, PytorchNet

    torch.manual_seed(seed)
    net = Net(**arch, dtype=dtype)
    twin = PytorchNet(**arch, dtype=dtype)
    twin.load_state_dict(net.state_dict())
    return net, twin


def idx_bytes(t: torch.Tensor) -> bytes:
    """IDX (big-endian) encoding of a uint8 tensor."""
    header = struct.pack(">BBBB", 0, 0, 0x08, t.dim()) + b"".join(struct.pack(">I", s) for s in t.shape)
    return header + t.contiguous().numpy().tobytes()


def write_split(raw: Path, prefix: str, n: int, seed: int, compress: bool) -> None:
    """Write a learnable IDX split: a bright square whose position is the label, plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g, dtype=torch.uint8)
    images = torch.randint(0, 60, (n, 28, 28), generator=g, dtype=torch.uint8)
    for i, c in enumerate(labels.tolist()):
        images[i, 2 * c : 2 * c + 6, 4:10] = 250
    raw.mkdir(parents=True, exist_ok=True)
    for name, t in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
        data = idx_bytes(t)
        if compress:
            (raw / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (raw / name).write_bytes(data)


def write_tiny_mnist(root: Path, n_train: int = 300, n_test: int = 80) -> Path:
    """A tiny dataset in torchvision's layout under ``root``: train as .gz, test decompressed; returns root.

    It is written as MNIST (``root/MNIST/raw``) and found under either dataset name: ``root/FashionMNIST`` is a link
    to ``root/MNIST``, so train.py's default (--dataset fashion-mnist) and --dataset mnist read the same files.
    """
    raw = root / "MNIST" / "raw"
    write_split(raw, "train", n_train, 0, compress=True)
    write_split(raw, "t10k", n_test, 1, compress=False)
    (root / "FashionMNIST").symlink_to("MNIST", target_is_directory=True)
    return root


def wait_for(predicate, proc, what: str, timeout: float = 300.0) -> None:
    """Poll until predicate() holds; fail if the process ``proc`` (a Popen) ended first or the time ran out (generous:
    a run that starts in seconds took minutes on a machine loaded six times over)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the process ended before {what}: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def bwrap() -> None:
    """bubblewrap can run here (a grader's check runs inside it): else the test is skipped, saying how to install
    it, except in CI (CI=true), which installs it through the README's set-up and fails instead."""
    from learn.checker import boundary

    if boundary.bwrap_flags() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("bubblewrap cannot run here, and CI installs it (sh scripts/debian-packages.sh bubblewrap)")
        pytest.skip("bubblewrap cannot run here (sh scripts/debian-packages.sh bubblewrap installs it)")


@pytest.fixture
def kernels_on():
    """The kernels on for a test of a kernel's own property (what it skips or writes in place), whatever
    HANDGRAD_KERNELS says: CI runs the gradient tests a second time with it off."""
    import kernels

    before = kernels.enabled()
    kernels.enable(True)
    yield
    kernels.enable(before)


@pytest.fixture
def guard(monkeypatch):
    """The checks Triton's interpreter does not make, while a kernel test runs (tests/triton_support.py)."""
    from tests.triton_support import guarded

    return guarded(monkeypatch)


@pytest.fixture
def tiny(tmp_path) -> Path:
    """The data root of a tiny MNIST (300 train, 80 test images) written for this test."""
    return write_tiny_mnist(tmp_path / "data")


class HostTraffic(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every op that reads a number back to the host (.item(), bool(t), ...), copies to the host
    (.tolist(), .cpu()), makes a CPU tensor or is handed one: run the work on the "meta" device (tensors without data)
    inside ``with HostTraffic() as guard:`` and ``guard.found`` lists what would break CUDA-graph capture or stall a
    GPU's queue."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            self.found.append(f"{func}: a read-back to the host")
        for a in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(a, torch.Tensor) and a.device.type == "cpu":
                self.found.append(f"{func}: a CPU tensor of shape {tuple(a.shape)}")
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cpu":
            self.found.append(f"{func}: makes a tensor on the CPU (a copy to the host, or a CPU tensor)")
        return func(*args, **kwargs)


def named_grads(layer) -> dict[str, torch.Tensor]:
    """Every parameter's .grad under its torch.nn name, as the layer exposes it (torch's layout: no view taken), to
    compare with ``dict((n, p.grad) for n, p in module.named_parameters())``."""
    return {name: p.grad for name, p in layer.named_parameters()}


# -- the backward split: B then W against the fused backward, bit for bit ------------------------------------------


def seeded_pair(make, seed: int = 0):
    """Two identical layers, built under one seed: one for the fused backward, one for B then W."""
    torch.manual_seed(seed)
    a = make()
    torch.manual_seed(seed)
    return a, make()


def assert_same(a, b, what: str = "dx") -> None:
    """Equal bit for bit, through any nesting of tuples and lists (``(dx, (dh_0, dc_0))``), None where None."""
    if isinstance(a, (tuple, list)):
        assert isinstance(b, (tuple, list)) and len(a) == len(b), what
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            assert_same(u, v, f"{what}[{i}]")
        return
    assert (a is None) == (b is None), what
    if a is not None:
        assert torch.equal(a, b), f"{what} differs by {(a - b).abs().max().item():.3g}"


def assert_grads_same(fused, split) -> None:
    """Every learned parameter's .grad equal bit for bit between the two layers; a frozen one has none in either."""
    got = dict(split.named_parameters())
    for name, p in fused.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.equal(p.grad, got[name].grad), f"{name}.grad differs"
        else:
            assert p.grad is None and got[name].grad is None, f"frozen {name} got a gradient"
