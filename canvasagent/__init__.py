"""CanvasAgent: a multimodal agent that creates and edits images by orchestrating visual tools."""

__version__ = "0.1.0"
