"""Prefect flows and the forgeflow CLI entry point."""
