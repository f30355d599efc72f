"""What recipes share: the settings per scale, the preset types and the reference run
(``common.py``), and the causal-LM panels (``causal.py``)."""
