"""The statistics every study's verdicts read: intervals, tests, power and Holm
(``inference.py``), the paired fork design's estimates at the target KL (``paired.py``,
``weighted.py``), flatness as a treatment (``dose_response.py``), pooling across languages
(``pooling.py``, ``replication.py``) and the seeds a design plans (``allocation.py``)."""
