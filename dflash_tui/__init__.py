"""dflash-chat: a Textual chat UI that shows DFlash speculative decoding at work.

Nothing in this package imports MLX: the engine is imported lazily inside the worker thread.
"""

__version__ = "0.1.0"
