"""Plain nn.Modules and functions that know nothing of configs: attention, feed-forward, norms,
positions, masks, pooling. Components in ``pentad.components`` assemble them from configs."""
