"""forgeflow command line (see DESIGN.md): the `forgeflow` entry point, reports, deploy, the in-process main job.

Prefect is configured before anything imports it.
"""

from infra.prefect_env import configure_prefect

configure_prefect()
