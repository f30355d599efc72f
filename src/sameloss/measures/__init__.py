"""Measures that turn a checkpoint into the numbers the paper compares.

* ``curvature``: trace of the Hessian (the paper's Fisher estimator with labels sampled
  from the model, and Hutchinson on the loss with the true tokens), top eigenvalue,
  SAM sharpness;
* ``probe``: linear probe on frozen features (AdamW as the paper, or exact L-BFGS);
* ``finetune``: the whole encoder plus a head;
* ``lookup``: the look-up-table baseline (a probe on the true conditionals);
* ``tasks``: train/validation/test splits of a language's downstream tasks;
* ``spec``: ``MeasureSpec`` and the registry of measures (``MEASURES``; the built-in ones
  in ``builtin/``, one module each);
* ``run``: all of the above for every checkpoint of a run (``sameloss measure``).
"""

from .curvature import (CurvatureResult, FisherContexts, FixedBatch, sam_sharpness, top_eigenvalue, trace_fisher,
                        trace_hutchinson)
from .finetune import finetune
from .lookup import lookup_features, lookup_table_probe
from .probe import DownstreamResult, ProbeSettings, linear_probe, probe_features
from .run import MeasureSpec, measure_checkpoint, measure_path, write_rows
from .spec import MEASURES, Measure
from .tasks import TaskData, make_task_data

__all__ = ["CurvatureResult", "DownstreamResult", "FisherContexts", "FixedBatch", "MEASURES", "Measure", "MeasureSpec",
           "TaskData", "finetune", "linear_probe", "lookup_features", "lookup_table_probe", "make_task_data",
           "measure_checkpoint", "measure_path", "ProbeSettings", "probe_features", "sam_sharpness", "top_eigenvalue",
           "trace_fisher", "trace_hutchinson", "write_rows"]
