"""Downstream tasks: reader + head + metric + prediction writer, one per file."""

from pentad.tasks import chid, classification, multiple_choice, ner, qa, simcse, text2text  # noqa: F401
