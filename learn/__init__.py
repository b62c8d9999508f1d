"""Learn backpropagation by doing it: exercises, a checker, and a page that steps through the chain rule."""
