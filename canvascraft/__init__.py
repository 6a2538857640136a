"""CanvasCraft: build SFT trajectories and RL task specs by executing tool chains for real.

Chains (`chains`) + image sources (`sources`) -> plans (`plan`) -> instructions (`writers`) ->
execution through `canvasagent.core.episode.run_episode` (`sft`, `rl`) -> QC -> sharded, resumable
datasets (`build`, `formats`) -> reports (`stats`). CLI: `python -m canvascraft --help`.
"""
