"""Projection workers: fold the session streams into read models, checkpointed, replayable."""
