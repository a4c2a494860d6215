"""forgeflow infra layer (see DESIGN.md)."""
