"""The run's runtime, between the workers and the Prefect tasks: Prefect's settings, artifacts and flow-run state, the
one-driver run lock, interrupts and the orphan guard of an embedded server; and what a run shows in a terminal
(progress lines, plots, in-process SFT with a progress bar)."""
