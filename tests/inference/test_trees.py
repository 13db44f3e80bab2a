"""Golden buffers of small hand-checked trees, and the errors malformed tree specifications raise."""

from __future__ import annotations

import json

import pytest
import torch

from specheads.inference.trees import TreeError, TreeFamily, resolve_tree, tree_from_parents

# Sorted by (depth, path) the nodes are: 1 = [0], 2 = [1], 3 = [0, 0], 4 = [0, 1], 5 = [1, 0].
SMALL_TREE_SHUFFLED = [[1, 0], [0, 1], [1], [0, 0], [0]]


def test_small_tree_golden_buffers() -> None:
    tree = resolve_tree(SMALL_TREE_SHUFFLED)

    assert tree.num_nodes == 5
    assert tree.choices == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert tree.parents == (-1, 0, 0, 1, 1, 2)
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2]
    assert tree.max_depth == 2
    assert tree.children == ((1, 2), (3, 4), (5,), (), (), ())
    assert tree.ranks == (-1, 0, 1, 0, 1, 0)
    expected_mask = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert tree.attention_mask.dtype == torch.bool
    assert torch.equal(tree.attention_mask, expected_mask)
    assert tree.paths.tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]
    assert not tree.is_chain


def test_order_of_the_choice_list_does_not_matter() -> None:
    shuffled = resolve_tree(SMALL_TREE_SHUFFLED)
    ordered = resolve_tree([[0], [1], [0, 0], [0, 1], [1, 0]])
    assert shuffled.parents == ordered.parents
    assert torch.equal(shuffled.attention_mask, ordered.attention_mask)
    assert torch.equal(shuffled.paths, ordered.paths)


def test_paths_are_padded_with_minus_one() -> None:
    tree = resolve_tree([[0], [1], [0, 0]])  # nodes 1 = [0], 2 = [1], 3 = [0, 0]
    assert tree.paths.tolist() == [[0, 2, -1], [0, 1, 3]]


def test_chain_is_a_chain() -> None:
    tree = resolve_tree("chain-3")
    assert tree.is_chain
    assert tree.parents == (-1, 0, 1, 2)
    assert tree.choices == ((0,), (0, 0), (0, 0, 0))
    assert tree.depths.tolist() == [0, 1, 2, 3]
    assert torch.equal(tree.attention_mask, torch.ones(4, 4, dtype=torch.bool).tril())
    assert tree.paths.tolist() == [[0, 1, 2, 3]]
    assert tree.children == ((1,), (2,), (3,), ())


@pytest.mark.parametrize("choices", [[[0], [1]], [[0], [0, 0], [0, 1]], [[0], [0, 0], [1], [1, 0]]])
def test_branching_tree_is_not_a_chain(choices: list[list[int]]) -> None:
    assert not resolve_tree(choices).is_chain


def test_truncated_keeps_the_shallow_nodes() -> None:
    tree = resolve_tree(SMALL_TREE_SHUFFLED)
    shallow = tree.truncated(1)
    assert shallow.choices == ((0,), (1,))
    assert shallow.parents == (-1, 0, 0)
    assert shallow.max_depth == 1
    assert shallow.paths.tolist() == [[0, 1], [0, 2]]
    assert tree.truncated(2) is tree
    assert tree.truncated(5) is tree


def test_tree_from_parents() -> None:
    tree = tree_from_parents([-1, 0, 0, 1])
    assert tree.parents == (-1, 0, 0, 1)
    assert tree.depths.tolist() == [0, 1, 1, 2]
    assert tree.children == ((1, 2), (3,), (), ())
    assert tree.ranks == (-1, 0, 1, 0)
    assert tree.choices == ((0,), (1,), (0, 0))
    assert tree.paths.tolist() == [[0, 2, -1], [0, 1, 3]]
    expected_mask = torch.tensor(
        [
            [1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 0, 1, 0],
            [1, 1, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree.attention_mask, expected_mask)
    assert tree.truncated(1).parents == (-1, 0, 0)


@pytest.mark.parametrize("parents", [[], [0, 0], [-1, 1], [-1, 0, 3], [-1, -1]])
def test_tree_from_parents_rejects_bad_topologies(parents: list[int]) -> None:
    with pytest.raises(TreeError, match="parents"):
        tree_from_parents(parents)


def test_resolve_tree_reads_a_json_file(tmp_path) -> None:
    path = tmp_path / "my_tree.json"
    path.write_text(json.dumps({"choices": SMALL_TREE_SHUFFLED}))
    from_file = resolve_tree(str(path))
    from_path = resolve_tree(path)
    direct = resolve_tree(SMALL_TREE_SHUFFLED)
    for tree in (from_file, from_path):
        assert tree.parents == direct.parents
        assert torch.equal(tree.attention_mask, direct.attention_mask)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([[0], []], "non-empty"),
        ([[0], [-1]], "non-negative"),
        ([[0], [0.5]], "integers"),
        ([[0], ["1"]], "integers"),
        ([[0], [True]], "integers"),
        ([[0], [1], [0]], r"repeated paths: \[\[0\]\]"),
        ([[0], [1, 0]], r"no parent path \[1\]"),
        ([[0], 1], "non-empty list"),
        ({"choices": [[0]]}, "list of paths"),
        (5, "list of paths"),
        ("chain-0", "K >= 1"),
        ("no-such-tree-name", "unknown tree 'no-such-tree-name'"),
    ],
)
def test_malformed_trees_raise(spec: object, message: str) -> None:
    with pytest.raises(TreeError, match=message):
        resolve_tree(spec)


def test_an_unknown_tree_names_every_form_a_tree_takes(monkeypatch) -> None:
    """The refusal lists chains, files, the shipped trees, 'auto' and every kind a method's drafter grows, read from
    the tree families: a kind a method adds is listed with the method, none is left out."""
    from dataclasses import replace

    from specheads.inference.trees import available_trees, tree_families
    from specheads.registry import HEAD_TYPES

    with pytest.raises(TreeError) as error:
        resolve_tree("no-such-tree")
    message = str(error.value)
    grown = {kind for family in tree_families() for kind in family.kinds}
    assert grown >= {"dynamic", "ddtree"} and available_trees()
    for form in ["chain-K", "auto", "dynamic-K-D-N", "ddtree-N", *grown, *available_trees()]:
        assert f"'{form}'" in message, form
    monkeypatch.setitem(HEAD_TYPES, "medusa", replace(HEAD_TYPES["medusa"], trees=f"{__name__}:SPROUTS"))
    with pytest.raises(TreeError, match=r"'sprouted' / 'sprouted-N' \(\['medusa'\]\)"):
        resolve_tree("no-such-tree")


class _Sprouts(TreeFamily):
    kinds, sized_form = ("sprouted",), "sprouted-N"


SPROUTS = _Sprouts()  # a family a method's entry names (the test above lends it to Medusa's)


def test_json_file_without_choices_raises(tmp_path) -> None:
    path = tmp_path / "tree.json"
    path.write_text(json.dumps({"paths": [[0]]}))
    with pytest.raises(TreeError, match="'choices'"):
        resolve_tree(str(path))


def test_invalid_json_raises(tmp_path) -> None:
    path = tmp_path / "tree.json"
    path.write_text("{choices: [[0]]")
    with pytest.raises(TreeError, match="cannot read tree file"):
        resolve_tree(str(path))


def test_malformed_choices_in_a_json_file_raise(tmp_path) -> None:
    path = tmp_path / "tree.json"
    path.write_text(json.dumps({"choices": [[0, 0]]}))
    with pytest.raises(TreeError, match="no parent path"):
        resolve_tree(str(path))
