"""The one place a tool is declared: the OpenAI-style schemas, the system prompt's tool section,
the validator (and the rule reward), the TRL environment methods and the Ray Serve deployments
all read this module. Adding a tool means a `ToolSpec` here and an implementation in
`toolserver.tools` or a backend; nothing else keeps a list.

Argument and output names follow the public CanvasAgent code so its trajectories replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable


class ArgType(str, Enum):
    TEXT = "text"  # free text (a prompt, a description, overlay text)
    ASSET = "asset"  # an asset ID from the imglist
    BBOX = "bbox"  # [xmin, ymin, xmax, ymax] in 0-1000, as a JSON array or a string
    POSITION = "position"  # [x, y] in 0-1000, as a JSON array or a string
    CHOICE = "choice"  # one of `choices` (compared as strings, so "90" and 90 match)
    UNIT = "unit"  # a float in [0, 1] (EASEL brush parameters)


class OutputKind(str, Enum):
    IMAGE = "image"  # an RGB image asset
    MASK = "mask"  # a single-channel mask asset
    RGBA = "rgba"  # a cut-out with transparency
    BOXES = "boxes"  # detections, returned as text; no asset is registered
    TEXT = "text"  # plain text (OCR); no asset is registered
    CANVAS = "canvas"  # the EASEL canvas state, updated in place
    NONE = "none"  # control actions (EASEL undo/submit)

    @property
    def registers_asset(self) -> bool:
        return self in (OutputKind.IMAGE, OutputKind.MASK, OutputKind.RGBA)


class Backend(str, Enum):
    PURE = "pure"  # deterministic Python, runs in the caller
    MODEL = "model"  # needs a model backend (GPU in production)
    STATEFUL = "stateful"  # acts on an environment's state (EASEL canvas)


@dataclass(frozen=True)
class ArgSpec:
    name: str
    type: ArgType
    description: str
    required: bool = True
    choices: tuple[Any, ...] = ()
    # For ASSET arguments: which asset kinds are acceptable (empty means any image-like asset).
    asset_kinds: tuple[OutputKind, ...] = ()
    # JSON schema type as the public code declares it (bboxes are typed as strings there).
    json_type: str = "string"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.json_type, "description": self.description}
        if self.choices:
            out["enum"] = list(self.choices)
        if self.type is ArgType.UNIT:
            out["minimum"], out["maximum"] = 0.0, 1.0
        return out


@dataclass(frozen=True)
class Need:
    """Something a call consumes that an input or an earlier call must provide.

    `kind` is what must exist (an asset kind, or BOXES/TEXT that a reply carries as text), `arg`
    the argument that carries it. `when=(arg, value)` limits the need to calls whose `arg` equals
    `value`. `from_task`: the task itself may supply it (an input asset of that kind, or a value the
    instruction states); otherwise only an earlier call of a tool that produces `kind` can.
    """

    kind: OutputKind
    arg: str
    when: tuple[str, Any] | None = None
    from_task: bool = False

    def applies(self, arguments: Any) -> bool:
        return self.when is None or (isinstance(arguments, dict) and arguments.get(self.when[0]) == self.when[1])


def _image_need(arg: str = "image") -> Need:
    return Need(OutputKind.IMAGE, arg, from_task=True)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: tuple[ArgSpec, ...]
    output: OutputKind
    backend: Backend
    family: str = "canvasagent"
    # Relative call cost for the efficiency penalty and for serving placement.
    cost: float = 1.0
    # Tool-specific rule beyond per-argument checks, by name (see toolserver.validation).
    extra_checks: tuple[str, ...] = field(default_factory=tuple)
    # Each side of the output image is this many times the input's (SR: 4), so an output-size
    # limit can be checked before the tool runs. 0: the output size does not follow the input.
    output_scale: int = 0
    # What a call consumes; what it produces is `output` (see `produces`).
    requires: tuple[Need, ...] = ()

    @property
    def produces(self) -> tuple[OutputKind, ...]:
        """The kinds a successful call makes available to later calls (none for control actions)."""
        return () if self.output in (OutputKind.CANVAS, OutputKind.NONE) else (self.output,)

    def needs(self, arguments: Any = None) -> tuple[Need, ...]:
        """The needs that apply to a call with `arguments` (None: the unconditional ones)."""
        return tuple(n for n in self.requires if n.applies(arguments))

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.required)

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    def arg(self, name: str) -> ArgSpec | None:
        return next((a for a in self.args if a.name == name), None)

    def asset_args(self) -> tuple[ArgSpec, ...]:
        return tuple(a for a in self.args if a.type is ArgType.ASSET)

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {a.name: a.schema() for a in self.args},
                    "required": list(self.required),
                },
            },
        }


_IMG = "The image ID (e.g., 'img_1')."
_BBOX = "Coordinates in [xmin, ymin, xmax, ymax] format (0-1000)."


def _image_arg(description: str = _IMG, name: str = "image", **kw: Any) -> ArgSpec:
    return ArgSpec(name, ArgType.ASSET, description, **kw)


def _unit(name: str, description: str) -> ArgSpec:
    return ArgSpec(name, ArgType.UNIT, description, json_type="number")


_CANVASAGENT_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "ImageGeneration",
        "Generates a high-quality image from scratch based on a descriptive text prompt.",
        (ArgSpec("prompt", ArgType.TEXT, "A detailed, descriptive prompt specifying style, composition, and subject."),),
        OutputKind.IMAGE,
        Backend.MODEL,
        cost=3.0,
    ),
    ToolSpec(
        "ImageEdit",
        "Modifies an existing image (adding/removing objects, changing styles). Requires a reference image.",
        (
            _image_arg("The ID of the image to modify."),
            ArgSpec("edit_prompt", ArgType.TEXT, "Instructions for the specific changes desired."),
            ArgSpec(
                "masked_image",
                ArgType.ASSET,
                "Optional: A mask image ID to localize the edit region.",
                required=False,
                asset_kinds=(OutputKind.MASK,),
            ),
        ),
        OutputKind.IMAGE,
        Backend.MODEL,
        cost=3.0,
        requires=(_image_need(),),
    ),
    ToolSpec(
        "Grounding",
        "Locates specific objects and returns normalized coordinates [xmin, ymin, xmax, ymax] (0-1000).",
        (_image_arg(), ArgSpec("reference_text", ArgType.TEXT, "Description of the object(s) to locate.")),
        OutputKind.BOXES,
        Backend.MODEL,
        requires=(_image_need(),),
    ),
    ToolSpec(
        "SAM",
        "Segment Anything Model. Generates a precise segmentation mask for an object within a bounding box.",
        (
            _image_arg(),
            ArgSpec(
                "bbox",
                ArgType.BBOX,
                "MUST be in [xmin, ymin, xmax, ymax] format with four integers (0-1000). "
                "Use Grounding first to get coordinates. Do NOT pass text descriptions.",
            ),
        ),
        OutputKind.MASK,
        Backend.MODEL,
        requires=(_image_need(), Need(OutputKind.BOXES, "bbox")),
    ),
    ToolSpec(
        "Extract",
        "Extracts an object from an image using a mask, returning a PNG with a transparent background.",
        (
            _image_arg("The source image ID."),
            ArgSpec(
                "mask",
                ArgType.ASSET,
                "MUST be a SAM output ID (e.g., 'SAM_0'). You MUST call SAM first to generate a mask "
                "before using Extract. Do NOT pass text descriptions or coordinates.",
                asset_kinds=(OutputKind.MASK,),
            ),
        ),
        OutputKind.RGBA,
        Backend.PURE,
        cost=0.5,
        extra_checks=("mask_matches_image",),
        requires=(_image_need(), Need(OutputKind.MASK, "mask")),
    ),
    ToolSpec(
        "Overlayer",
        "Composites an object or text onto a background image at a specified position.",
        (
            _image_arg("The background image ID (e.g., 'img_1', 'ImageEdit_0').", name="base_image"),
            ArgSpec(
                "overlay_type",
                ArgType.CHOICE,
                "Type of content to overlay. Use 'text' for adding text, use 'object' for compositing an extracted image.",
                choices=("text", "object"),
            ),
            ArgSpec(
                "content",
                ArgType.TEXT,
                "If overlay_type='text': the text string to render. If overlay_type='object': MUST be an "
                "image ID from a previous tool output (e.g., 'Extract_0').",
            ),
            ArgSpec(
                "position",
                ArgType.POSITION,
                "MUST be exactly [x, y] format with two integers in range 0-1000 (e.g., '[500, 500]' for "
                "center). Default: [500, 500].",
                required=False,
            ),
        ),
        OutputKind.IMAGE,
        Backend.PURE,
        cost=0.5,
        extra_checks=("overlay_content",),
        requires=(
            _image_need("base_image"),
            Need(OutputKind.RGBA, "content", when=("overlay_type", "object"), from_task=True),
            Need(OutputKind.TEXT, "content", when=("overlay_type", "text"), from_task=True),
        ),
    ),
    ToolSpec(
        "Crop",
        "Crops the image to a specific region defined by a bounding box.",
        (_image_arg("The source image ID (e.g., 'img_1')."), ArgSpec("bbox", ArgType.BBOX, _BBOX)),
        OutputKind.IMAGE,
        Backend.PURE,
        cost=0.5,
        # The box comes from Grounding, or the instruction states the region.
        requires=(_image_need(), Need(OutputKind.BOXES, "bbox", from_task=True)),
    ),
    ToolSpec(
        "OCR",
        "Optical Character Recognition. Detects and transcribes text within an image.",
        (_image_arg("The image ID containing text."),),
        OutputKind.TEXT,
        Backend.MODEL,
        requires=(_image_need(),),
    ),
    ToolSpec(
        "Rotate",
        "Rotates the image by a fixed angle to correct orientation.",
        (
            _image_arg(),
            ArgSpec(
                "angle",
                ArgType.CHOICE,
                "Clockwise rotation angle.",
                choices=(45, 90, 180),
                json_type="integer",
            ),
        ),
        OutputKind.IMAGE,
        Backend.PURE,
        cost=0.5,
        requires=(_image_need(),),
    ),
    ToolSpec(
        "Flip",
        "Performs a horizontal flip (mirroring) of the image.",
        (_image_arg(),),
        OutputKind.IMAGE,
        Backend.PURE,
        cost=0.5,
        requires=(_image_need(),),
    ),
    ToolSpec(
        "SR",
        "Super-Resolution. Enhances and upscales an image to 4x its original resolution.",
        (_image_arg("The image ID to enhance."),),
        OutputKind.IMAGE,
        Backend.MODEL,
        cost=2.0,
        output_scale=4,
        requires=(_image_need(),),
    ),
)

_EASEL_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "brush_stroke",
        # The path's units are the system prompt's to state ([0, 1], or EASEL-Data's 0-1000 with
        # coords: int1000, rescaled before the [0, 1] check), so this text holds for both.
        "Paints one quadratic Bezier brush stroke on the canvas: start (xs, ys), control (xc, yc) and end "
        "(xe, ye), in the coordinate convention the system prompt states (0,0 = top-left); radius and opacity "
        "at the start (rs, os) and end (re, oe), linearly interpolated along the stroke; and one RGB colour "
        "(cr, cg, cb). Radii, opacities and colours are numbers in [0, 1]; values outside their range are refused.",
        (
            _unit("xs", "Start x."),
            _unit("ys", "Start y."),
            _unit("xc", "Control point x."),
            _unit("yc", "Control point y."),
            _unit("xe", "End x."),
            _unit("ye", "End y."),
            _unit("rs", "Radius at the start."),
            _unit("os", "Opacity at the start."),
            _unit("re", "Radius at the end."),
            _unit("oe", "Opacity at the end."),
            _unit("cr", "Red."),
            _unit("cg", "Green."),
            _unit("cb", "Blue."),
        ),
        OutputKind.CANVAS,
        Backend.STATEFUL,
        family="easel",
    ),
    ToolSpec("undo", "Reverts the most recent brush stroke.", (), OutputKind.NONE, Backend.STATEFUL, family="easel"),
    ToolSpec("submit", "Submits the canvas as final.", (), OutputKind.NONE, Backend.STATEFUL, family="easel"),
)


REGISTRY: dict[str, ToolSpec] = {t.name: t for t in (*_CANVASAGENT_TOOLS, *_EASEL_TOOLS)}


# What an instruction can state as a value (a region to crop, a caption to draw), so a need of
# one of these kinds that the task may supply is always met.
INSTRUCTION_KINDS: frozenset[OutputKind] = frozenset({OutputKind.BOXES, OutputKind.TEXT})


class UnknownToolError(KeyError):
    pass


def get_tool(name: str) -> ToolSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownToolError(name) from None


def tools(family: str | None = "canvasagent") -> tuple[ToolSpec, ...]:
    """Tools of one family in declaration order (None means every tool)."""
    return tuple(t for t in REGISTRY.values() if family is None or t.family == family)


def tool_names(family: str | None = "canvasagent") -> tuple[str, ...]:
    return tuple(t.name for t in tools(family))


def openai_schemas(family: str | None = "canvasagent", names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    wanted = set(names) if names is not None else None
    return [t.openai_schema() for t in tools(family) if wanted is None or t.name in wanted]


def model_backed(family: str | None = "canvasagent") -> tuple[ToolSpec, ...]:
    return tuple(t for t in tools(family) if t.backend is Backend.MODEL)


def producers(kind: OutputKind, family: str | None = "canvasagent") -> tuple[str, ...]:
    """Tools whose successful call produces `kind`, in declaration order."""
    return tuple(t.name for t in tools(family) if kind in t.produces)


def unmet_needs(names: Iterable[str], supplied: Iterable[OutputKind]) -> list[tuple[int, Need]]:
    """The unconditional needs of a tool sequence that nothing meets, as (position, need).

    A need is met by an earlier tool's product, or, when the task may supply it, by a kind in
    `supplied` (what the task's inputs provide) or in `INSTRUCTION_KINDS`."""
    from_task = set(supplied) | INSTRUCTION_KINDS
    have: set[OutputKind] = set()
    out: list[tuple[int, Need]] = []
    for i, name in enumerate(names):
        spec = get_tool(name)
        out += [(i, n) for n in spec.needs() if n.kind not in have and not (n.from_task and n.kind in from_task)]
        have.update(spec.produces)
    return out
