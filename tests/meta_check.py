"""Checking a metadata rule (minicompile/meta_rules.py) against eager on real tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from minicompile.graph import TensorMeta


def rule_and_eager(rule: Callable, args: tuple, kwargs: dict,
                   eager: Callable) -> tuple[Any, Any, tuple, dict]:
    """The rule's answer on the arguments' metadata (on the CPU), eager's result on the
    arguments (None where eager raises: the rule must not answer then), and the metadata
    arguments themselves."""

    def meta(v: Any) -> Any:
        return TensorMeta.of(v) if isinstance(v, torch.Tensor) else v

    metas, meta_kwargs = tuple(map(meta, args)), {k: meta(v) for k, v in kwargs.items()}
    fast = rule(metas, meta_kwargs, torch.device("cpu"))
    try:
        result = eager(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        assert fast is None, (args, kwargs)
        return None, None, metas, meta_kwargs
    return fast, result, metas, meta_kwargs
