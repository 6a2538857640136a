"""The loop's core: what every application drives or reads, importing only `toolserver` below it.

`protocol` (reply parsing, system prompt), `assets` (the asset store), `tasks`, `trajectory`,
`episode` (the one loop), `imageio`, `image_budget` (which tool images a prompt keeps),
`llm_client` (OpenAI-compatible chat), `formats` (public dataset formats), `models` (checkpoint
loading, the tiny offline model), `plotting` (headless figures) and `policies` (the policies that
drive the loop).
"""
