"""``sameloss language search``: languages with headroom, found by screening draws of a
family's settings and training the promising ones (``screen.py``), and its tables
(``tables.py``)."""
