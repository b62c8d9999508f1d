"""python -m learn: list, start, hint, check, why, train and progress of the exercises; the page; a trace."""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import textwrap
from pathlib import Path

from .exercises import BY_NAME, get
from .files import NotebookError, check_command, notebook_code, work_dir


def cmd_list(args) -> int:
    from .progress import table
    print("The exercises, in the order to do them (python -m learn start NAME writes one to fill in; [x]: it "
          "passes):\n")
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
        print(f"cannot make a folder for your files ({e.strerror or e}): give --out FILE, or set HANDGRAD_LEARN_DIR",
              file=sys.stderr)
        return None


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
    if out.exists() and not args.force:
        print(f"{out} exists already; not overwriting it (add --force to replace it, or --out OTHER_FILE)",
              file=sys.stderr)
        return 2
    code = (solution_text if args.solution else stub_text)(ex, str(out.with_suffix(".py")) if args.notebook
                                                           else str(out))
    if args.nbgrader:
        import nbformat
        from .teach.nbgrader import nbgrader_notebook
        text = nbformat.writes(nbgrader_notebook(ex, str(out.with_suffix(".py")), args.points))
    elif args.notebook:
        import nbformat
        text = nbformat.writes(notebook(ex, code))
    else:
        text = code
    try:
        if args.nbgrader:  # nbgrader's course layout: source/ASSIGNMENT/, made here if need be
            out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as e:
        print(f"cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    if args.nbgrader:
        print(f"wrote {out}: nbgrader's source notebook (the solution between ### BEGIN/END SOLUTION, the last cell "
              f"a locked test worth {args.points:g} point(s) that fails on a wrong answer); put it in your course's "
              f"source/ASSIGNMENT/ folder and run nbgrader generate_assignment ASSIGNMENT")
    elif args.solution:
        print(f"wrote the worked solution of {ex.name} to {out}")
    elif args.notebook:
        jupyter = "" if importlib.util.find_spec("notebook") or importlib.util.find_spec("jupyterlab") else (
            " (Jupyter is not installed here: pip install notebook, or in the checkout: "
            ".venv/bin/pip install -e '.[notebook]')")
        print(f"wrote {out}: open it in Jupyter{jupyter}, fill in the parts marked '# YOUR CODE HERE', run the "
              f"cells; the last one checks your {ex.cls}. Or check it from a terminal:\n"
              f"    {check_command(ex.name, out)}")
    else:
        print(f"wrote {out}: read it, fill in the parts marked '# YOUR CODE HERE', then check it with\n"
              f"    {check_command(ex.name, out)}")
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
        print(f"\nThat is nearly the answer; the worked one:  python -m learn start {ex.name} --solution\n"
              f"{pointer(ex.name)}")
    return 0


def cmd_check(args) -> int:
    from .checker import check_file
    ex = get(args.name)
    path = Path(args.file) if args.file else work_dir(create=False) / f"{ex.name}.py"
    if not args.file and not path.is_file():
        print(f"Cannot check {path}: it does not exist; python -m learn start {ex.name} writes it there (or name "
              f"your file: python -m learn check {ex.name} FILE)", file=sys.stderr)
        return 2
    if args.format != "text":
        return _check_structured(ex.name, path, args.format)
    try:
        if path.suffix == ".ipynb":
            code, text = _check_notebook(ex.name, path, check_file)
        else:
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


def _check_notebook(name: str, path: Path, check_file) -> tuple[int, str]:
    """check_file on a notebook's code cells (learn/files.py), copied into a temporary file named as the notebook."""
    try:
        code = notebook_code(path)
    except NotebookError as e:
        return 2, f"Cannot check {path}: {e}\n"
    with tempfile.TemporaryDirectory(prefix="handgrad-notebook-") as tmp:
        copy = Path(tmp) / f"{path.stem}.py"
        copy.write_text(code)
        status, text = check_file(name, copy)
    note = f"(the code cells of {path}, joined into {copy.name}: its line N is the Nth line of code)\n"
    return status, note + text.replace(str(copy), str(path))


def _check_structured(name: str, path: Path, fmt: str) -> int:
    """learn check --format json|gradescope: the structured result on stdout, the exit status as the text's."""
    import json
    from .teach.gradescope import outcome, plain, results
    try:
        if path.suffix == ".ipynb":
            with tempfile.TemporaryDirectory(prefix="handgrad-notebook-") as tmp:
                copy = Path(tmp) / f"{path.stem}.py"
                try:
                    copy.write_text(notebook_code(path))
                except NotebookError as e:
                    print(f"Cannot check {path}: {e}", file=sys.stderr)
                    return 2
                o = outcome(name, copy)
                o.text = o.text.replace(str(copy), str(path))
        else:
            o = outcome(name, path)
    except KeyboardInterrupt:
        print(f"interrupted: {path} was not checked", file=sys.stderr)
        return 130
    print(json.dumps(plain(o) if fmt == "json" else results([o]), indent=1))
    return o.status


def cmd_grade(args) -> int:
    from .checker import sandbox
    from .teach.grade import grade
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"python -m learn grade: {folder} is not a folder of submissions", file=sys.stderr)
        return 2
    if args.time_limit is not None:
        if args.time_limit <= 0:
            print(f"python -m learn grade: --time-limit must be positive, not {args.time_limit:g}", file=sys.stderr)
            return 2
        sandbox.TIME_LIMIT_S = args.time_limit
    try:
        graded = grade(args.name, folder, Path(args.out), say=lambda line: print(line, flush=True))
    except ValueError as e:  # two submissions of one student
        print(f"python -m learn grade: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the grades were not written", file=sys.stderr)
        return 130
    out = Path(args.out)
    print(f"\n{len(graded)} submissions graded: {out / 'grades.csv'}, {out / 'summary.txt'}, "
          f"{out / 'summary.png'}, and {out / 'students'}/STUDENT/results.json\n")
    print((out / "summary.txt").read_text(), end="")
    return 0


