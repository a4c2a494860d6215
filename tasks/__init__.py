"""forgeflow tasks layer (see DESIGN.md)."""
