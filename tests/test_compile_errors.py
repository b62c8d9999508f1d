"""Errors raised while a step compiles reach the caller as the eager step's: the same exception type and message
(``except ValueError`` still catches a handgrad check), and the state is left as the failed step found it."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import optimizers
from layers import Dropout, Linear, ReLU, Sequential
from losses import CrossEntropyLoss
from training.compiled import compile_step

F64 = torch.float64


def _setup():
    torch.manual_seed(0)
    model = Sequential(Linear(4, 6, dtype=F64), ReLU(), Dropout(0.3), Linear(6, 3, dtype=F64))
    opt = optimizers.Adam(model.parameters(), lr=1e-2)
    crit = CrossEntropyLoss()

    def step(x, y, change_in_place=False):
        opt.zero_grad(set_to_none=False)
        out = model(x)
        loss = crit(out, y)
        if change_in_place:
            x.mul_(10)  # torch.autograd refuses this: the first Linear's dW would come from the changed x
        model.backward(crit.backward(), need_input_grad=True)
        opt.step()
        return loss

    return model, opt, step


def _raised(fn, *args) -> BaseException:
    with pytest.raises(Exception) as e:
        fn(*args)
    return e.value


CASES = {
    "class out of range": lambda: (torch.randn(5, 4, dtype=F64), torch.tensor([0, 1, 2, 3, 1]), False),
    "in-place change": lambda: (torch.randn(5, 4, dtype=F64), torch.tensor([0, 1, 2, 0, 1]), True),
    "wrong input shape": lambda: (torch.randn(5, 7, dtype=F64), torch.tensor([0, 1, 2, 0, 1]), False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_compiled_steps_error_is_the_eager_steps_type_and_message(case):
    _, _, eager_step = _setup()
    torch.manual_seed(1)
    eager = _raised(eager_step, *CASES[case]())
    model, opt, step = _setup()
    torch._dynamo.reset()
    plain = _raised(torch.compile(step, fullgraph=True, backend="aot_eager"), *CASES[case]())
    assert (type(plain), str(plain)) != (type(eager), str(eager))  # what torch.compile alone gives
    model, opt, step = _setup()
    run = compile_step(step, model, opt, backend="aot_eager")
    torch._dynamo.reset()
    run(torch.randn(5, 4, dtype=F64), torch.tensor([0, 1, 2, 0, 1]))  # a good step first, compiled; then the bad one
    before = [t.clone() for t in (*model.parameters(), *(p.grad for p in model.parameters()))]
    moments = [v.clone() for s in opt.state.values() for v in s.values()]
    got = _raised(run, *CASES[case]())
    assert type(got) is type(eager) and str(got) == str(eager)
    assert "\n" not in str(got) and repr(got.__context__) == repr(eager.__context__)  # not the compiler's
    after = [*model.parameters(), *(p.grad for p in model.parameters())]
    assert all(
        torch.equal(a, b) for a, b in zip(before, after, strict=True)
    )  # the eager run that found it left no trace
    assert all(
        torch.equal(a, v) for a, v in zip(moments, [v for s in opt.state.values() for v in s.values()], strict=True)
    )


def test_the_eager_run_that_finds_the_error_leaves_weights_moments_and_random_state_alone():
    from training.compiled import _eager_error

    model, opt, step = _setup()
    step(torch.randn(5, 4, dtype=F64), torch.tensor([0, 1, 2, 0, 1]))  # moments and .grad to keep
    before = [
        t.clone()
        for t in (
            *model.parameters(),
            *(p.grad for p in model.parameters()),
            *(v for s in opt.state.values() for v in s.values()),
        )
    ]
    x, y, _ = CASES["in-place change"]()
    good = torch.randn(5, 4, dtype=F64)
    model[2].generator = torch.Generator().manual_seed(7)  # a dropout layer's own generator is put back too
    own = model[2].generator.get_state()
    rng = torch.random.get_rng_state()
    assert isinstance(_eager_error(step, (x, y, True), model, opt), RuntimeError)
    assert _eager_error(step, (good, y), model, opt) is None  # a good step: ran, undone
    after = [
        *model.parameters(),
        *(p.grad for p in model.parameters()),
        *(v for s in opt.state.values() for v in s.values()),
    ]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert torch.equal(torch.random.get_rng_state(), rng)  # the dropout masks it drew are drawn again next step
    assert torch.equal(model[2].generator.get_state(), own)


def test_a_good_compiled_step_equals_the_eager_one():
    model_e, _, step_e = _setup()
    model_c, opt_c, step_c = _setup()
    run = compile_step(step_c, model_c, opt_c, backend="aot_eager")
    torch._dynamo.reset()
    for i in range(3):
        x, y = torch.randn(5, 4, dtype=F64, generator=torch.Generator().manual_seed(i)), torch.tensor([0, 1, 2, 0, 1])
        torch.manual_seed(10 + i)
        step_e(x, y)
        torch.manual_seed(10 + i)
        run(x, y)
    for a, b in zip(model_e.parameters(), model_c.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