def cmd_autograder(args) -> int:
    from .teach.autograder import make_zip
    try:
        out = make_zip(args.names, Path(args.out))
    except (RuntimeError, OSError, KeyError) as e:
        print(f"python -m learn autograder: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}: upload it as a Gradescope programming assignment's autograder (Configure Autograder, "
          f"Zip file upload); students submit {', '.join(f'{n}.py' for n in args.names)}")
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
        print("python -m learn show: the step-through page (learn/page.py) is not in this copy of handgrad yet",
              file=sys.stderr)
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
        print("python -m learn trace: the model trace (learn/trace.py) is not in this copy of handgrad yet",
              file=sys.stderr)
        return 2
    return main(argv)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m learn", description="Learn backpropagation by writing it: "
                                "exercises, a checker that names the mistake, training beside handgrad's layers.")
    p.add_argument("--exercises", metavar="DIR", help="a teacher's own exercises (NAME.py and NAME_spec.py in DIR) "
                                                       "beside the built-in ones, for every command")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = list(BY_NAME)

    s = sub.add_parser("list", help="the exercises, in order, and what each teaches")
    s.set_defaults(run=cmd_list)
    s = sub.add_parser("start", help="write an exercise to fill in (NAME.py)")
    s.add_argument("name", choices=names, metavar="NAME")
    s.add_argument("--out", help="the file to write (default NAME.py, NAME.ipynb with --notebook, in "
                                 "~/handgrad-learn or $HANDGRAD_LEARN_DIR)")
    s.add_argument("--solution", action="store_true", help="write the worked solution instead")
    s.add_argument("--notebook", action="store_true", help="write a Jupyter notebook, the check as its last cell")
    s.add_argument("--nbgrader", action="store_true", help="a teacher's: with --notebook, nbgrader's source "
                                                           "notebook (solution marked, the check a graded cell)")
    s.add_argument("--points", type=float, default=1, help="with --nbgrader: the check cell's points (default 1)")
    s.add_argument("--force", action="store_true", help="replace the file if it exists")
    s.set_defaults(run=cmd_start)
    s = sub.add_parser("hint", help="a hint; --level 2 and 3 say more")
    s.add_argument("name", choices=names, metavar="NAME")
    s.add_argument("--level", type=int, default=1, help="1 (where to look) to 3 (nearly the answer)")
    s.set_defaults(run=cmd_hint)
    s = sub.add_parser("check", help="check your file against PyTorch and name the mistake (exit 0 right, 1 "
                                     "wrong, 2 unusable file)")
    s.add_argument("name", choices=names, metavar="NAME")
    s.add_argument("file", nargs="?", help="your NAME.py or NAME.ipynb (default: NAME.py in the folder learn start "
                                           "writes to)")
    s.add_argument("--format", choices=("text", "json", "gradescope"), default="text",
                   help="text (the report, default), json (each checked item, the verdict, the named mistakes), or "
                        "gradescope (its results.json: one test per checked item)")
    s.set_defaults(run=cmd_check)
    s = sub.add_parser("grade", help="a teacher's: check a folder of submissions (alice.py, or alice/NAME.py), "
                                     "write grades.csv, each student's results.json and the class's mistakes")
    s.add_argument("name", choices=names, metavar="NAME")
    s.add_argument("folder", metavar="SUBMISSIONS_DIR")
    s.add_argument("--out", required=True, metavar="DIR", help="where grades.csv, summary.txt, summary.png and "
                                                                "students/ go")
    s.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="seconds each submission's check may take (default 30, or $LEARN_CHECK_TIME_LIMIT)")
    s.set_defaults(run=cmd_grade)
    s = sub.add_parser("autograder", help="a teacher's: a Gradescope autograder zip checking these exercises")
    s.add_argument("names", nargs="+", choices=names, metavar="NAME")
    s.add_argument("--out", default="autograder.zip", help="the zip to write (default autograder.zip)")
    s.set_defaults(run=cmd_autograder)
    s = sub.add_parser("progress", help="which exercises pass (kept in .handgrad-progress.json) and what is next")
    s.add_argument("--dir", default=None, help="the folder of your files (default: the work folder start writes into)")
    s.add_argument("--recheck", action="store_true", help="check the recorded files, and NAME.py files, again")
    s.set_defaults(run=cmd_progress)
    s = sub.add_parser("why", help="why the backward is right: its derivation with shapes, and where to read more")
    s.add_argument("name", choices=names, metavar="NAME")
    s.set_defaults(run=cmd_why)
    s = sub.add_parser("train", help="train your answer beside a trusted twin, the same weights and batches "
                                     "(exit 0 when they agree, 1 when they part)")
    s.add_argument("name", metavar="NAME")
    s.add_argument("file")
    s.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    s.add_argument("--plot", help="draw both loss curves into this PNG file")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for torch (default: the cores the load average leaves free)")
    s.set_defaults(run=cmd_train)
    s = sub.add_parser("show", help="write the step-through page of backpropagation (one HTML file)")
    s.add_argument("--out", help="the HTML file to write (default backprop.html in ~/handgrad-learn or "
                                 "$HANDGRAD_LEARN_DIR)")
    s.add_argument("--seed", type=int, default=0, help="the seed of the XOR network's weights")
    s.set_defaults(run=cmd_show)
    sub.add_parser("trace", help="one training step of a model, layer by layer (its options: trace --help)",
                   add_help=False)  # main() hands everything after "trace" to learn.trace.main
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
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
