"""forgeflow tasks layer (see DESIGN.md). Prefect is configured before anything imports it."""

from runtime.prefect_env import configure_prefect

configure_prefect()
