"""cramnas: GLUE transfer of crammed checkpoints.

`glue.probe` is the quick, capped fine-tuning every search trial ends with; `glue.evaluate` is
Cramming's full GLUE_sane protocol (`python -m glue.evaluate`; not imported here, so that running
it as a module does not import it twice); `glue.linear_probe` fits logistic or ridge regression on
an encoder's frozen features, without fine-tuning. Tasks, metrics and the GLUE-average rule: `glue.tasks`.
"""

from glue.finetune import SANE, FinetuneSettings
from glue.linear_probe import LinearProbeResult, linear_probe
from glue.runner import DEFAULT_PROBE_TASKS, ProbeLimits, ProbeResult, probe
from glue.tasks import TASKS, GlueError, Task, glue_average

__all__ = ["DEFAULT_PROBE_TASKS", "SANE", "TASKS", "FinetuneSettings", "GlueError", "LinearProbeResult", "ProbeLimits",
           "ProbeResult", "Task", "glue_average", "linear_probe", "probe"]
