"""The front page tells today's truth: its figures are what docs/figures.md records (each with its command, machine
and date, written by scripts/figures.py from the commands' own output), its counts are the code's and the suite's."""

import importlib.util
import os
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SPEC = importlib.util.spec_from_file_location("figures", ROOT / "scripts" / "figures.py")
figures = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(figures)


def test_every_figure_of_the_table_has_its_value_command_machine_and_date():
    rows = figures.load()
    assert rows, "docs/figures.md holds no figures"
    for key, row in rows.items():
        assert row["value"] and row["command"] and row["figure"], key
        assert re.search(r"\d", row["machine"]) and "load average" in row["machine"], (key, row["machine"])
        assert date.fromisoformat(row["date"]) <= date.today(), (key, row["date"])


def test_the_readmes_figures_are_the_tables():
    text = README.read_text()
    assert figures.render(text, figures.load()) == text, (
        "README.md's figures differ from docs/figures.md: run python scripts/figures.py --render (never edit them)"
    )


def test_the_table_round_trips(tmp_path):
    rows = figures.load()
    figures.save(rows, tmp_path / "figures.md")
    assert figures.load(tmp_path / "figures.md") == rows
    assert (tmp_path / "figures.md").read_text() == figures.TABLE.read_text()


def test_a_section_missing_from_the_readme_is_said():
    others = "".join(f"<!-- figures:{n} -->\n<!-- /figures:{n} -->\n" for n in figures.SECTIONS if n != "headline")
    with pytest.raises(SystemExit, match="figures:headline"):
        figures.render(others, figures.load())
    with pytest.raises(SystemExit, match="figures:install"):
        figures.render("no sections here", figures.load())


def test_a_benchmarks_row_is_read_from_its_own_output():
    out = (
        "  candidate                                       ms/step  vs nn.Module   x GEMM\n"
        "  handgrad, the README's call, SGD                 0.215         1.31x    2.21x\n"
        "  handgrad, the README's call, Adam                0.216         1.27x    2.80x\n"
    )
    assert figures.ratio(out, "handgrad, the README's call, SGD", "step.py") == 1.31
    with pytest.raises(SystemExit, match="no line matching"):
        figures.ratio(out, "handgrad step", "step.py")


def counts(text: str, pattern: str) -> set[int]:
    return {int(n.replace(",", "")) for n in re.findall(pattern, text)}


def test_the_counts_on_the_front_page_are_the_codes():
    from learn.checker.specs import catalogue
    from learn.exercises import EXERCISES

    text = README.read_text()
    learn_page = (ROOT / "docs" / "learn.md").read_text()
    assert counts(text, r"(\d+) exercises") == {len(EXERCISES)}, "README.md's count of exercises"
    known = counts(text, r"\((\d+) known\)") | counts(learn_page, r"knows (\d+) mistakes")
    assert known == {len(catalogue())}, "the count of known mistakes (README.md, docs/learn.md)"
    assert not re.search(r"\b(seventeen|eighteen|nineteen|twenty)\b", text), "a count written in words"


@pytest.mark.slow  # collects the whole suite in another process
def test_the_readmes_test_counts_are_the_suites():
    if os.environ.get("HANDGRAD_COUNTING_TESTS"):
        pytest.skip("scripts/figures.py is measuring the counts this test compares")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    m = re.search(r"^(\d+)/(\d+) tests collected \((\d+) deselected\)", r.stdout, re.M)
    assert m, r.stdout[-2000:] + r.stderr[-2000:]
    rows = figures.load()
    assert (int(m.group(1)), int(m.group(3))) == (
        int(rows["tests.fast.count"]["value"]),
        int(rows["tests.slow.count"]["value"]),
    ), "the suite has other tests than docs/figures.md counts: run python scripts/figures.py --only tests"
