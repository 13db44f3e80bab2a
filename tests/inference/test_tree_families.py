"""A kind of grown tree defined here, in the tests, decodes through the engine with no engine edit: the engine reads
tree families (their names, size keywords, refusals) and never names a kind."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch
from helpers import OracleTreeDrafter, greedy_reference

from specheads import SpecDecoder
from specheads.heads import MedusaHeads
from specheads.inference.trees import (
    TreeError,
    TreeFamily,
    register_tree_family,
    resolve_tree,
    tree_from_parents,
    unregister_tree_family,
)
from specheads.methods.medusa.drafter import MedusaDrafter


@dataclass(frozen=True)
class Sprout:
    """A test-only grown tree: ``nodes`` drafted nodes in a binary heap's shape (node i's parent is (i - 1) // 2)."""

    nodes: int

    @property
    def num_nodes(self) -> int:
        return self.nodes


class Sprouts(TreeFamily):
    """The sprouts' family: ``tree="sprout"`` (the drafter's default size), ``"sprout-N"``, ``total_tokens=N``."""

    kinds = ("sprout",)
    sized_form = "sprout-N"
    description = "test sprouts"
    overrides = {"total_tokens": "nodes"}

    def parse(self, text: str) -> Sprout | None:
        match = re.fullmatch(r"sprout-(\d+)", text)
        return None if match is None else Sprout(int(match.group(1)))


SPROUTS = Sprouts()


class SproutDrafter(OracleTreeDrafter):
    """Grows sprouts whose correct branch carries the base's greedy continuation (the oracle's tokens); records the
    sprout of every step."""

    name = "sprout"

    def __init__(self, base, nodes: int = 3) -> None:  # noqa: ANN001
        super().__init__(base, tree=None)
        self.nodes = nodes
        self.seen: list[Sprout] = []

    def resolve(self, tree):  # noqa: ANN001, ANN201
        if isinstance(tree, Sprout):
            return tree
        if tree in SPROUTS.kinds:
            return Sprout(self.nodes)
        if isinstance(tree, str) and SPROUTS.parse(tree) is not None:
            return SPROUTS.parse(tree)
        return super().resolve(tree)

    def propose(self, state, request):  # noqa: ANN001, ANN201
        sprout = request.tree
        self.seen.append(sprout)
        self.tree = tree_from_parents([-1, *((node - 1) // 2 for node in range(1, sprout.nodes + 1))])
        return super().propose(state, request)


@pytest.fixture
def sprouts():
    yield register_tree_family(SPROUTS)
    unregister_tree_family(SPROUTS)


@pytest.mark.parametrize(
    ("options", "grown"),
    [
        (dict(tree="sprout"), Sprout(3)),  # the drafter's default size
        (dict(tree="sprout-6"), Sprout(6)),
        (dict(tree="sprout", total_tokens=5), Sprout(5)),  # the family maps total_tokens to its field
    ],
)
def test_a_tree_kind_defined_in_a_test_decodes_as_greedy(base, sprouts, options: dict, grown: Sprout) -> None:
    drafter = SproutDrafter(base)
    prompt = torch.randint(2, 96, (1, 6), generator=torch.Generator().manual_seed(4))
    out = SpecDecoder(base, drafter).generate(prompt, max_new_tokens=16, **options)
    assert torch.equal(out.sequences, greedy_reference(base, prompt, 16))
    assert drafter.seen and set(drafter.seen) == {grown}
    assert max(out.stats.accepted_lengths) > 1  # the grown trees were verified and accepted from


def test_a_registered_kind_is_refused_where_it_is_not_grown(base, sprouts) -> None:
    medusa = SpecDecoder(base, MedusaDrafter(MedusaHeads.from_base(base, num_heads=3)))
    prompt = torch.tensor([[5, 6, 7]])
    owners = r"tree='sprout' \(test sprouts\) is grown by drafters of its own"
    for tree in ("sprout", "sprout-4"):
        with pytest.raises(TreeError, match=owners):
            medusa.generate(prompt, max_new_tokens=4, tree=tree)
    with pytest.raises(ValueError, match=r"\(test sprouts\) takes only \['total_tokens'\], not \['depth'\]"):
        SpecDecoder(base, SproutDrafter(base)).generate(prompt, max_new_tokens=4, tree="sprout", depth=2)
    with pytest.raises(ValueError, match=r"pass tree='dynamic' .* or tree='sprout' \(total_tokens\)"):
        medusa.generate(prompt, max_new_tokens=4, tree="chain-2", total_tokens=3)
    with pytest.raises(TreeError, match=r"'sprout' / 'sprout-N'"):
        resolve_tree("no-such-tree")


def test_a_family_is_forgotten_when_unregistered_and_cannot_take_a_known_kind(sprouts) -> None:
    class Impostor(TreeFamily):
        kinds = ("dynamic",)

    with pytest.raises(TreeError, match="already names EAGLE-2 dynamic trees"):
        register_tree_family(Impostor())
    unregister_tree_family(SPROUTS)
    with pytest.raises(TreeError, match="unknown tree 'sprout'"):
        resolve_tree("sprout")
