"""training/allocator.py: glibc keeps freed memory when asked; elsewhere the call says it did nothing."""

from __future__ import annotations

import ctypes.util
import resource
import sys

import pytest
import torch

from training.allocator import retain_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or ctypes.util.find_library("c") is None
    or "glibc" not in " ".join(__import__("platform").libc_ver()),
    reason="needs glibc",
)
def test_glibc_keeps_freed_blocks_so_a_repeated_allocation_faults_no_pages():
    assert retain_freed_memory() is True
    for _ in range(3):  # warm: the heap grows to its peak once
        torch.ones(1 << 21)  # 8 MiB, allocated, written and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        torch.ones(1 << 21)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 200, faults  # 20 fresh 8 MiB blocks would be 40,960 faults


def test_elsewhere_it_does_nothing_and_says_so(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert retain_freed_memory() is False
