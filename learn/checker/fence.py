"""The fences the learner's process puts up around itself before it runs their code, each enforced by the kernel.

- Hard resource limits (soft = hard, so they cannot be lifted): address space, processor seconds, file size,
  processes, core dumps.
- No capabilities (a root process gives them all up: it can no longer raise a limit, signal another user's
  process or write past a file's permissions).
- A seccomp filter: a process that asks for a new process or thread (clone, fork, vfork, clone3), an exec, a
  signal (kill, tgkill, pidfd_send_signal, ...), ptrace or another process's memory, a device node or FIFO
  (mknod), or an extended attribute changed is killed on the spot (SIGSYS), whatever it would have done next:
  nothing the check started can outlive it, and no second thread can run (autograd, or anything else) where the
  check does not watch.

These hold in the forked child as in the sandboxed one; where the architecture is not known (the filter's system
call numbers are per architecture), the filter is not installed and says so.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import signal
import struct

# the system calls refused, by architecture: (the kernel's audit arch, {name: number})
_X86_64 = {
    "clone": 56,
    "fork": 57,
    "vfork": 58,
    "execve": 59,
    "kill": 62,
    "ptrace": 101,
    "rt_sigqueueinfo": 129,
    "mknod": 133,
    "setxattr": 188,
    "lsetxattr": 189,
    "fsetxattr": 190,
    "removexattr": 197,
    "lremovexattr": 198,
    "fremovexattr": 199,
    "tkill": 200,
    "tgkill": 234,
    "mknodat": 259,
    "rt_tgsigqueueinfo": 297,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "execveat": 322,
    "pidfd_send_signal": 424,
    "pidfd_open": 434,
    "clone3": 435,
    "setxattrat": 463,
    "removexattrat": 466,
}
_AARCH64 = {
    "setxattr": 5,
    "lsetxattr": 6,
    "fsetxattr": 7,
    "removexattr": 14,
    "lremovexattr": 15,
    "fremovexattr": 16,
    "mknodat": 33,
    "ptrace": 117,
    "kill": 129,
    "tkill": 130,
    "tgkill": 131,
    "rt_sigqueueinfo": 138,
    "clone": 220,
    "execve": 221,
    "rt_tgsigqueueinfo": 240,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "execveat": 281,
    "pidfd_send_signal": 424,
    "pidfd_open": 434,
    "clone3": 435,
    "setxattrat": 463,
    "removexattrat": 466,
}
ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}
# classic BPF, as seccomp reads it: struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _KILL = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (this one's by default): a refused call, or another architecture's (x32 on
    x86_64), kills the process."""
    machine = machine or platform.machine()
    arch, numbers = ARCHES.get(machine, (None, None))
    if arch is None:
        return None
    ops = [_op(_LD_ABS, _ARCH), _op(_JEQ, arch, 1, 0), _op(_RET, _KILL), _op(_LD_ABS, _NR)]
    if machine == "x86_64":
        ops += [_op(_JGE, 0x40000000, 0, 1), _op(_RET, _KILL)]  # the x32 numbers: another way in to every call
    for nr in sorted(numbers.values()):
        ops += [_op(_JEQ, nr, 0, 1), _op(_RET, _KILL)]
    ops.append(_op(_RET, _ALLOW))
    return b"".join(ops)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def no_new_processes() -> str | None:
    """Install the seccomp filter on this process (and whatever it could start); -> None, or why it is not."""
    code = program()
    if code is None:
        return f"no seccomp filter for {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to install a filter without privileges
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return f"seccomp failed: {os.strerror(ctypes.get_errno())}"
    return None


def drop_capabilities() -> None:
    """A root process gives up every capability (capset with empty sets); a no-op for anyone else."""
    if os.geteuid() != 0:
        return

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):  # the bounding set too, while CAP_SETPCAP is still held
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP; past the last capability it fails harmlessly
    data = (Data * 2)()
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:  # _LINUX_CAPABILITY_VERSION_3
        raise OSError(ctypes.get_errno(), "capset failed")


def hard_limits(*, memory: int, cpu_seconds: float, file_size: int) -> None:
    """Soft = hard for each: ``memory`` bytes of address space more than now, ``cpu_seconds`` more of processor
    time, files of at most ``file_size`` bytes (printing included: SIGXFSZ ends the process), no new process, no
    core dump."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(used.ru_utime + used.ru_stime + cpu_seconds) + 1
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; past file_size the process is stopped
    limits = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_NPROC, 0),
    ]
    size = _address_space()
    if size is not None:
        limits.append((resource.RLIMIT_AS, size + memory))
    for which, value in limits:
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def _address_space() -> int | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    except (OSError, ValueError, StopIteration):
        return None  # no /proc: the time limit still bounds the run
