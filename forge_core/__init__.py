"""forge_core: the algorithm layer of forgeflow (pure PyTorch; no orchestration, tracking or database imports)."""

__version__ = "0.1.0"
