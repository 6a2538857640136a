"""The visual toolbox: the tool registry, tool implementations, model backends and serving."""
