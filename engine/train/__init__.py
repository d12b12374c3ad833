"""Draft training (`dflash train-draft`): tooling apart from the engine core, which never
imports it. dataset: sequences on disk; prompts / mix: what the target is asked;
generate: the target's batched answers; objective: the DFlash loss; loop: the run."""

from .loop import TrainConfig, train, train_draft_main

__all__ = ["TrainConfig", "train", "train_draft_main"]
