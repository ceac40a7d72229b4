"""The PaddlePaddle backend: paddle.nn models, paddle.io loaders, Fleet collective, paddle.amp."""

import warnings

# Paddle warns about a missing ccache on every import (it only matters for building C++
# extensions, which unitrain never does); keep it out of users' logs.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
# BatchNorm repeats on every training forward that it tracks running statistics, which is the
# documented behaviour both backends share.
warnings.filterwarnings("ignore", message="When training, we now always track global mean and variance")

from unitrain.backends.paddle.backend import PaddleBackend as Backend  # noqa: E402

__all__ = ["Backend"]
