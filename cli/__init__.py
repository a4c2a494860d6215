"""forgeflow command line (see DESIGN.md): the `forgeflow` entry point, reports, deploy, the UIs.

Prefect is configured before anything imports it.
"""

from runtime.prefect_env import configure_prefect

configure_prefect()
