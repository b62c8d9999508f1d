"""A teacher's own exercise, found by ``--exercises DIR``, checked, hinted and graded as the built-in ones are.

An exercise is two files in DIR: ``NAME.py``, the worked solution with its answer between ``### BEGIN SOLUTION``
and ``### END SOLUTION`` (``learn start`` cuts the stub from it, as for the built-in ones; students need not
have it), and ``NAME_spec.py``, what the checker needs:

    CLASS = "Swish"                                # the class the learner writes
    INPUTS = {"x": (4, 6)}                         # the forward's inputs, in order: name -> shape (float64)
    PARAMS = {}                                    # parameters: name -> shape, set by the checker, .grad checked
    CTOR = {"beta": 1.5}                           # the constructor's keyword arguments
    def reference(x, beta):                        # the forward in torch, from inputs, parameters and CTOR by
        return x * torch.sigmoid(beta * x)         # name: autograd gives every expected gradient
    MISTAKES = [("swish-no-product-rule", "dx", "dout * beta * s * (1 - s)", "why it is wrong",
                 lambda c: c.dout * c.beta * torch.sigmoid(c.beta * c.x) * (1 - torch.sigmoid(c.beta * c.x)))]

optional: ``TEACHES`` (one line for ``learn list``), ``HINTS`` (up to three, ``learn hint``), ``WHY`` (the
derivation, ``learn why``), ``OUTPUTS`` (the names of what forward returns, when ``reference`` returns a tuple),
``WHERE`` (tensor -> the line to look at).  A mistake's replay gets ``c``: every input, parameter and CTOR value,
each output and its ``d<output>``, by name; it returns the tensor the wrong formula gives.  The checker runs
the default shapes, one example (the first dimension 1), and a second draw, the learner's code in its sandbox.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path

from ..exercises import BY_NAME, EXERCISES, Exercise
from ..mistakes import Mistake

SPEC_SUFFIX = "_spec.py"


class ExerciseError(ValueError):
    """A teacher's exercise that cannot be used: the message names the file and what is wrong."""


@dataclass(frozen=True)
class CustomExercise(Exercise):
    folder: Path = Path(".")

    @property
    def source(self) -> Path:
        return self.folder / f"{self.name}.py"


def _load(path: Path) -> types.ModuleType:
    module = types.ModuleType(f"_exercise_spec_{path.stem}")
    module.__file__ = str(path)
    try:
        exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    except Exception as e:
        raise ExerciseError(f"{path} raised {type(e).__name__} while it was loaded: {e}") from None
    return module


def _shape(path: Path, what: str, shape) -> tuple[int, ...]:
    if not (isinstance(shape, (tuple, list)) and all(isinstance(s, int) and s > 0 for s in shape)):
        raise ExerciseError(f"{path}: {what} must be a shape, a tuple of positive ints; got {shape!r}")
    return tuple(shape)


