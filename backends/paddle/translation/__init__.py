"""The pieces of :mod:`unitrain.backends.paddle.translate` (PaConvert's output made to run as
torch's code did): the rewriting of the translated text and syntax tree (:mod:`.rewrite`), and the
substitutes that translated code calls, reached through the translate module: torch's tensor
methods (:mod:`.tensor_methods`), its functional activations (:mod:`.functional`) and its layers
(:mod:`.layers`). No paddle import at module level: the translate module loads without it."""
