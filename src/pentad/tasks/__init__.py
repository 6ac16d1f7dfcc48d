"""Downstream tasks: reader + head + metric + prediction writer, one per file."""

from pentad.tasks import (  # noqa: F401
    asr,
    chid,
    classification,
    image_classification,
    image_text,
    image_text_match,
    multi_label,
    multi_task,
    multiple_choice,
    ner,
    prompt,
    qa,
    ranking,
    regression,
    siamese,
    simcse,
    text2text,
)
