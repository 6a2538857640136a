"""The web UI (Gradio) for interactive sessions; `canvasagent ui` starts it."""
