"""Downstream tasks: reader + head + metric + prediction writer, one per file."""

from pentad.tasks import classification, ner, qa, simcse, text2text  # noqa: F401
