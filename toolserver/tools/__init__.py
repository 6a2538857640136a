"""Tool implementations. Pure tools live here; model-backed tools live in toolserver.backends."""
