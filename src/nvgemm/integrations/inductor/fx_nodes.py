"""FX node helpers shared by the capture pass (:mod:`.capture`) and the requant rewrite (:mod:`.requant`)."""

from __future__ import annotations

from typing import Any

import torch.fx as fx


def node_val(n: Any):
    """The fake value in ``n.meta['val']``; None for a non-node."""
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def is_call(n: Any, *targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


__all__ = ["is_call", "node_val"]
