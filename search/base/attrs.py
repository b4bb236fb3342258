"""The Optuna user attributes cramnas stores, once: every reader and writer names them from here.

The strings are the stored keys of every existing study database, so none may change.
"""

from __future__ import annotations

from space.draw import INFEASIBLE as INFEASIBLE  # written by the space's draw, which never imports search

# ---- a trial's ----
ARCH = "arch"  # ArchConfig.to_dict() of the drawn architecture
FINGERPRINT = "fingerprint"  # ArchConfig.fingerprint(): how a repeat finds its original
METRICS = "metrics"  # every number the trial recorded (search.study.report.TrialReport.recorded_metrics)
INTERMEDIATE = "intermediate"  # the [report index, train loss] curve of its progress reports
FAILURE_REASON = "failure_reason"  # why a failed trial failed (controllers.DRIVER_DIED: the driver's death)
REPEAT_OF = "repeat_of"  # the complete trial that trained this architecture; its metrics are told again
RERUN_OF = "rerun_of"  # the trial the driver's death cut short that this one trains again
GENERATION, PARENT_TRIAL, MUTATION = "generation", "parent_trial", "mutation"  # evolution's, set by its sampler
# The study's first draw (search.study.warm_start): a warm start names where it came from (a hand design
# such as `sized-cpu`, or `study:NAME#7`); a trial of the covering design is `cover`.
WARM_START = "warm_start"
FIRST_DRAW = "first_draw"
# A screened study's trial (search.study.screen): the trial of its screen whose architecture it crams whole.
PROMOTED_FROM = "promoted_from"
LINEAGE = (GENERATION, PARENT_TRIAL, MUTATION, WARM_START, FIRST_DRAW, PROMOTED_FROM)  # what a re-run keeps of its original

# ---- the study's (search.study.controllers.open_study, search.study.driver) ----
CONTROLLER, OBJECTIVE, SPACE, SEED = "controller", "objective", "space", "seed"  # checked again on --resume
TRAIN, BUDGET = "train", "budget"  # TrainConfig.to_dict() and the budget's text, for search.export
STARTUP = "startup_trials"  # the first draw's size: the samplers' start-up, read again on --resume
SCREEN = "screen"  # a screened study's screen: its factor N (search.study.screen), read again on --resume
PROMOTE = "promote"  # and the share it promotes, the best 1/M; a screen without it promoted 1/N
