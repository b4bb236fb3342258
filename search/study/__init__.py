"""Running a study: the driver, its executors, the searcher and controllers, trials and their reports."""
