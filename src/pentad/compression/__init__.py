"""``pentad compress``: distil, prune and quantize a fine-tuned run into a smaller, faster one
(docs/compress.md). :mod:`.store` reads and writes compressed run directories, :mod:`.quantize` and
:mod:`.prune` are the steps, :mod:`.pipeline` chains them with distillation and recovery fine-tuning."""
