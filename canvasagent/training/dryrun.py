"""`--dry-run`: what a run needs, built and reported before any weights load.

`dry_run(cfg)` runs the preflight, then builds everything a run needs except the weights (tool
env and schemas, reward, TRL arguments, data rows, the model's config/processor when cached)
and reports it; `ok` is true only when the preflight found nothing.
"""

from __future__ import annotations

from typing import Any

from canvasagent.training.common import peft_config, validate_launcher, workspace
from canvasagent.training.config import TINY, TrainConfig
from canvasagent.training.env import load_tools_config
from canvasagent.training.preflight import preflight
from canvasagent.training.sources import source_of


def dry_run(cfg: TrainConfig) -> dict[str, Any]:
    source = source_of(cfg)
    report: dict[str, Any] = {"kind": cfg.kind}
    problems = preflight(cfg)
    try:
        report["launcher"] = validate_launcher(cfg)
    except (OSError, ValueError):
        report["launcher"] = None  # in problems already
    warnings: list[str] = []
    try:
        tc = load_tools_config(cfg)
        report["toolbox"] = {"client": tc.client, "profile": tc.profile, "backends": sorted(tc.backends)}
    except FileNotFoundError as e:
        warnings.append(f"tools config: {e}")
    ws = workspace(cfg, build_model=False)
    report["tools"] = sorted(ws.env_cls.tool_names)  # TRL lists an env's tools by name, as ws.tool_fns
    from transformers.utils import get_json_schema

    report["tool_schemas"] = [get_json_schema(f)["function"]["name"] for f in ws.tool_fns]

    # TRL arguments (DeepSpeed checked above as a file: building args with it needs deepspeed installed).
    if cfg.kind == "sft":
        from canvasagent.training.sft import sft_args

        args = sft_args(cfg, with_deepspeed=False)
    else:
        from canvasagent.training.grpo import grpo_args
        from canvasagent.training.rewarding import TRLRewards

        # The source's scorer, as training builds it, without a toolbox: never connect to a remote one here.
        scorer = source.scorer(cfg, None)
        rewards = TRLRewards(scorer)
        report["reward"] = {"source": scorer.source, "components": rewards.names, "weights": rewards.weights()}
        args = grpo_args(cfg, rewards.weights(), with_deepspeed=False)
        report["grpo"] = {"num_generations": args.num_generations, "beta": args.beta,
                          "max_tool_calling_iterations": args.max_tool_calling_iterations, "use_vllm": args.use_vllm}
    report["trl_args"] = {"class": type(args).__name__, "learning_rate": args.learning_rate, "max_steps": args.max_steps,
                          "per_device_train_batch_size": args.per_device_train_batch_size}

    if cfg.lora.enabled:
        report["lora"] = repr(peft_config(cfg))

    # Data: what the source reports (cheap rows are built; files are only checked to exist).
    report["data"] = source.dry_run_data(cfg, ws.toolbox_factory)

    # The model: config + processor when available offline, never the weights.
    ref = ws.model_path
    if cfg.model.name_or_path == TINY and not (cfg.kind == "grpo" and cfg.run.init_from):
        report["model"] = {"ref": "tiny", "note": "built at train time"}
    else:
        try:
            from transformers import AutoConfig

            mc = AutoConfig.from_pretrained(ref)
            report["model"] = {"ref": ref, "model_type": mc.model_type}
            from canvasagent.core.models import load_processor
            from canvasagent.training.messages import system_text

            proc = load_processor(ref)
            report["model"]["system_prompt_chars"] = len(system_text(proc, ws.tool_fns, cfg.tools.family))
        except OSError as e:
            report["model"] = {"ref": ref, "skipped": f"not available offline ({type(e).__name__})"}
    return {**report, "warnings": warnings, "problems": problems, "ok": not problems}
