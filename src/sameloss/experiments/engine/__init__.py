"""The engine: what a recipe declares (``declare.py``) and what a recipe is (``recipe.py``),
the one engine that walks the declaration (``walk.py``) over the experiment's ``Study``
(``core.py``), its folder (``layout.py``, ``folder.py``), the launchers that run its units
(``launch.py``, ``dispatch.py``, ``ensembles.py``, ``study_log.py``), the dry plan and its cost
model (``plan.py``, ``hardware.py``) and ``reproduce`` itself (``orchestrate.py``)."""
