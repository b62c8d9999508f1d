"""scripts/debian-packages.sh, the README's way to Debian's Fashion-MNIST and Chromium, installs what is missing as
far as the user can (apt-get as root, `sudo -n` where sudo needs no password), says in one line what to ask for
otherwise, and exits 0 in every case.  Run against stand-in commands (id, dpkg-query, apt-get, sudo) on PATH."""

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "debian-packages.sh"


def stand_ins(folder: Path, uid: int, installed: str, sudo: bool | None, apt: bool = True) -> Path:
    """A PATH folder whose id, dpkg-query, apt-get and sudo play a machine; apt-get and sudo log to ./calls."""
    calls = folder / "calls"
    tools = {
        "id": f"echo {uid}",
        "dpkg-query": f'case " {installed} " in *" $3 "*) printf "install ok installed";; esac',
        "grep": 'exec /bin/grep "$@"',
    }
    if apt:
        tools["apt-get"] = f'echo "apt-get $*" >> {calls}'
    if sudo is not None:
        tools["sudo"] = f'[ "$2" = true ] && exit 0; echo "sudo $*" >> {calls}; shift; "$@"' if sudo else "exit 1"
    for name, body in tools.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def run(folder: Path, *packages: str) -> tuple[subprocess.CompletedProcess, str]:
    r = subprocess.run(
        ["/bin/sh", str(SCRIPT), *packages], capture_output=True, text=True, timeout=60, env={"PATH": str(folder)}
    )
    calls = folder / "calls"
    return r, calls.read_text() if calls.exists() else ""


@pytest.mark.parametrize(
    "uid, sudo, calls",
    [
        (0, None, "apt-get install -y -q chromium-driver\n"),
        (1000, True, "sudo -n apt-get install -y -q chromium-driver\napt-get install -y -q chromium-driver\n"),
    ],
)
def test_root_and_passwordless_sudo_install_what_is_missing(tmp_path, uid, sudo, calls):
    r, made = run(stand_ins(tmp_path, uid, "chromium", sudo), "chromium", "chromium-driver")
    assert (r.returncode, made, r.stdout) == (0, calls, ""), r.stderr  # chromium is there: only its driver


@pytest.mark.parametrize("sudo", [None, False])  # no sudo at all; a sudo that asks for a password
def test_an_ordinary_user_is_told_what_to_ask_for(tmp_path, sudo):
    r, made = run(stand_ins(tmp_path, 1000, "", sudo), "dataset-fashion-mnist")
    assert r.returncode == 0 and made == ""
    assert r.stdout == (
        "not installed: dataset-fashion-mnist (installing needs root: ask an administrator for "
        "'apt-get install dataset-fashion-mnist')\n"
    )


def test_installed_packages_and_systems_without_apt_are_left_alone(tmp_path):
    r, made = run(stand_ins(tmp_path, 0, "chromium chromium-driver", None), "chromium", "chromium-driver")
    assert (r.returncode, r.stdout, made) == (0, "", "")
    other = tmp_path / "other"
    other.mkdir()
    r, made = run(stand_ins(other, 0, "", None, apt=False), "chromium")
    assert r.returncode == 0 and "no apt-get here" in r.stdout and made == ""
