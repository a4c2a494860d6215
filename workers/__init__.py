"""forgeflow workers layer (see DESIGN.md)."""
