#!/bin/sh
# Install the Debian packages handgrad uses outside Python, as far as this user can: Fashion-MNIST (the main job's
# data), Chromium with its driver (the browser test of the step-through page) and bubblewrap (the sandbox each
# grader's check runs in: learn grade, the Gradescope autograder, nbgrader's check).
#
#     sh scripts/debian-packages.sh PACKAGE...
#
# Packages already installed are left alone.  The rest: apt-get as root; `sudo -n apt-get` where sudo needs no
# password; otherwise one line saying what to ask an administrator for.  It always exits 0: the packages are
# optional (train.py downloads the data where the network allows; the browser test is skipped, saying why; without
# bubblewrap, learn grade refuses in one line that says to install it), and a
# set-up whose Python install succeeded must not report failure.
missing=""
for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing="$missing $package"
done
[ -z "$missing" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "not installed:$missing (no apt-get here: install them with this system's package manager)"
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    apt="apt-get"
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    apt="sudo -n apt-get"
else
    echo "not installed:$missing (installing needs root: ask an administrator for 'apt-get install$missing')"
    exit 0
fi
# shellcheck disable=SC2086  # $apt and $missing are lists of words
$apt install -y -q $missing || { $apt update -q && $apt install -y -q $missing; } ||
    echo "not installed:$missing ($apt install failed: see above)"
exit 0
