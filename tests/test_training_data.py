"""Finding, reading and normalising the IDX data (training/tasks/image_data.py), through train.py and directly."""

import gzip
import json
import shutil
import warnings
import zlib

import pytest
import torch

import train
import training
import training.tasks.image_data
from tests.conftest import SHARED_MNIST, write_split
from training import TrainConfig

FAST = ["--hidden", "16", "--depth", "2", "--batch-size", "32", "--no-download", "--quiet", "--no-plots"]


def run(*argv):
    return train.main([str(a) for a in argv])


def test_missing_data_says_where_it_looked_and_how_to_fix(tmp_path, capsys):
    code = run(
        "--dataset", "mnist", "--data-dir", tmp_path / "empty", "--out", tmp_path / "run", "--no-download", "--quiet"
    )
    assert code == 2
    assert not (tmp_path / "run").exists()  # a refused run leaves no empty output folder
    err = capsys.readouterr().err
    assert str(tmp_path / "empty" / "MNIST" / "raw") in err
    assert "apt-get install -y dataset-fashion-mnist" in err and "Traceback" not in err


def test_missing_data_with_download_failure_is_the_same_message(tmp_path, monkeypatch, capsys):
    from torchvision import datasets

    def no_network(self):  # torchvision's message: its first line ends in a colon, the causes follow
        raise RuntimeError(
            "Error downloading train-images-idx3-ubyte.gz:\nTried https://a/, got:\n<urlopen error "
            "a>\nTried https://b/, got:\n<urlopen error [Errno -3] Temporary failure in name "
            "resolution>\n"
        )

    monkeypatch.setattr(datasets.MNIST, "download", no_network)
    assert run("--dataset", "mnist", "--data-dir", tmp_path / "empty", "--out", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err
    assert "missing train-images-idx3-ubyte" in err
    assert (
        "the network (torchvision download: RuntimeError: Error downloading train-images-idx3-ubyte.gz: ... "
        "<urlopen error [Errno -3] Temporary failure in name resolution>)"
    ) in err


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_idx_file(tiny, tmp_path, damage, capsys):
    f = tiny / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00\x00\x01\x01garbage")
    assert run("--dataset", "mnist", "--data-dir", tiny, "--out", tmp_path / "run", *FAST) == 2
    err = capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert "corrupt or truncated" in err and str(f) in err and "Traceback" not in err


def test_corrupt_gzip(tiny, tmp_path, capsys):
    (tiny / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz").write_bytes(b"not gzip at all")
    assert run("--dataset", "mnist", "--data-dir", tiny, "--out", tmp_path / "run", *FAST) == 2
    assert "not a readable gzip file" in capsys.readouterr().err


def test_gzip_with_damaged_deflate_data_is_one_message(tiny, tmp_path, capsys):
    """Damage inside the compressed stream (zlib.error), not the header, the length or the CRC."""
    gz = tiny / "MNIST" / "raw" / "train-images-idx3-ubyte.gz"
    data = bytearray(gz.read_bytes())
    data[10] = 0b111  # the first deflate block (after gzip's 10-byte header): final, of the invalid type 3
    gz.write_bytes(bytes(data))
    with pytest.raises(zlib.error):  # the damage this test is about
        gzip.decompress(bytes(data))
    assert run("--dataset", "mnist", "--data-dir", tiny, "--out", tmp_path / "run", *FAST) == 2
    err = capsys.readouterr().err
    assert f"{gz} is not a readable gzip file" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_fashion_mnist_found_in_debian_location(tmp_path, monkeypatch):
    debian = tmp_path / "debian"
    write_split(debian, "train", 120, 2, compress=True)
    write_split(debian, "t10k", 40, 3, compress=True)
    monkeypatch.setattr(training.tasks.image_data, "DEBIAN_FASHION", debian)
    out = tmp_path / "run"
    assert run("--dataset", "fashion-mnist", "--data-dir", tmp_path / "data", "--out", out, "--epochs", "1", *FAST) == 0
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(
        n for pair in training.tasks.image_data.SPLIT_FILES.values() for n in pair
    )
    assert json.loads((out / "summary.json").read_text())["dataset"] == "fashion-mnist"
    said = []  # the copy into --data-dir is announced, with where it went
    training.prepare_raw(tmp_path / "elsewhere", "fashion-mnist", train=True, download=False, say=said.append)
    assert said == [
        f"decompressed Debian's Fashion-MNIST training split from {debian} into "
        f"{tmp_path / 'elsewhere' / 'FashionMNIST' / 'raw'} (0 MB; --data-dir chooses where)"
    ]


def test_data_is_normalised_with_training_statistics(tiny):
    config = TrainConfig(data_dir=tiny, download=False, val_split=30)
    data = training.load_data(config.data, torch.device("cpu"), torch.float64, say=lambda *a: None)
    assert data.train_x.shape == (270, 784) and data.val_x.shape == (30, 784) and data.test_x.shape == (80, 784)
    assert abs(data.train_x.mean().item()) < 1e-12 and abs(data.train_x.std().item() - 1) < 1e-12
    again = training.load_data(config.data, torch.device("cpu"), torch.float64, say=lambda *a: None)
    assert torch.equal(again.val_y, data.val_y)  # the split is seeded


@pytest.mark.skipif(
    not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file(),
    reason=f"real MNIST test split not found at {SHARED_MNIST}",
)
def test_real_mnist_test_split_loads(tmp_path, recwarn):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(SHARED_MNIST / name, raw / name)
    found = training.prepare_raw(tmp_path, "mnist", train=False, download=False)
    assert not [w for w in recwarn if "MD5" in str(w.message)]  # the official files pass the MD5 check
    images, labels = training.read_split(found, train=False)
    assert images.shape == (10000, 28, 28) and images.dtype == torch.uint8
    assert labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # the well-known first test digits
    assert torch.bincount(labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_images_for_a_cnn_keep_their_shape(tiny):
    config = TrainConfig(data_dir=tiny, download=False, val_split=0)
    data = training.load_data(
        config.data, torch.device("cpu"), torch.float32, say=lambda *a: None, sample_shape=(1, 28, 28)
    )
    assert data.train_x.shape == (300, 1, 28, 28) and data.test_x.shape == (80, 1, 28, 28)


def test_debian_fashion_mnist_checksums_are_known_and_give_no_warning(tmp_path):
    debian = training.tasks.image_data.DEBIAN_FASHION
    if not all((debian / f"{n}.gz").is_file() for n in training.tasks.image_data.SPLIT_FILES[False]):
        pytest.skip(f"Debian's dataset-fashion-mnist is not installed at {debian}")
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for n in training.tasks.image_data.SPLIT_FILES[False]:
        shutil.copy(debian / f"{n}.gz", raw / f"{n}.gz")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an MD5 warning would fail here
        found = training.prepare_raw(tmp_path, "fashion-mnist", train=False, download=False)
    images, labels = training.read_split(found, train=False, dataset="fashion-mnist")
    assert images.shape == (10000, 28, 28) and torch.bincount(labels).tolist() == [1000] * 10


def test_unknown_checksum_still_warns(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    write_split(raw, "t10k", 10, 0, compress=True)
    with pytest.warns(UserWarning, match="not the official one"):
        training.prepare_raw(tmp_path, "mnist", train=False, download=False)
