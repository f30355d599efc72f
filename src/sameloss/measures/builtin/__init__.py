"""The built-in measures, one module each (or a family of close measures per module), each
registering its ``Measure`` in ``spec.MEASURES`` when imported; ``spec`` imports every
module here the first time the registry is read. A module added here is a new measure:
nothing else needs an edit (see ``measures/spec.py``)."""
