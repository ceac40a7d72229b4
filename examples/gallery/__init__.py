"""Models written in plain PyTorch, the way people write them, for ``model.paddle=convert``."""
