"""The transformers classes of an exported cramnas model (`python -m trainer.export_hf`).

These modules are real cramnas modules (tests import them directly), and they are also the source
of the remote code in every export: `trainer.export_hf` copies them, and every cramnas module they
import (`trainer.model`, `space.arch`, ...), into the export directory with those imports made
relative, so the model a transformers user loads is built by the very code cramnas trains.
"""
