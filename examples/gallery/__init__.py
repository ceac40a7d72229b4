"""Models written in plain PyTorch, the way people write them, for ``model.paddle=convert``.

Image classifiers take ``build(num_classes, image_size, ...)``; the language models (``char_lm``,
``char_rnn``) take ``build(vocab_size, block_size, ...)`` and train with ``data=text``
(docs/models.md, "A language model of your own")."""
