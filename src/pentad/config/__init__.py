"""Schema tools: the strict base model, unions from registries, the schema walk, reading config files with
overrides and reporting validation problems, and the model-level and stream sections. The run config
itself is assembled on higher floors (``pentad.run_config``, ``pentad.assembly``)."""
