"""What a preprocessed multimodal item looks like for the served model, learnt at start from vLLM's
own processor (imports vLLM and torch, as :mod:`._mm_engine` does, whose tensor path checks each
router-sent item against it).

:func:`item_layouts` runs the processor on dummy items per modality (images: the largest size, a
smaller one, a wide strip and a tall one, so a model that tiles a picture by its aspect ratio
shows its tile count varying; videos: the longest clip, one of one frame and one of three; audio:
the longest and two short ones) and records which tensors an item has, their kind and shape (a
size that differs between them is left free), and how many embeddings the encoder makes of it:
exact when all agree, else a fixed number per row of the primary tensor (a video's: per frame),
else the count vLLM's processor gives for the item's own tensors where it gave every sample's
(an audio clip's, from its feature mask), else unknown (the per-item maximum then bounds it).
:meth:`ItemLayout.check` refuses an item that does not fit with INVALID_ARGUMENT naming the
field, always in the same order (the primary tensor first).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from vllm.multimodal import MULTIMODAL_REGISTRY

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_vllm import releases

logger = logging.getLogger(__name__)


def _kind(tensor: torch.Tensor) -> str:
    return "floating" if tensor.is_floating_point() else "integer"


@dataclass(frozen=True)
class FieldLayout:
    """One tensor of an item: floating or integer (bool counts as integer), and its shape, a
    None where vLLM's processor varies the size."""

    kind: str
    shape: tuple[int | None, ...]

    def show(self) -> str:
        return "[" + ", ".join("*" if d is None else str(d) for d in self.shape) + "]"


@dataclass(frozen=True)
class ItemLayout:
    """What vLLM's own processor gives one item of a modality for this model (learnt at start
    from items of different sizes, :func:`item_layouts`): its tensors, each one's kind and
    shape, and how many embeddings the encoder makes of it — ``embeds`` when all items agree
    (a fixed-size item), else ``embeds_per_row`` times the rows of ``rows_key`` when all agree
    on that ratio, else what ``count`` (vLLM's processor, :class:`_ProcessorCount`) says of the
    item where it told every sample right, else not known (the ``max_embeds`` bound alone
    applies)."""

    fields: Mapping[str, FieldLayout]
    embeds: int | None = None
    rows_key: str = ""
    embeds_per_row: Fraction | None = None
    count: Callable[[Any, str], int] | None = None

    def check(self, item: Any, where: str) -> int | None:
        """INVALID_ARGUMENT unless ``item`` has this layout; the embeddings it makes (None:
        not known)."""
        names = set(item)
        missing, unknown = sorted(set(self.fields) - names), sorted(names - set(self.fields))
        if missing or unknown:
            raise InvalidRequest(
                f"{where}: tensors {sorted(names)}; this model takes {sorted(self.fields)}"
            )
        for name, want in self.fields.items():
            data = item[name].data
            if not isinstance(data, torch.Tensor):
                continue
            if _kind(data) != want.kind:
                raise InvalidRequest(
                    f"{where}: {name} is {str(data.dtype).removeprefix('torch.')}; this model "
                    f"takes {'an' if want.kind == 'integer' else 'a'} {want.kind} tensor"
                )
            shape = tuple(int(d) for d in data.shape)
            if len(shape) != len(want.shape) or any(
                w is not None and w != g for w, g in zip(want.shape, shape, strict=True)
            ):
                raise InvalidRequest(
                    f"{where}: {name} has shape {list(shape)}; this model takes {want.show()}"
                )
        return self.embeds_of(item, where)

    def embeds_of(self, item: Any, where: str = "") -> int | None:
        if self.embeds is not None:
            return self.embeds
        if self.embeds_per_row is None:
            return None if self.count is None else self.count(item, where)
        data = item[self.rows_key].data
        count = self.embeds_per_row * int(data.shape[0])
        return int(count) if count.denominator == 1 else None


class _ProcessorCount:
    """An item's embeddings as vLLM's processor counts them when it expands a prompt
    (``_get_prompt_updates`` over the item's own tensors: Qwen2-Audio reads its feature mask).
    Processors that count from the raw media instead cannot count a tensor item: their layouts
    take none (:func:`_counted`)."""

    def __init__(self, processor: Any, modality: str) -> None:
        self.processor = processor
        self.modality = modality

    def __call__(self, item: Any, where: str) -> int:
        from vllm.multimodal.inputs import MultiModalKwargsItems  # noqa: PLC0415 - vLLM
        from vllm.multimodal.parse import MultiModalDataItems  # noqa: PLC0415 - vLLM

        items = MultiModalKwargsItems({self.modality: [item]})
        try:
            updates = self.processor._get_prompt_updates(MultiModalDataItems(), {}, items)
            (update,) = [u for u in updates if u.modality == self.modality]
            content = update.resolve(0).content
            details, count = content.is_embed, len(content.full)
        except Exception as exc:
            raise InvalidRequest(
                f"{where}: vLLM's processor makes no embeddings of this item's tensors"
            ) from exc
        if details is not None or count <= 0:
            raise InvalidRequest(f"{where}: the item's embeddings cannot be counted")
        return count


def _counted(processor: Any, modality: str, samples: Sequence[tuple[Any, int]]) -> Any:
    """:class:`_ProcessorCount` for ``modality`` if it counts every sample as the processor
    made it, else None."""
    count = _ProcessorCount(processor, modality)
    for item, embeds in samples:
        try:
            if count(item, "") != embeds:
                return None
        except InvalidRequest:
            return None
    return count


