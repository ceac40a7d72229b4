"""The PaddlePaddle backend: paddle.nn models, paddle.io loaders, Fleet, paddle.amp, Paddle Inference.

Importing this package imports no paddle: each module does, when it is loaded
(:mod:`unitrain.interface.modules`), apart from ``launch``, ``validation`` and ``weights``.
"""

#: Warnings importing paddle gives that say nothing to a unitrain user, silenced while a module of
#: this backend is loaded (only then: no filter outlives the import): a missing ccache matters
#: only to building C++ extensions, which unitrain never does.
QUIET_ON_IMPORT = ("No ccache found",)
