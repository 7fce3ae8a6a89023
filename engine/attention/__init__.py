"""Attention as the model calls it: the plan of a step (which rows share a trunk, which are private), built once per
step from the block tables. The AttentionBackend interface and its reference, CPU and Triton implementations belong
here too."""
