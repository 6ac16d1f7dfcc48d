"""TencentPretrain (and UER-py), both ways, in one package:

* :mod:`pentad.tencentpretrain.config`: its flat JSON model configs read as pentad run configs
  (``pentad pretrain --config models/bert/base_config.json``); no torch.
* :mod:`pentad.tencentpretrain.checkpoint`: its ``.bin`` checkpoints converted by key map, and a
  pentad run written back as TencentPretrain's three files (``pentad convert``).
"""
