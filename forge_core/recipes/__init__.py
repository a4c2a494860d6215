"""In-process recipes: the GRPO iteration's step functions and the SFT/GRPO loops built from them."""
