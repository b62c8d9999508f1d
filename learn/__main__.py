"""python -m learn: list, start, hint, check, why, train and progress of the exercises; the page; a trace."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import textwrap
from pathlib import Path

from .exercises import BY_NAME, get
from .files import check_command, work_dir


def cmd_list(args) -> int:
    from .progress import table

    print(
        "The exercises, in the order to do them (python -m learn start NAME writes one to fill in; [x]: it passes):\n"
    )
    print(table(work_dir(create=False)), end="")
    return 0


def cmd_progress(args) -> int:
    from .progress import main

    if args.dir is None:
        args.dir = str(work_dir(create=False))
    return main(args)


def _default(name: str) -> Path | None:
    """``name`` in the learner's work folder (learn/files.py), or None (said on stderr) where none can be made."""
    try:
        return work_dir() / name
    except OSError as e:
        print(
            f"cannot make a folder for your files ({e.strerror or e}): give --out FILE, or set HANDGRAD_LEARN_DIR",
            file=sys.stderr,
        )
        return None


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_text() == text
    except (OSError, UnicodeDecodeError):
        return False


def cmd_start(args) -> int:
    from .source import notebook, solution_text, stub_text

    ex = get(args.name)
    if not ex.source.is_file():  # a teacher's exercise given without its solution
        print(f"no {ex.source}: start cuts the stub from the exercise's solution file", file=sys.stderr)
        return 2
    if args.nbgrader and not args.notebook:
        print("--nbgrader writes a notebook: give --notebook too", file=sys.stderr)
        return 2
    suffix = ".ipynb" if args.notebook else ".py"
    out = Path(args.out) if args.out else _default(f"{ex.name}{'_solution' if args.solution else ''}{suffix}")
    if out is None:
        return 2
    code = (solution_text if args.solution else stub_text)(
        ex, str(out.with_suffix(".py")) if args.notebook else str(out)
    )
    if args.nbgrader:
        import nbformat

        from .teach.nbgrader import nbgrader_notebook

        text = nbformat.writes(nbgrader_notebook(ex, str(out.with_suffix(".py")), args.points))
    elif args.notebook:
        import nbformat

        text = nbformat.writes(notebook(ex, code))
    else:
        text = code
    if out.exists() and not args.force:
        if _holds(out, text):  # started before and not touched since: running start again is harmless
            print(f"{out} is already there, unchanged since start wrote it")
            return 0
        print(
            f"{out} exists already; not overwriting it (add --force to replace it, or --out OTHER_FILE)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.nbgrader:  # nbgrader's course layout: source/ASSIGNMENT/, made here if need be
            out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as e:
        print(f"cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    if args.nbgrader:
        print(
            f"wrote {out}: nbgrader's source notebook (the solution between ### BEGIN/END SOLUTION, the last cell "
            f"a locked test worth {args.points:g} point(s) that fails on a wrong answer); put it in your course's "
            f"source/ASSIGNMENT/ folder and run nbgrader generate_assignment ASSIGNMENT.  So that nothing a "
            f"student's kernel does can change the grade, add to the course's nbgrader_config.py:\n"
            f"    from learn.teach.nbgrader_autograde import autograde_preprocessors\n"
            f"    c.Autograde.autograde_preprocessors = autograde_preprocessors()"
        )
    elif args.solution:
        print(f"wrote the worked solution of {ex.name} to {out}")
    elif args.notebook:
        jupyter = (
            ""
            if importlib.util.find_spec("notebook") or importlib.util.find_spec("jupyterlab")
            else (
                " (Jupyter is not installed here: pip install notebook, or in the checkout: "
                ".venv/bin/pip install -e '.[notebook]')"
            )
        )
        print(
            f"wrote {out}: open it in Jupyter{jupyter}, fill in the parts marked '# YOUR CODE HERE', run the "
            f"cells; the last one checks your {ex.cls}. Or check it from a terminal:\n"
            f"    {check_command(ex.name, out)}"
        )
    else:
        print(
            f"wrote {out}: read it, fill in the parts marked '# YOUR CODE HERE', then check it with\n"
            f"    {check_command(ex.name, out)}"
        )
    return 0


def cmd_hint(args) -> int:
    from .hints import HINTS

    ex = get(args.name)
    hints = HINTS[ex.name]
    level = min(max(args.level, 1), len(hints))
    print(f"{ex.name}, hint {level} of {len(hints)}:\n")
    for line in hints[level - 1].split("\n"):  # prose is wrapped, code (indented) printed as it is
        print(line if line.startswith("    ") else textwrap.fill(line, 100))
    if level < len(hints):
        print(f"\nMore:  python -m learn hint {ex.name} --level {level + 1}")
    else:
        from .why import pointer

        print(
            f"\nThat is nearly the answer; the worked one:  python -m learn start {ex.name} --solution\n"
            f"{pointer(ex.name)}"
        )
    return 0


def cmd_check(args) -> int:
    from .checker import check_file

    ex = get(args.name)
    path = Path(args.file) if args.file else work_dir(create=False) / f"{ex.name}.py"
    if not args.file and not path.is_file():
        print(
            f"Cannot check {path}: it does not exist; python -m learn start {ex.name} writes it there (or name "
            f"your file: python -m learn check {ex.name} FILE)",
            file=sys.stderr,
        )
        return 2
    if args.format != "text":
        return _check_structured(ex.name, path, args.format, args.trust_submissions)
    try:
        code, text = check_file(ex.name, path)
    except KeyboardInterrupt:  # the learner's code runs in a child, which the checker has stopped
        print(f"interrupted: {path} was not checked", file=sys.stderr)
        return 130
    print(text, end="", file=sys.stdout if code < 2 else sys.stderr)
    from .teach.custom import is_custom

    if code == 0 and not is_custom(ex.name):  # a teacher's exercise has no train race, and no place in the course
        from .progress import after_pass

        print(after_pass(ex, str(path)), end="")  # recorded in the file's folder; then what comes next
    return code


def _check_structured(name: str, path: Path, fmt: str, trusted: bool) -> int:
    """learn check --format json|gradescope: a grader's check, inside bubblewrap (or forked, with
    --trust-submissions where it cannot run); the structured result on stdout, the exit status as the text's."""
    import json

    from .checker.boundary import Unavailable, isolation
    from .teach.gradescope import outcome, plain, results

    try:
        o = outcome(name, path, isolate=isolation(trusted))
    except Unavailable as e:
        print(f"python -m learn check: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {path} was not checked", file=sys.stderr)
        return 130
    print(json.dumps(plain(o) if fmt == "json" else results([o]), indent=1))
    return o.status


def cmd_grade(args) -> int:
    from .checker.boundary import Unavailable, isolation
    from .checker.sandbox import time_limit
    from .teach.grade import GradeError, check_out, grade

    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"python -m learn grade: {folder} is not a folder of submissions", file=sys.stderr)
        return 2
    try:
        limit = time_limit(args.time_limit, "--time-limit") if args.time_limit is not None else time_limit()
        check_out(folder, Path(args.out))
        isolate = isolation(args.trust_submissions)
    except (ValueError, Unavailable) as e:
        print(f"python -m learn grade: {e}", file=sys.stderr)
        return 2
    if isolate == "fork":
        print("(--trust-submissions: each submission runs in a forked child of this process, not in a sandbox)")
    try:
        graded = grade(
            args.name,
            folder,
            Path(args.out),
            say=lambda line: print(line, flush=True),
            isolate=isolate,
            time_limit=limit,
        )
    except GradeError as e:
        print(f"python -m learn grade: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"interrupted: the students not reached are listed as such in {Path(args.out) / 'grades.csv'}",
            file=sys.stderr,
        )
        return 130
    out = Path(args.out)
    print(
        f"\n{len(graded)} submissions graded: {out / 'grades.csv'}, {out / 'summary.txt'}, "
        f"{out / 'summary.png'}, and {out / 'students'}/STUDENT/results.json\n"
    )
    print((out / "summary.txt").read_text(), end="")
    return 0


def cmd_autograder(args) -> int:
    from .teach.autograder import make_zip

    try:
        out = make_zip(args.names, Path(args.out))
    except (RuntimeError, OSError, KeyError) as e:
        print(f"python -m learn autograder: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {out}: upload it as a Gradescope programming assignment's autograder (Configure Autograder, "
        f"Zip file upload); students submit {', '.join(f'{n}.py' for n in args.names)}"
    )
    if args.try_files:
        from .teach.run_autograder import try_zip

        return try_zip(out, [Path(f) for f in args.try_files])
    return 0


def cmd_why(args) -> int:
    from .why import main

    return main(args)


def cmd_train(args) -> int:
    from training.threads import use_threads

    try:
        print(f"torch on {use_threads(args.threads)}")
    except ValueError as e:  # --threads 0
        print(f"python -m learn train: {e}", file=sys.stderr)
        return 2
    from .train import main

    return main(args)


def cmd_show(args) -> int:
    try:
        from .page import write_page
    except ModuleNotFoundError as e:
        if e.name not in ("learn.page",):
            raise
        print(
            "python -m learn show: the step-through page (learn/page.py) is not in this copy of handgrad yet",
            file=sys.stderr,
        )
        return 2
    target = Path(args.out) if args.out else _default("backprop.html")
    if target is None:
        return 2
    out = write_page(target, args.seed)
    print(f"wrote {out or target}: open it in a browser (one file, nothing fetched from the network)")
    return 0


def cmd_trace(argv: list[str]) -> int:
    try:
        from .trace import main
    except ModuleNotFoundError as e:
        if e.name not in ("learn.trace",):
            raise
        print(
            "python -m learn trace: the model trace (learn/trace.py) is not in this copy of handgrad yet",
            file=sys.stderr,
        )
        return 2
    return main(argv)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m learn",
        description="Learn backpropagation by writing it: "
        "exercises, a checker that names the mistake, training beside handgrad's layers.",
    )
    p.add_argument(
        "--exercises",
        metavar="DIR",
        help="a teacher's own exercises (NAME.py and NAME_spec.py in DIR) beside the built-in ones, for every command",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = list(BY_NAME)

    s = sub.add_parser("list", help="the exercises, in order, and what each teaches")
    s.set_defaults(run=cmd_list)
    s = sub.add_parser("start", help="write an exercise to fill in (NAME.py)")
    s.add_argument("name", choices=names, metavar="NAME")
    s.add_argument(
        "--out",
        help="the file to write (default NAME.py, NAME.ipynb with --notebook, in "
        "~/handgrad-learn or $HANDGRAD_LEARN_DIR)",
    )
    s.add_argument("--solution", action="store_true", help="write the worked solution instead")
    s.add_argument("--notebook", action="store_true", help="write a Jupyter notebook, the check as its last cell")
    s.add_argument(
        "--nbgrader",
        action="store_true",
        help="a teacher's: with --notebook, nbgrader's source notebook (solution marked, the check a graded cell)",
    )
    s.add_argument("--points", type=float, default=1, help="with --nbgrader: the check cell's points (default 1)")
    s.add_argument("--force", action="store_true", help="replace the file if it exists")
    s.set_defaults(run=cmd_start)
    s = sub.add_parser("hint", help="a hint; --level 2 and 3 say more")
    s.add_argument("name", choices=names, metavar="NAME")
    s.add_argument("--level", type=int, default=1, help="1 (where to look) to 3 (nearly the answer)")
    s.set_defaults(run=cmd_hint)
    s = sub.add_parser(
        "check", help="check your file against PyTorch and name the mistake (exit 0 right, 1 wrong, 2 unusable file)"
    )
    s.add_argument("name", choices=names, metavar="NAME")
    s.add_argument(
        "file", nargs="?", help="your NAME.py or NAME.ipynb (default: NAME.py in the folder learn start writes to)"
    )
    s.add_argument(
        "--format",
        choices=("text", "json", "gradescope"),
        default="text",
        help="text (the report, default), json (each checked item, the verdict, the named mistakes), or "
        "gradescope (its results.json: one test per checked item); json and gradescope are a "
        "grader's: the file is checked inside bubblewrap",
    )
    s.add_argument(
        "--trust-submissions",
        action="store_true",
        help="with --format json|gradescope where bubblewrap cannot run: check the file unsandboxed (code "
        "you trust only)",
    )
    s.set_defaults(run=cmd_check)
    s = sub.add_parser(
        "grade",
        help="a teacher's: check a folder of submissions (alice.py, or alice/NAME.py), "
        "write grades.csv, each student's results.json and the class's mistakes",
    )
    s.add_argument("name", choices=names, metavar="NAME")
    s.add_argument("folder", metavar="SUBMISSIONS_DIR")
    s.add_argument(
        "--out", required=True, metavar="DIR", help="where grades.csv, summary.txt, summary.png and students/ go"
    )
    s.add_argument(
        "--time-limit",
        default=None,
        metavar="S",
        help="seconds each submission's check may take (default 30, or $LEARN_CHECK_TIME_LIMIT)",
    )
    s.add_argument(
        "--trust-submissions",
        action="store_true",
        help="where bubblewrap cannot run: check the submissions unsandboxed, in forked children (your own "
        "tests only: their code could change the grades)",
    )
    s.set_defaults(run=cmd_grade)
    s = sub.add_parser("autograder", help="a teacher's: a Gradescope autograder zip checking these exercises")
    s.add_argument("names", nargs="+", choices=names, metavar="NAME")
    s.add_argument("--out", default="autograder.zip", help="the zip to write (default autograder.zip)")
    s.add_argument(
        "--try",
        dest="try_files",
        nargs="+",
        metavar="FILE",
        help="then run the zip here, as Gradescope would, on these submitted files (from any folder): "
        "the score, and results.json beside the zip",
    )
    s.set_defaults(run=cmd_autograder)
    s = sub.add_parser("progress", help="which exercises pass (kept in .handgrad-progress.json) and what is next")
    s.add_argument("--dir", default=None, help="the folder of your files (default: the work folder start writes into)")
    s.add_argument("--recheck", action="store_true", help="check the recorded files, and NAME.py files, again")
    s.set_defaults(run=cmd_progress)
    s = sub.add_parser("why", help="why the backward is right: its derivation with shapes, and where to read more")
    s.add_argument("name", choices=names, metavar="NAME")
    s.set_defaults(run=cmd_why)
    s = sub.add_parser(
        "train",
        help="train your answer beside a trusted twin, the same weights and batches "
        "(exit 0 when they agree, 1 when they part); your file runs in this process, "
        "unsandboxed: for your own code, not a grader's",
    )
    s.add_argument("name", metavar="NAME")
    s.add_argument("file")
    s.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    s.add_argument("--plot", help="draw both loss curves into this PNG file")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for torch (default: the cores the load average leaves free)",
    )
    s.set_defaults(run=cmd_train)
    s = sub.add_parser("show", help="write the step-through page of backpropagation (one HTML file)")
    s.add_argument(
        "--out", help="the HTML file to write (default backprop.html in ~/handgrad-learn or $HANDGRAD_LEARN_DIR)"
    )
    s.add_argument("--seed", type=int, default=0, help="the seed of the XOR network's weights")
    s.set_defaults(run=cmd_show)
    sub.add_parser(
        "trace", help="one training step of a model, layer by layer (its options: trace --help)", add_help=False
    )  # main() hands everything after "trace" to learn.trace.main
    return p


def _take_exercises(argv: list[str]) -> tuple[list[str], str | None]:
    """``--exercises DIR`` (anywhere in the command line) taken out: it must be read before the parser is built,
    whose NAME choices it extends."""
    rest, folder, it = [], None, iter(argv)
    for a in it:
        if a == "--exercises":
            folder = next(it, "")
        elif a.startswith("--exercises="):
            folder = a.split("=", 1)[1]
        else:
            rest.append(a)
    return rest, folder


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["trace"]:
        return cmd_trace(argv[1:])
    argv, folder = _take_exercises(argv)
    if folder is not None:
        from .teach.custom import ExerciseError, register

        try:
            register(folder)
        except ExerciseError as e:
            print(f"python -m learn: {e}", file=sys.stderr)
            return 2
    args = parser().parse_args(argv)
    if args.command in ("check", "grade", "progress"):
        from .checker.sandbox import time_limit

        try:
            time_limit()  # a bad $LEARN_CHECK_TIME_LIMIT is refused once, here, in one line
        except ValueError as e:
            print(f"python -m learn {args.command}: {e}", file=sys.stderr)
            return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
