"""Checkpoint conversion to SkipV1: plan, lazy reader, atomic writer, initialisations."""

from .api import convert_checkpoint

__all__ = ["convert_checkpoint"]
