"""One recipe per result of the paper. Each module begins with the command that runs it,
its runtime per scale and the result it expects, and reads as: ``PRESETS`` (its typed
settings per scale: smoke, tiny, small, paper), ``runs(preset, language, seed)`` (the
``RunSpec``s it trains) and ``report(study, preset)`` (trains and measures them through a
``core.Study`` and returns the report's sections); ``TITLE`` heads the report. What recipes
share lives in ``common.py`` and ``core.py``: a recipe never imports another (``figure1``,
which is the other three together, excepted)."""

from . import algorithms, dyck, figure1, isoloss, sizes, steps, text, theory

RECIPES = {"steps": steps, "sizes": sizes, "algorithms": algorithms, "figure1": figure1, "isoloss": isoloss,
           "text": text, "theory": theory, "dyck": dyck}

__all__ = ["RECIPES", "algorithms", "dyck", "figure1", "isoloss", "sizes", "steps", "text", "theory"]
