"""One recipe per result of the paper, one module each, found from its file by
``sameloss.registry`` (nothing else to edit to add one; plugins add more through
``registry.register_recipe``). Each module begins with the command that runs it, its
runtime per scale and the result it expects, and reads as: ``SUMMARY`` (its line in
``sameloss reproduce --help``), ``TITLE`` (the report's heading), ``PRESETS`` (its typed
settings per scale: smoke, tiny, small, paper), ``runs(preset, language, seed)`` (the
``RunSpec``s it trains) and ``report(study, preset)`` (trains and measures them through a
``core.Study`` and returns the report's sections). What recipes share lives in
``common.py`` and ``core.py``; a recipe never imports another (``figure1`` takes the
others through ``core.recipe``)."""