def _layout_of(samples: Sequence[tuple[Any, int]], rows_key: str) -> ItemLayout | None:
    """The layout that every sample (an item and its embeddings) fits, or None when they do not
    even agree on their tensors."""
    first = samples[0][0]
    if any(set(item) != set(first) for item, _ in samples):
        return None
    fields: dict[str, FieldLayout] = {}
    # Checked in this order, so a request with several faults is told the same one every time:
    # the primary tensor first (a wrong tile size is reported on the pixels, not on their mask).
    for name in sorted(first, key=lambda n: (n != rows_key, n)):
        datas = [item[name].data for item, _ in samples]
        if not all(isinstance(d, torch.Tensor) for d in datas):
            continue
        shapes = [tuple(int(n) for n in d.shape) for d in datas]
        kinds = {_kind(d) for d in datas}
        if len({len(s) for s in shapes}) != 1 or len(kinds) != 1:
            return None
        dims = tuple(dim[0] if len(set(dim)) == 1 else None for dim in zip(*shapes, strict=True))
        fields[name] = FieldLayout(kinds.pop(), dims)
    counts = {embeds for _, embeds in samples}
    if len(counts) == 1:
        return ItemLayout(fields, embeds=counts.pop())
    ratios: set[Fraction] = set()
    for item, embeds in samples:
        data = item[rows_key].data if rows_key in item else None
        rows = int(data.shape[0]) if isinstance(data, torch.Tensor) and data.dim() else 0
        ratios.add(Fraction(embeds, rows) if rows else Fraction(-1))
    if len(ratios) == 1 and Fraction(-1) not in ratios:
        return ItemLayout(fields, rows_key=rows_key, embeds_per_row=ratios.pop())
    return ItemLayout(fields)  # the tensors are known, the count is not: the bound alone


def _samples(processor: Any, modality: str) -> list[tuple[Any, int]]:
    """Items of ``modality`` as vLLM's processor makes them: (item, embeddings). The largest;
    images also at a third of that, as a wide strip and as a tall one (two pictures of one
    aspect ratio are not enough: Idefics3 with image splitting cuts both into the same tiles);
    videos also of one and of three frames, audio also of 8,000 and 16,000 samples, so that a
    clip shorter than the largest is not refused and its embeddings are counted."""
    options: list[Any] = [None]
    if modality == "image":
        from vllm.config.multimodal import ImageDummyOptions  # noqa: PLC0415 - vLLM, at start

        seq_len = int(processor.info.ctx.model_config.max_model_len)
        largest: Any = processor.dummy_inputs.get_dummy_mm_data(seq_len, {"image": 1}, {})
        image: Any = largest["image"][0] if isinstance(largest["image"], list) else largest["image"]
        width, height = int(image.size[0]), int(image.size[1])
        for w, h in ((width // 3, height // 4), (width, height // 8), (width // 8, height)):
            options.append(ImageDummyOptions(count=1, width=max(w, 1), height=max(h, 1)))
    elif modality == "video":
        from vllm.config.multimodal import VideoDummyOptions  # noqa: PLC0415 - vLLM, at start

        options += [
            VideoDummyOptions(count=1, num_frames=n, width=None, height=None) for n in (1, 3)
        ]
    elif modality == "audio":
        from vllm.config.multimodal import AudioDummyOptions  # noqa: PLC0415 - vLLM, at start

        options += [AudioDummyOptions(count=1, length=n) for n in (8000, 16000)]
    return [sample(processor, modality, option) for option in options]


def sample(processor: Any, modality: str, option: Any = None) -> tuple[Any, int]:
    """One dummy item of ``modality`` through vLLM's processor, the largest it makes or the one
    ``option`` (vLLM's dummy options of that modality) describes: (item, embeddings)."""
    from vllm.multimodal.processing.context import TimingContext  # noqa: PLC0415 - vLLM, at start

    seq_len = int(processor.info.ctx.model_config.max_model_len)
    options = {} if option is None else {modality: option}
    inputs = releases.dummy_inputs(processor)(seq_len, {modality: 1}, options)
    out = processor.apply(inputs, timing_ctx=TimingContext(enabled=False))
    return out["mm_kwargs"][modality][0], int(out["mm_placeholders"][modality][0].get_num_embeds())


def item_layouts(engine: Any, limits: Mapping[str, int]) -> dict[str, ItemLayout]:
    """The item layout of each modality the model takes, from vLLM's own processor. A modality
    whose items cannot be made here (no dummy builder for it, a processor that needs more than
    a config) has none: its items are checked by the ``max_embeds`` bound alone."""
    mc = engine.model_config
    if not limits or not releases.supports_multimodal_inputs(mc, MULTIMODAL_REGISTRY):
        return {}
    layouts: dict[str, ItemLayout] = {}
    try:
        processor = MULTIMODAL_REGISTRY.create_processor(mc)
    except Exception:
        logger.info("no multimodal processor to learn item layouts from")
        return {}
    rows_key = {"image": "pixel_values", "video": "pixel_values_videos"}
    for modality in limits:
        try:
            samples = _samples(processor, modality)
        except Exception as exc:
            logger.info("no %s item layout learnt (%s)", modality, type(exc).__name__)
            continue
        layout = _layout_of(samples, rows_key.get(modality, ""))
        if layout is not None and layout.embeds is None and layout.embeds_per_row is None:
            layout = dataclasses.replace(layout, count=_counted(processor, modality, samples))
        if layout is not None:
            layouts[modality] = layout
            logger.info(
                "%s items: tensors %s, %s embeddings each",
                modality,
                {n: f.show() for n, f in layout.fields.items()},
                layout.embeds
                if layout.embeds is not None
                else (
                    f"{layout.embeds_per_row} per {layout.rows_key} row"
                    if layout.embeds_per_row is not None
                    else "vLLM's processor's count of"
                    if layout.count is not None
                    else "an unknown number of"
                ),
            )
    return layouts
