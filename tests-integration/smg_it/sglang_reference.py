"""What ``sglang.Engine`` (in-process, no servicer) produces for the cases the engine tests
replay through the servicer. Run in a process of its own by :func:`smg_it.sglang.run_reference`
(``python -m smg_it.sglang_reference MODEL OUT.json [--embed | --images | --lora NAME=DIR ...]``),
in the SGLang environment. ``--lora``: greedy ids of :data:`LORA_PROMPT` for the base model and each
adapter, alone and all in one batch (SGLang's own LoRA path, ``lora_path`` by name). ``--images``
(a Gemma3 or Qwen2-VL model): greedy ids of :data:`IMAGE_CASES`, SGLang's own processor reading
the PNGs (``image_data``) and expanding the prompt's picture anchors (:data:`ANCHORS`)."""

from __future__ import annotations

import json
import sys
from typing import Any

from smg_servicer_sglang.testing import ENGINE_KWARGS, LORA_ENGINE_KWARGS

CASES = {
    "short": [1, 5, 9, 200, 31],
    "long": [(7 * k + 3) % 4000 + 10 for k in range(60)],
    "other": [42, 17, 99, 1024, 2048, 3000, 5, 6],
}
MAX_TOKENS = 12
TOP = 3
EMBED_CASES = {"a": [1, 5, 9, 200, 31], "b": [42, 17, 99, 1024]}
LORA_PROMPT = [1, 5, 9, 200, 31]
#: The cases' pictures: name -> ``media.png_image(56, 56, ...)`` arguments (:func:`picture`).
PICTURES: dict[str, dict[str, Any]] = {
    "noise": {"seed": 1},
    "white": {"color": (255, 255, 255)},
    "red": {"color": (200, 20, 20)},
}
#: name -> (prompt text, its pictures in order).
IMAGE_CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "one": ("What is in <start_of_image> this picture?", ("noise",)),
    "other": ("What is in <start_of_image> this picture?", ("white",)),
    "two": ("Compare <start_of_image> and <start_of_image> please.", ("noise", "red")),
}
IMAGE_ENGINE_KWARGS = {"enable_multimodal": True, "image_processor_backend": "pil"}
#: What one picture is in :data:`IMAGE_CASES`' prompts, by model family (``model_type``).
ANCHORS = {"gemma3": "<start_of_image>", "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>"}


def image_cases(family: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """:data:`IMAGE_CASES` with ``family``'s picture anchor in the prompts."""
    anchor = ANCHORS[family]
    return {
        name: (prompt.replace(ANCHORS["gemma3"], anchor), pictures)
        for name, (prompt, pictures) in IMAGE_CASES.items()
    }


def lora_outputs(engine: object, names: list[str]) -> dict[str, object]:
    """Greedy ids of :data:`LORA_PROMPT`: ``base`` and each adapter alone, and ``batch``: the
    base model and every adapter in one call (one batch)."""
    params = {"temperature": 0, "max_new_tokens": MAX_TOKENS}
    generate = engine.generate  # type: ignore[attr-defined]
    result: dict[str, object] = {"base": generate(input_ids=LORA_PROMPT, sampling_params=params)}
    for name in names:
        result[name] = generate(input_ids=LORA_PROMPT, sampling_params=params, lora_path=name)
    batch = generate(
        input_ids=[LORA_PROMPT] * (len(names) + 1),
        sampling_params=params,
        lora_path=[None, *names],
    )
    out: dict[str, object] = {key: value["output_ids"] for key, value in result.items()}  # type: ignore[index]
    out["batch"] = [item["output_ids"] for item in batch]
    return out


def embeddings(engine: object) -> dict[str, list[float]]:
    from sglang.srt.managers.io_struct import (  # pyright: ignore[reportMissingImports]
        EmbeddingReqInput,
    )

    result = {}
    for name, ids in EMBED_CASES.items():
        manager = engine.tokenizer_manager  # type: ignore[attr-defined]
        generator = manager.generate_request(EmbeddingReqInput(input_ids=ids), None)
        got = engine.loop.run_until_complete(generator.__anext__())  # type: ignore[attr-defined]
        result[name] = got["embedding"]
    return result


def picture(name: str) -> bytes:
    """The PNG of :data:`PICTURES` ``name``."""
    from smg_servicer_core.testing.media import png_image

    return png_image(56, 56, **PICTURES[name])


def image_outputs(engine: object, family: str) -> dict[str, list[int]]:
    """Greedy ids of each of :data:`IMAGE_CASES` (``family``'s anchors), the images as data
    URLs."""
    from smg_servicer_core.testing.media import data_url

    result = {}
    for name, (prompt, pictures) in image_cases(family).items():
        got = engine.generate(  # type: ignore[attr-defined]
            prompt=prompt,
            image_data=[data_url(picture(p)) for p in pictures],
            sampling_params={"temperature": 0, "max_new_tokens": MAX_TOKENS},
        )
        result[name] = got["output_ids"]
    return result


def main() -> None:
    import sglang  # pyright: ignore[reportMissingImports] - runs in the SGLang environment

    model, out = sys.argv[1], sys.argv[2]
    embed = "--embed" in sys.argv
    adapters = sys.argv[sys.argv.index("--lora") + 1 :] if "--lora" in sys.argv else []
    lora = LORA_ENGINE_KWARGS | {"lora_paths": adapters} if adapters else {}
    images = "--images" in sys.argv
    vision = IMAGE_ENGINE_KWARGS if images else {}
    engine = sglang.Engine(
        model_path=model, skip_server_warmup=True, is_embedding=embed, **ENGINE_KWARGS, **lora,
        **vision,
    )  # fmt: skip
    try:
        if images:
            with open(f"{model}/config.json") as fh:
                family = json.load(fh)["model_type"]
            with open(out, "w") as fh:
                json.dump(image_outputs(engine, family), fh)
            return
        if adapters:
            names = [pair.split("=", 1)[0] for pair in adapters]
            with open(out, "w") as fh:
                json.dump(lora_outputs(engine, names), fh)
            return
        if embed:
            with open(out, "w") as fh:
                json.dump(embeddings(engine), fh)
            return
        result = {}
        for name, ids in CASES.items():
            got = engine.generate(
                input_ids=ids,
                sampling_params={"temperature": 0, "max_new_tokens": MAX_TOKENS},
                return_logprob=True,
                top_logprobs_num=TOP,
            )
            meta = got["meta_info"]
            result[name] = {
                "ids": got["output_ids"],
                "logprobs": [lp for lp, _, _ in meta["output_token_logprobs"]],
                "top": [[[lp, tid] for lp, tid, _ in row] for row in meta["output_top_logprobs"]],
                "finish": meta["finish_reason"]["type"],
            }
        with open(out, "w") as fh:
            json.dump(result, fh)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
