"""Learn backprop by writing it: exercises, a checker that names the mistake, and training beside handgrad's twin.

Run ``python -m learn list`` to begin.  ``learn.exercises`` holds each exercise as one source file whose
``### BEGIN SOLUTION`` / ``### END SOLUTION`` regions are cut out to make the learner's stub;
``learn.checker`` compares a learner's class with torch.autograd and names the mistake; ``learn.train`` trains
the learner's layer beside handgrad's.
"""
