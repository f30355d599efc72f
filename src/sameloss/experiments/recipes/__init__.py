"""One recipe per result of the paper. Each module begins with the command that runs it,
its runtime per preset and the result it expects, and holds ``PRESETS`` (smoke, tiny,
small, paper), ``TITLE`` and ``collect(ctx, preset, seed)``."""

from . import algorithms, figure1, sizes, steps

RECIPES = {"steps": steps, "sizes": sizes, "algorithms": algorithms, "figure1": figure1}

__all__ = ["RECIPES", "algorithms", "figure1", "sizes", "steps"]
