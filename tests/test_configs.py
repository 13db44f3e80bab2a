"""Every config file shipped under configs/ loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from specheads.inference.trees import TREES_DIR, available_trees, resolve_tree

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_trees_dir_is_the_repository_configs() -> None:
    assert TREES_DIR == CONFIGS / "trees"
    assert available_trees()


@pytest.mark.parametrize("name", available_trees())
def test_every_shipped_tree_resolves(name: str) -> None:
    by_name = resolve_tree(name)
    by_path = resolve_tree(str(TREES_DIR / f"{name}.json"))
    assert by_name.num_nodes == by_path.num_nodes > 0
    assert by_name.choices == by_path.choices


YAMLS = sorted(CONFIGS.rglob("*.yaml")) + sorted(CONFIGS.rglob("*.yml"))


def test_there_are_recipes() -> None:
    assert YAMLS


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_recipe_loads_through_the_schema(path: Path) -> None:
    from specheads.training.config import load_config

    config = load_config(path)
    assert config.data.paths
    assert config.output.dir
