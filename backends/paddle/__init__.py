"""The PaddlePaddle backend: paddle.nn models, paddle.io loaders, Fleet, paddle.amp, Paddle Inference.

Importing this package imports no paddle: each module does, when it is loaded
(:mod:`unitrain.interface.modules`), apart from ``launch``, ``validation`` and ``weights``.
"""

import warnings

# Paddle warns about a missing ccache on every import (it only matters for building C++
# extensions, which unitrain never does); keep it out of users' logs.
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
# BatchNorm repeats on every training forward that it tracks running statistics, which is the
# documented behaviour both backends share.
warnings.filterwarnings("ignore", message="When training, we now always track global mean and variance")
