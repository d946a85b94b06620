"""Uptraining: recipe schema, data packing, the DeepSpeed loop, checkpoint/resume, export."""
