"""What a study writes for its reader: the Markdown report, its tables and CSV files
(``document.py``), claim sentences (``claims.py``), ``sameloss plan``'s text (``plan.py``),
training curves (``curves.py``, ``sameloss plot``) and the figures (``plots/``)."""
