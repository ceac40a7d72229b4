"""The parts of :mod:`unitrain.model.translate` (``model.<backend>=convert``) that stand on their
own: the user's code a factory path names (:mod:`.source`) and the conversion cache's entries
(:mod:`.cache`)."""
