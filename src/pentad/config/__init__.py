"""Schema tools: the strict base model, unions from registries, the schema walk, reading config files with
overrides and reporting validation problems (with the former ``dual`` two-stream layout rewritten on load),
and the model-level section. The run config itself is assembled on higher floors (``pentad.run_config``,
``pentad.assembly``); the stream section lives beside its component (``pentad.components.stream``)."""
