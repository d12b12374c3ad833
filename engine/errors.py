"""User-facing errors: every message names the problem and the fix. No MLX import here."""


class DFlashError(Exception):
    """Base class: the message is meant for the user, as-is."""


class ModelNotAvailable(DFlashError):
    """Weights are not local and cannot be fetched (offline, unknown id, no access)."""


class UnsupportedModel(DFlashError):
    """A target family or pair that the engine has no adapter or registered draft for."""


class DraftCheckpointError(DFlashError):
    """A draft folder whose config or weights are missing, corrupt or inconsistent."""


class PairingError(DFlashError):
    """Target and draft that cannot work together (sizes, vocab, taps, mask id)."""


class PromptError(DFlashError):
    """A prompt the engine cannot use (empty, wrong type, no chat template)."""


class ConfigError(DFlashError, ValueError):
    """A setting out of range (block size, max_ctx, dtype)."""