def layer_spec(name: str, m: types.ModuleType, path: Path):
    """The checker's LayerSpec from a spec module (the module docstring's fields)."""
    from ..checker.spec import LayerSpec, normal, wrong

    for field in ("CLASS", "INPUTS", "reference"):
        if not hasattr(m, field):
            raise ExerciseError(
                f"{path} has no {field}; a spec needs CLASS, INPUTS and reference (see "
                f"docs/learn.md, A teacher's own exercise)"
            )
    if not callable(m.reference):
        raise ExerciseError(f"{path}: reference must be a function of the inputs, parameters and CTOR, by name")
    inputs = {n: _shape(path, f"INPUTS[{n!r}]", s) for n, s in dict(m.INPUTS).items()}
    params = {n: _shape(path, f"PARAMS[{n!r}]", s) for n, s in dict(getattr(m, "PARAMS", {})).items()}
    ctor = dict(getattr(m, "CTOR", {}))
    clash = set(inputs) & set(params) | (set(inputs) | set(params)) & set(ctor)
    if clash:
        raise ExerciseError(f"{path}: {', '.join(sorted(clash))} named twice among INPUTS, PARAMS and CTOR")
    outputs = tuple(getattr(m, "OUTPUTS", ("out",)))

    def reference(t):
        got = m.reference(**{n: getattr(t, n) for n in (*inputs, *params, *ctor)})
        got = got if isinstance(got, (tuple, list)) else (got,)
        if len(got) != len(outputs):
            raise ExerciseError(f"{path}: reference returned {len(got)} tensors; OUTPUTS names {len(outputs)}")
        return dict(zip(outputs, got, strict=True))

    def draw(shapes):
        return lambda g: {n: normal(g, *s) for n, s in shapes.items()}

    def normal_of(shape):  # one parameter's draw, its shape bound here rather than read from a loop later
        return lambda g: normal(g, *shape, std=0.5, mean=0.1)

    one = {n: (1, *s[1:]) for n, s in inputs.items()}
    mistakes = []
    for k, entry in enumerate(getattr(m, "MISTAKES", [])):
        if isinstance(entry, Mistake):
            mistakes.append(entry)
        elif isinstance(entry, (tuple, list)) and len(entry) == 5 and callable(entry[4]):
            mistakes.append(wrong(*entry))
        else:
            raise ExerciseError(f"{path}: MISTAKES[{k}] must be (key, tensor, formula, why, replay function)")
    return LayerSpec(
        name=name,
        cls=m.CLASS,
        ctor=ctor,
        params={n: normal_of(shape) for n, shape in params.items()},
        inputs=draw(inputs),
        reference=reference,
        mistakes=mistakes,
        where=dict(getattr(m, "WHERE", {})),
        configs=[
            {"label": "one example (the first dimension 1)", "inputs": draw(one)},
            {"label": "a second draw of the inputs", "inputs": draw(inputs)},
        ],
    )


def _hints(name: str, m, spec) -> list[str]:
    given = [str(h) for h in getattr(m, "HINTS", [])][:3]
    if given:
        return given
    shapes = "; ".join(f"{n} {tuple(s)}" for n, s in dict(m.INPUTS).items())
    return [
        f"Write {m.CLASS}.forward, keeping on self what backward needs; then backward: each gradient is the "
        f"gradient arriving from above times the local derivative (the chain rule).  The inputs: {shapes}; "
        f"each gradient has the shape of its tensor, and a parameter's is added into its .grad."
    ]


def register(folder) -> list[str]:
    """Find the teacher's exercises in ``folder`` and add them to every command's registry; -> their names."""
    from ..checker.specs import SPECS
    from ..derivations import DERIVATIONS, Derivation
    from ..hints import HINTS

    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise ExerciseError(f"--exercises {folder}: not a folder")
    names = []
    for path in sorted(folder.glob(f"*{SPEC_SUFFIX}")):
        name = path.name[: -len(SPEC_SUFFIX)]
        if name in BY_NAME and not isinstance(BY_NAME[name], CustomExercise):
            raise ExerciseError(f"{path}: {name} is a built-in exercise's name; call yours something else")
        m = _load(path)
        spec = layer_spec(name, m, path)
        ex = CustomExercise(name, m.CLASS, str(getattr(m, "TEACHES", f"a teacher's exercise: {m.CLASS}")), folder)
        if name in BY_NAME:
            EXERCISES.remove(BY_NAME[name])
        EXERCISES.append(ex)
        BY_NAME[name], SPECS[name] = ex, spec
        HINTS[name] = _hints(name, m, spec)
        DERIVATIONS[name] = Derivation(
            str(getattr(m, "WHY", "(the teacher wrote no derivation for this one)")),
            None,
            f"{folder / (name + '.py')}: {m.CLASS} (the teacher's)",
            None,
        )
        names.append(name)
    if not names:
        raise ExerciseError(
            f"--exercises {folder}: no NAME{SPEC_SUFFIX} files there (each exercise is NAME.py, "
            f"its solution, and NAME{SPEC_SUFFIX}, its spec)"
        )
    return names


def unregister() -> None:
    """Remove every teacher's exercise from the registries (a test's clean-up)."""
    from ..checker.specs import SPECS
    from ..derivations import DERIVATIONS
    from ..hints import HINTS

    for ex in [e for e in EXERCISES if isinstance(e, CustomExercise)]:
        EXERCISES.remove(ex)
        for table in (BY_NAME, SPECS, HINTS, DERIVATIONS):
            table.pop(ex.name, None)


def is_custom(name: str) -> bool:
    return isinstance(BY_NAME.get(name), CustomExercise)
