"""Megatron-LM's pipeline layout strings (``--pipeline-model-parallel-layout``), read into
the blocks each model chunk holds.

A layout lists the model chunks in order, separated by ``|``: ``E`` the embedding, ``t`` a
transformer block, ``m`` a multi-token-prediction layer, ``L`` the loss (with the output
head); ``(...)*n`` repeats a group and ``x*n`` a letter, groups first; commas are only for
reading. DeepSeek-V3's on 8 x 4 chunks is ``Et|(tt|)*30mL``. gpusim puts the embedding on
the first chunk and the head, the loss and multi-token prediction on the last, so a layout
must too.
"""

from __future__ import annotations

import re

from gpusim.errors import InvalidConfig

_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_LETTER = re.compile(r"(.)\*(\d+)")


def expand_layout(layout: str) -> list[str]:
    """The layout's chunks, each a string of its letters, repeats unrolled."""
    text = layout.replace(",", "").replace(" ", "")
    text = _GROUP.sub(lambda g: g.group(1) * int(g.group(2)), text)
    text = _LETTER.sub(lambda g: g.group(1) * int(g.group(2)), text)
    return text.split("|")


def layout_blocks(layout: str) -> tuple[int, ...]:
    """Transformer blocks per model chunk of ``layout`` (``--pp-layers`` of it), checked."""
    chunks = expand_layout(layout)
    letters = "".join(chunks)
    unknown = sorted(set(letters) - set("EtmL"))
    if unknown:
        raise InvalidConfig(f"pipeline layout {layout!r} has {', '.join(unknown)}: its letters "
                            f"are E (embedding), t (a block), m (multi-token prediction) and L "
                            f"(the loss), '|' between chunks, '(...)*n' and 'x*n' to repeat")
    if letters.count("E") != 1 or not chunks[0].startswith("E"):
        raise InvalidConfig(f"pipeline layout {layout!r}: the embedding (E) opens the first "
                            f"chunk, once")
    if letters.count("L") != 1 or not chunks[-1].endswith("L"):
        raise InvalidConfig(f"pipeline layout {layout!r}: the loss (L) closes the last chunk, "
                            f"once")
    last = chunks[-1]
    if "m" in "".join(chunks[:-1]) or ("m" in last and "t" in last[last.index("m"):]):
        raise InvalidConfig(f"pipeline layout {layout!r}: multi-token prediction (m) runs on "
                            f"the last chunk, after its blocks")
    return tuple(chunk.count("t") for chunk in chunks)
