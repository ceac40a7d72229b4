"""The PyTorch backend: torch.nn models, torch.utils.data loaders, DDP, torch.amp, torch.export.

Importing this package imports no torch: each module does, when it is loaded
(:mod:`unitrain.interface.modules`), apart from ``launch``, ``validation`` and ``weights``.
"""
