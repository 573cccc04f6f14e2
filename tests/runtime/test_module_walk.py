"""Module fingerprints taken in one walk (runtime/fingerprints.py ModuleWalk(inner=True)):
each inner module's digest is the one its own walk gives, or is left out."""

from __future__ import annotations

import pytest
import torch

from minicompile.runtime import entries, fingerprints
from minicompile.runtime.guards import GuardCheck, Guards


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(width, width, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(width)
        self.act = torch.nn.ReLU()
        self.scale = 0.5


def _models() -> list[torch.nn.Module]:
    shared = torch.nn.Linear(3, 3)
    tied = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    tied[1].weight = tied[0].weight  # a parameter two modules hold
    nested = torch.nn.Sequential(Block(4), torch.nn.Sequential(Block(4), Block(4)))
    looped = torch.nn.Sequential(torch.nn.Linear(2, 2))
    looped[0].owner = looped  # a module that refers back to its parent (not a child)
    return [nested, torch.nn.Sequential(shared, torch.nn.ReLU(), shared), tied,
            torch.nn.Sequential(nested, tied), looped]


@pytest.mark.parametrize("index,left_out", [(0, 0), (1, 0), (2, 1), (3, 1), (4, 1)])
def test_inner_digests_are_their_own_walks(index: int, left_out: int) -> None:
    model = _models()[index]
    walk = fingerprints.ModuleWalk(model, inner=True)
    assert walk.digest == fingerprints.module_digest(model)
    assert walk.digests[id(model)] == walk.digest
    for sub in model.modules():
        if id(sub) in walk.digests:
            assert walk.digests[id(sub)] == fingerprints.module_digest(sub), sub
    assert len(walk.digests) == len(set(map(id, model.modules()))) - left_out


def test_a_module_sharing_with_what_came_before_is_walked_alone() -> None:
    """The second Linear of a tied pair meets the weight the first held: its own walk
    hashes the weight whole, the model's walk says "seen"; its digest is not taken."""
    tied = _models()[2]
    walk = fingerprints.ModuleWalk(tied, inner=True)
    assert id(tied[0]) in walk.digests and id(tied[1]) not in walk.digests


def test_module_recipes_match_walking_each_module_alone() -> None:
    model = torch.nn.Sequential(Block(4), _models()[2])
    names = {"outer": model, "block": model[0], "tied_a": model[1][0], "tied_b": model[1][1]}
    where = {"outer": "L_self", "block": "L_self._modules['0']",
             "tied_a": "L_self._modules['1']._modules['0']",
             "tied_b": "L_self._modules['1']._modules['1']"}
    checks = [GuardCheck(w, "identity", f"{w} is {n}", w, names[n])
              for n, w in reversed(list(where.items()))]  # innermost first: order is free
    guards = Guards(["L_self"], checks, dict(names))
    recipes, objects = entries._module_recipes(names, guards)
    for name, module in names.items():
        assert recipes[name] == ["frame_module", where[name],
                                 fingerprints.module_digest(module)]
    assert Block in objects and torch.nn.Linear in objects
    with pytest.raises(fingerprints.NotStorable, match="not reached from the frame"):
        entries._module_recipes({**names, "stray": torch.nn.ReLU()}, guards)


def _helper(x):
    return [v for v in x]  # nested code: a comprehension's own code object on 3.11


def test_traced_code_must_be_covered_by_a_keyed_object() -> None:
    codes = frozenset(fingerprints.codes_of(_helper))
    with pytest.raises(fingerprints.NotStorable, match="inlined _helper.*which no recipe checks"):
        entries._check_codes_covered(codes, [Block, Block])
    entries._check_codes_covered(codes, [Block, _helper, Block])
    method = frozenset(fingerprints.codes_of(Block.__init__))
    entries._check_codes_covered(method, [torch.nn.ReLU, Block])  # through its class
    with pytest.raises(fingerprints.NotStorable):
        entries._check_codes_covered(method | codes, [Block])
    versioned = frozenset([torch.nn.Linear.forward.__code__])  # keyed by torch's version
    entries._check_codes_covered(versioned, [])


def _classes() -> list[type]:
    """Classes whose digests meet one another: a method that closes over its own class (as
    a decorator's ``__init__`` does), a subclass, and a function closing over both."""

    def decorate(cls: type) -> type:
        def __init__(self) -> None:
            self.made_by = cls

        cls.__init__ = __init__
        return cls

    @decorate
    class Base:
        def value(self) -> int:
            return 1

    class Child(Base):
        def other(self) -> int:
            return 2

    def uses() -> tuple:
        return Base, Child

    return [Base, Child, uses]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_remembered_digests_are_the_digests(order: tuple[int, ...]) -> None:
    """Digests remembered while an entry is read (fingerprints.remembering) are the ones
    each object has alone, whatever the order they are asked in."""
    objects = _classes()
    alone = [fingerprints.object_digest(o) for o in objects]
    with fingerprints.remembering():
        for i in order:
            assert fingerprints.object_digest(objects[i]) == alone[i], i
        for i in order:  # (again: from the memo)
            assert fingerprints.object_digest(objects[i]) == alone[i], i
