"""Readers and writers for trajectory formats (ours and the public CanvasAgent ones)."""
