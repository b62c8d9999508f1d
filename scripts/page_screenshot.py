"""The README's picture of the step-through page, taken from the page itself: ``python -m learn show``'s page (seed 0)
in headless Chromium, Next pressed nine times, in the viewport a 1280 x 800 window leaves once its bars are drawn.

    python scripts/page_screenshot.py [OUT.png]    # default: examples/figures/learn_page_backward.png

The browser test (tests/test_learn_page.py) takes the same picture and compares it with the committed one, so the
two cannot drift.  Needs Debian's ``chromium`` and ``chromium-driver`` and selenium (the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURE = ROOT / "examples" / "figures" / "learn_page_backward.png"
VIEWPORT = (1280, 657)  # a 1280 x 800 window less Chromium's tab strip, address bar and window frame
NEXT_PRESSES = 9  # the fourth backward step: dL/dW2 arrives along its edge
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--force-device-scale-factor=1",
    "--window-size=1440,1300",
]


def set_viewport(browser, width: int, height: int) -> None:
    """Resize the window so that the page itself gets ``width`` x ``height`` CSS pixels."""
    size = browser.get_window_size()
    inner = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    browser.set_window_size(size["width"] + width - inner[0], size["height"] + height - inner[1])
    inner = browser.execute_script("return [window.innerWidth, window.innerHeight]")
    if inner != [width, height]:
        raise RuntimeError(f"the browser gave a viewport of {inner[0]} x {inner[1]}, not {width} x {height}")


def shoot(browser, out: Path) -> Path:
    """Write the page, open it in ``browser`` (a selenium driver) at VIEWPORT, press Next NEXT_PRESSES times and
    save what is shown to ``out`` -> ``out``."""
    from learn.page import write_page

    with tempfile.TemporaryDirectory(prefix="handgrad-page-") as folder:
        page = write_page(Path(folder) / "backprop.html", seed=0)
        set_viewport(browser, *VIEWPORT)
        browser.get(page.as_uri())
        nxt = browser.find_element("id", "next")
        for _ in range(NEXT_PRESSES):
            nxt.click()
        browser.execute_script("document.activeElement.blur()")  # no focus ring on Next in the picture
        out.parent.mkdir(parents=True, exist_ok=True)
        if not browser.save_screenshot(str(out)):
            raise RuntimeError(f"the browser did not save a screenshot to {out}")
    return out


def chromium(profile: str):
    """Debian's headless Chromium driven by selenium through Debian's chromedriver, its profile in ``profile``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        sys.exit("needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    return webdriver.Chrome(service=Service(driver), options=options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=FIGURE, help=f"the PNG to write (default {FIGURE})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="handgrad-chromium-") as profile:
        browser = chromium(profile)
        try:
            print(f"wrote {shoot(browser, args.out)}")
        finally:
            browser.quit()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # learn/, when run from a checkout without the editable install
    sys.exit(main())
