"""One recipe per result of the paper, one module (or one package: ``isoloss/``) each,
found from its file or folder by ``sameloss.registry`` (nothing else to edit to add one;
plugins add more through ``registry.register_recipe``). Each begins with the command that
runs it, its runtime per scale and the result it expects, and reads as: ``SUMMARY`` (its
line in ``sameloss reproduce --help``), ``TITLE`` (the report's heading), ``PRESETS`` (its
typed settings per scale: smoke, tiny, small, paper), ``runs(preset, language, seed)`` (the
``RunSpec``s it trains), ``units(setup, preset)`` (its study declared: ``declare.py``'s
units of runs, forks and measures, which the engine runs, plans or shards) and
``report(records, preset)`` (the report's sections from what the units measured:
``engine.Records``; it trains and measures nothing). What recipes share lives in
``presets/common.py``; a recipe never imports another (``figure1`` takes the others by
name: ``sameloss.registry.recipe``) nor anything of ``training/``."""
