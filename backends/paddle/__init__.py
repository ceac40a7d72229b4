"""The PaddlePaddle backend: paddle.nn models, paddle.io loaders, Fleet, paddle.amp, Paddle Inference.

Importing this package imports no paddle: each module does, when it is loaded
(:mod:`unitrain.interface.modules`), apart from ``launch``, ``validation`` and ``weights``.
"""

#: Warnings importing paddle gives that say nothing to a unitrain user, silenced while a module of
#: this backend is loaded (only then: no filter outlives the import, but translate.py's, for the
#: translated code's own `import paddle`): a missing ccache matters only to building C++
#: extensions, which unitrain never does.
QUIET_ON_IMPORT = ("No ccache found",)
#: What importing paddle prints to stderr that a unitrain user cannot act on, sent to the run's log
#: file: paddle advises OMP_NUM_THREADS=1, which unitrain sets to trainer.threads on purpose.
PRINTED_ON_IMPORT = ("WARNING: OMP_NUM_THREADS set to", "PLEASE USE OMP_NUM_THREADS WISELY")
